/* libfirehose_preload.so: the one query the shim exports besides the interposed functions.
 * Look it up with dlsym(RTLD_DEFAULT, "fh_preload_stats"): NULL means the shim is not loaded. */
#ifndef FIREHOSE_PRELOAD_H
#define FIREHOSE_PRELOAD_H

#include <stddef.h>
#include <stdint.h>

#define FH_PRELOAD_ACTIVE 1u       /* flags: the shim caches (FH_DISABLE is not set) */
#define FH_PRELOAD_INVALIDATION 2u /* flags: memory events reach the caches */

/* Append-only; struct_size says how much the shim filled in. */
struct fh_preload_stats {
    uint32_t struct_size;
    uint32_t flags;
    uint64_t app_reg_calls;     /* outermost ibv_reg_mr* calls (a nested call counts once) */
    uint64_t nested_calls;      /* calls made while already inside a hook (libibverbs -> itself) */
    uint64_t passthrough_reg;   /* registrations handed to libibverbs uncached */
    uint64_t passthrough_dereg; /* ibv_dereg_mr/ibv_rereg_mr of MRs the shim did not create */
    uint64_t wrappers_live;     /* wrapper MRs handed out and not deregistered */
    uint64_t hits, misses, evictions, invalidations; /* summed over protection domains */
    uint64_t pinned_bytes, pinned_peak;              /* what the caches keep registered */
    uint64_t real_regs, real_reg_ns;                 /* real ibv_reg_mr calls by the caches */
    uint64_t real_deregs, real_dereg_ns;             /* real ibv_dereg_mr calls by the caches */
    uint64_t caches; /* live caches: one per protection domain and remote-rights class */
    uint64_t hit_bytes;                              /* bytes of registrations served by hits */
    uint64_t saved_ns; /* estimate: each hit priced by a t = a + b*bytes fit over sampled
                          re-registrations of resident pages (FH_STATS_SAMPLE; 0 without samples) */
    uint64_t stale_deregs; /* ibv_dereg_mr/ibv_rereg_mr of a wrapper already deregistered: EINVAL */
    uint64_t resident_samples; /* sampled re-registrations behind saved_ns */
    uint64_t saved_upper_ns;   /* upper bound: hits priced by a fit over the misses (first touch) */
    uint64_t bypassed_reg;     /* passed straight through by FH_BYPASS=auto (in passthrough_reg) */
};

/* Copies up to `size` bytes of a snapshot into *out. 0, or -1 if out is NULL or size < 8. */
int fh_preload_stats(struct fh_preload_stats *out, size_t size);

#endif
