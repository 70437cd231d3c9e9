/* Prints the sizes, offsets and constants of the PMIx types that firehose declares by hand
 * (src/net/bootstrap/pmix/abi.rs), one "name value" per line, from the real pmix.h.
 * The Rust test `layouts_match_the_pmix_header` compiles and runs this and compares. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <pmix.h>

#define SIZE(t) printf("sizeof(%s) %zu\n", #t, sizeof(t))
#define ALIGN(t) printf("alignof(%s) %zu\n", #t, _Alignof(t))
#define OFF(t, f) printf("offsetof(%s,%s) %zu\n", #t, #f, offsetof(t, f))
#define CONST(c) printf("%s %zu\n", #c, (size_t)(c))

int main(void)
{
    SIZE(pmix_proc_t);
    ALIGN(pmix_proc_t);
    OFF(pmix_proc_t, nspace);
    OFF(pmix_proc_t, rank);
    SIZE(pmix_byte_object_t);
    OFF(pmix_byte_object_t, bytes);
    OFF(pmix_byte_object_t, size);
    SIZE(pmix_value_t);
    ALIGN(pmix_value_t);
    OFF(pmix_value_t, type);
    OFF(pmix_value_t, data);
    SIZE(pmix_info_t);
    ALIGN(pmix_info_t);
    OFF(pmix_info_t, key);
    OFF(pmix_info_t, flags);
    OFF(pmix_info_t, value);
    printf("PMIX_MAX_NSLEN+1 %zu\n", (size_t)(PMIX_MAX_NSLEN + 1));
    printf("PMIX_MAX_KEYLEN+1 %zu\n", (size_t)(PMIX_MAX_KEYLEN + 1));
    printf("PMIX_RANK_WILDCARD %zu\n", (size_t)(pmix_rank_t)(PMIX_RANK_WILDCARD));
    CONST(PMIX_SUCCESS);
    CONST(PMIX_BOOL);
    CONST(PMIX_UINT32);
    CONST(PMIX_BYTE_OBJECT);
    CONST(PMIX_GLOBAL);
    SIZE(pmix_data_type_t);
    SIZE(pmix_scope_t);
    SIZE(pmix_status_t);
    SIZE(pmix_info_directives_t);
    printf("strlen(PMIX_JOB_SIZE) %zu\n", strlen(PMIX_JOB_SIZE));
    printf("strlen(PMIX_COLLECT_DATA) %zu\n", strlen(PMIX_COLLECT_DATA));
    /* The key strings Rust passes (given on the command line) must be the header's. */
    printf("PMIX_JOB_SIZE_matches %d\n", strcmp(PMIX_JOB_SIZE, FH_KEY_JOB_SIZE) == 0);
    printf("PMIX_COLLECT_DATA_matches %d\n", strcmp(PMIX_COLLECT_DATA, FH_KEY_COLLECT_DATA) == 0);
    return 0;
}
