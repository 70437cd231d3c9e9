/*
 * Thin adapter over libfabric's MR cache: fi_mr_reg / fi_close on a verbs domain, whose provider
 * serves repeated registrations of the same range from its registration cache (monitor chosen by
 * FI_MR_CACHE_MONITOR, size by FI_MR_CACHE_MAX_COUNT). Only usable where a verbs device exists
 * (the Soft-RoCE VM); elsewhere fhb_ofi_open fails and the bench skips these rows.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

typedef struct {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
} fhb_ofi_t;

/* Access asked for: local + remote read/write, like the other two caches. */
#define FHB_OFI_ACCESS (FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE)

void fhb_ofi_close(void *h)
{
    fhb_ofi_t *o = h;
    if (o == NULL) {
        return;
    }
    if (o->domain != NULL) {
        fi_close(&o->domain->fid);
    }
    if (o->fabric != NULL) {
        fi_close(&o->fabric->fid);
    }
    if (o->info != NULL) {
        fi_freeinfo(o->info);
    }
    free(o);
}

/* Open a domain of provider `prov` (e.g. "verbs"); 0 or a negative fi_errno. */
int fhb_ofi_open(const char *prov, void **out)
{
    struct fi_info *hints = fi_allocinfo();
    fhb_ofi_t *o = calloc(1, sizeof(*o));
    int ret;

    *out = NULL;
    if (hints == NULL || o == NULL) {
        fi_freeinfo(hints);
        free(o);
        return -FI_ENOMEM;
    }
    hints->fabric_attr->prov_name = strdup(prov);
    hints->ep_attr->type = FI_EP_MSG;
    hints->caps = FI_MSG | FI_RMA;
    hints->mode = ~0ULL;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    ret = fi_getinfo(FI_VERSION(1, 9), NULL, NULL, 0, hints, &o->info);
    fi_freeinfo(hints);
    if (ret == 0) {
        ret = fi_fabric(o->info->fabric_attr, &o->fabric, NULL);
    }
    if (ret == 0) {
        ret = fi_domain(o->fabric, o->info, &o->domain, NULL);
    }
    if (ret != 0) {
        fhb_ofi_close(o);
        return ret;
    }
    *out = o;
    return 0;
}

/* Register (or find in the provider's cache); the struct fid_mr * or NULL. */
void *fhb_ofi_get(void *h, uintptr_t addr, size_t len)
{
    fhb_ofi_t *o = h;
    struct fid_mr *mr = NULL;
    if (fi_mr_reg(o->domain, (const void *)addr, len, FHB_OFI_ACCESS, 0, 0, 0, &mr, NULL) != 0) {
        return NULL;
    }
    return mr;
}

void fhb_ofi_put(void *h, void *mr)
{
    (void)h;
    fi_close(&((struct fid_mr *)mr)->fid);
}
