/* Prints the layout of fh_bootstrap_ops as include/firehose.h declares it, one "name value" per
 * line; the Rust test `layout_matches_the_checked_in_header` compares it with the Rust struct.
 * It also assigns real C functions of the documented signatures, so a wrong callback type in the
 * header fails to compile (-Werror). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "firehose.h"

static int my_allgather(void *ctx, const void *send, size_t len, void *recv)
{
    (void)ctx;
    memcpy(recv, send, len);
    return 0;
}

static int my_barrier(void *ctx)
{
    (void)ctx;
    return 0;
}

#define OFF(f) printf("offsetof(fh_bootstrap_ops,%s) %zu\n", #f, offsetof(fh_bootstrap_ops, f))

int main(void)
{
    fh_bootstrap_ops ops = {.rank = 0, .size = 1, .ctx = NULL,
                            .allgather = my_allgather, .barrier = my_barrier};
    char in = 'x', out = 0;
    printf("sizeof(fh_bootstrap_ops) %zu\n", sizeof(fh_bootstrap_ops));
    printf("alignof(fh_bootstrap_ops) %zu\n", _Alignof(fh_bootstrap_ops));
    OFF(rank);
    OFF(size);
    OFF(ctx);
    OFF(allgather);
    OFF(barrier);
    printf("callbacks_assignable %d\n",
           ops.allgather(ops.ctx, &in, 1, &out) == 0 && out == 'x' && ops.barrier(ops.ctx) == 0);
    return 0;
}
