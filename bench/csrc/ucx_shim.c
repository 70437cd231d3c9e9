/*
 * Thin adapter over UCX's standalone registration cache (libucs, ucs_rcache_*).
 *
 * Compiled against the installed <ucs/memory/rcache.h>, so the params struct layout is whatever
 * the real UCX release on this host says, never a hand-copied guess. The pin/unpin work is
 * delegated back to Rust (the same firehose `Pinner` backend our cache uses), so both caches sit
 * on exactly the same backend and only the cache overhead differs.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ucm/api/ucm.h>
#include <ucs/memory/rcache.h>

/* Implemented in Rust (bench/src/ucx.rs): pin/unpin through the chosen backend. */
extern int fhb_backend_pin(void *ctx, uintptr_t addr, size_t len, uintptr_t *token,
                           uint32_t *lkey, uint32_t *rkey);
extern void fhb_backend_unpin(void *ctx, uintptr_t addr, size_t len, uintptr_t token,
                              uint32_t lkey, uint32_t rkey);

/* A UCX region plus what a backend returns for it (same payload as firehose's `Pinned`). */
typedef struct {
    ucs_rcache_region_t super;
    uintptr_t token;
    uint32_t lkey;
    uint32_t rkey;
} fhb_region_t;

static ucs_status_t fhb_mem_reg(void *context, ucs_rcache_t *rcache, void *arg,
                                ucs_rcache_region_t *r, uint16_t flags)
{
    fhb_region_t *region = (fhb_region_t *)r;
    size_t len = r->super.end - r->super.start;
    (void)rcache; (void)arg; (void)flags;
    if (fhb_backend_pin(context, r->super.start, len, &region->token, &region->lkey,
                        &region->rkey) != 0) {
        return UCS_ERR_IO_ERROR;
    }
    return UCS_OK;
}

static void fhb_mem_dereg(void *context, ucs_rcache_t *rcache, ucs_rcache_region_t *r)
{
    fhb_region_t *region = (fhb_region_t *)r;
    (void)rcache;
    fhb_backend_unpin(context, r->super.start, r->super.end - r->super.start, region->token,
                      region->lkey, region->rkey);
}

static void fhb_dump_region(void *context, ucs_rcache_t *rcache, ucs_rcache_region_t *r,
                            char *buf, size_t max)
{
    (void)context; (void)rcache; (void)r;
    if (max > 0) {
        buf[0] = '\0';
    }
}

static const ucs_rcache_ops_t fhb_ops = {
    .mem_reg = fhb_mem_reg,
    .mem_dereg = fhb_mem_dereg,
    .dump_region = fhb_dump_region,
};

/*
 * Create a cache. `max_regions`/`max_size` of 0 mean "unbounded" (UCX's own default).
 * `with_events` subscribes to UCM unmap events like UCX's IB transport does, so UCX pays its
 * real invalidation bookkeeping; returns the UCX status code (0 = UCS_OK).
 */
int fhb_ucx_create(void *ctx, unsigned long max_regions, size_t max_size, int with_events,
                   void **out)
{
    ucs_rcache_params_t params;
    ucs_rcache_t *rcache = NULL;
    ucs_status_t status;
    size_t page;

    memset(&params, 0, sizeof(params));
    params.region_struct_size = sizeof(fhb_region_t);
    /* Page alignment: our backends (mlock, ibv_reg_mr) take page-aligned ranges, as UCX's IB
     * transport does; the bench only ever passes page-aligned ranges anyway. */
    page = (size_t)sysconf(_SC_PAGESIZE);
    params.alignment = page;
    params.max_alignment = page;
    params.ucm_events = with_events ? UCM_EVENT_VM_UNMAPPED : 0;
    params.ucm_event_priority = 1000;
    params.ops = &fhb_ops;
    params.context = ctx;
    params.flags = 0;
    params.max_regions = max_regions ? max_regions : (unsigned long)-1;
    params.max_size = max_size ? max_size : (size_t)-1;
    params.max_unreleased = (size_t)-1;

    status = ucs_rcache_create(&params, "firehose-bench", NULL, &rcache);
    *out = rcache;
    return (int)status;
}

void fhb_ucx_destroy(void *rcache)
{
    ucs_rcache_destroy((ucs_rcache_t *)rcache);
}

/* Resolve-or-register; returns the region (the "handle") or NULL on failure. */
void *fhb_ucx_get(void *rcache, uintptr_t addr, size_t len)
{
    ucs_rcache_region_t *region = NULL;
    if (ucs_rcache_get((ucs_rcache_t *)rcache, (void *)addr, len, PROT_READ | PROT_WRITE, NULL,
                       &region) != UCS_OK) {
        return NULL;
    }
    return region;
}

void fhb_ucx_put(void *rcache, void *region)
{
    ucs_rcache_region_put((ucs_rcache_t *)rcache, (ucs_rcache_region_t *)region);
}

/* The per-region struct UCX allocates for us (its own part plus our payload). */
size_t fhb_ucx_region_struct_size(void)
{
    return sizeof(fhb_region_t);
}

size_t fhb_ucx_base_region_size(void)
{
    return sizeof(ucs_rcache_region_t);
}

static void fhb_invalidate_done(void *arg)
{
    (void)arg;
}

/* Mark a held region invalid: it is unregistered when its last reference is put. */
void fhb_ucx_invalidate(void *rcache, void *region)
{
    ucs_rcache_region_invalidate((ucs_rcache_t *)rcache, (ucs_rcache_region_t *)region,
                                 fhb_invalidate_done, NULL);
}
