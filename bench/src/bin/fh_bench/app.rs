//! Table 3: one application over puts. A bitonic sort of a distributed array of u64 keys, one
//! block per rank (the rank count a power of two): each rank sorts its block, then for every
//! step of the bitonic network the partners exchange whole blocks by puts (`--app-chunk` bytes
//! each, `--window` in flight) into each other's receive buffer, and each keeps the lower or
//! upper half of the merge (compare-split). Run once per transport on the same keys; rank 0
//! verifies the result (every block sorted, blocks in rank order, the keys' sum and xor kept)
//! and counts Firehose's one-sided puts, misses and moves summed over the ranks.

use std::time::Instant;

use crate::args::Args;
use crate::report::{AppRow, Report};
use crate::served::{self, u64_at, Exposed, TargetStats, VERIFY};
use crate::sweep::Rng;
use crate::transport::{Firehose, Floor, Rendezvous, Transport};
use crate::{fail, Ctx};

/// Merges the sorted `own` and `other` and keeps the lower (`low`) or upper half in `own`.
pub fn compare_split(own: &mut [u64], other: &[u64], low: bool, scratch: &mut Vec<u64>) {
    let n = own.len();
    scratch.clear();
    if low {
        let (mut i, mut j) = (0, 0);
        while scratch.len() < n {
            if j >= other.len() || (i < n && own[i] <= other[j]) {
                scratch.push(own[i]);
                i += 1;
            } else {
                scratch.push(other[j]);
                j += 1;
            }
        }
    } else {
        let (mut i, mut j) = (n, other.len());
        while scratch.len() < n {
            if j == 0 || (i > 0 && own[i - 1] > other[j - 1]) {
                i -= 1;
                scratch.push(own[i]);
            } else {
                j -= 1;
                scratch.push(other[j]);
            }
        }
        scratch.reverse();
    }
    own.copy_from_slice(scratch);
}

/// The verification record of one rank: sorted, min, max, sum and xor after, sum and xor before.
fn record(keys: &[u64], pre: (u64, u64)) -> Vec<u8> {
    let sorted = keys.windows(2).all(|w| w[0] <= w[1]);
    let (sum, xor) = sum_xor(keys);
    let mut v = vec![sorted as u8];
    for x in [keys[0], keys[keys.len() - 1], sum, xor, pre.0, pre.1] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

fn sum_xor(keys: &[u64]) -> (u64, u64) {
    keys.iter()
        .fold((0u64, 0u64), |(s, x), &k| (s.wrapping_add(k), x ^ k))
}

/// Rank 0: every rank's record checked together.
fn verify(ctx: &Ctx) -> bool {
    let am = ctx.peers.am();
    let mut prev_max = 0u64;
    let (mut s0, mut x0, mut s1, mut x1) = (0u64, 0u64, 0u64, 0u64);
    for r in 0..ctx.peers.size() {
        let b = am
            .call(r, VERIFY, &[])
            .unwrap_or_else(|e| fail(format!("VERIFY from rank {r}: {e:?}")));
        if b.len() != 49 {
            fail(format!("VERIFY from rank {r}: {} bytes", b.len()));
        }
        let v = |i: usize| u64_at(&b, 1 + i * 8);
        if b[0] != 1 || (r > 0 && v(0) < prev_max) {
            eprintln!(
                "fh_bench: app: rank {r}: sorted {} min {} previous max {prev_max}",
                b[0],
                v(0)
            );
            return false;
        }
        prev_max = v(1);
        s1 = s1.wrapping_add(v(2));
        x1 ^= v(3);
        s0 = s0.wrapping_add(v(4));
        x0 ^= v(5);
    }
    (s0, x0) == (s1, x1)
}

fn all_stats(ctx: &Ctx) -> Vec<TargetStats> {
    (0..ctx.peers.size())
        .map(|r| served::stats(ctx.peers.am(), r))
        .collect()
}

pub fn run(ctx: &mut Ctx, a: &Args, rep: &mut Report) {
    let (me, p) = (ctx.peers.rank(), ctx.peers.size());
    if !p.is_power_of_two() {
        fail(format!(
            "app: {p} ranks, a bitonic sort needs a power of two"
        ));
    }
    let n = ctx.app_own.1;
    // Every peer's receive buffer (the last buffer each exposes) and its floor rkey.
    let remote: Vec<Vec<Exposed>> = (0..p)
        .map(|r| {
            if r == me {
                Vec::new()
            } else {
                served::info(ctx.peers.am(), r)
            }
        })
        .collect();
    let recv_addr: Vec<u64> = remote
        .iter()
        .map(|v| v.last().map_or(0, |e| e.addr))
        .collect();
    let mut ts: Vec<Box<dyn Transport>> = vec![
        Box::new(Firehose::new(ctx, a.window)),
        Box::new(Floor::new(ctx, a.window, remote)),
        Box::new(Rendezvous::new(ctx, a.window, false)),
        Box::new(Rendezvous::new(ctx, a.window, true)),
    ];
    let log_p = p.trailing_zeros();
    let chunks_per_block = (n * 8).div_ceil(a.app_chunk) as u64;
    let steps = (log_p * (log_p + 1) / 2) as u64;
    let mut scratch = Vec::with_capacity(n);
    let (own_ptr, recv_ptr) = (ctx.app_own.0, ctx.app_recv);
    for t in ts.iter_mut() {
        ctx.barrier("app-start");
        let before = (me == 0).then(|| all_stats(ctx));
        ctx.barrier("app-go");
        let t0 = Instant::now();
        let mut pre = (0u64, 0u64);
        for r in 0..a.app_reps {
            // SAFETY: `own_ptr` is this rank's keys block (n u64, leaked, live to the end); no
            // put from it is in flight here (every step ends with quiet) and nothing else
            // refers to it.
            let own = unsafe { std::slice::from_raw_parts_mut(own_ptr, n) };
            let mut rng = Rng::with_seed(0xB170_0000 ^ ((me as u64) << 20) ^ r as u64);
            for k in own.iter_mut() {
                *k = rng.u64(..);
            }
            // The record checks the last repetition: its keys before and after.
            pre = sum_xor(own);
            own.sort_unstable();
            for i in 1..=log_p {
                for j in (0..i).rev() {
                    let partner = me ^ (1 << j);
                    let base = recv_addr[partner as usize];
                    {
                        // SAFETY: a read-only view of the keys block, alive until `quiet`
                        // below (the transports keep no source past it); the block is not
                        // written meanwhile.
                        let bytes: &'static [u8] =
                            unsafe { std::slice::from_raw_parts(own_ptr.cast::<u8>(), n * 8) };
                        for (c, chunk) in bytes.chunks(a.app_chunk).enumerate() {
                            t.put_nb(partner, base + (c * a.app_chunk) as u64, chunk);
                        }
                        t.quiet();
                    }
                    // Every partner's block is in our receive buffer once all passed this.
                    ctx.barrier("app-exchanged");
                    // SAFETY: the receive buffer (n u64, leaked, registered): the partner's
                    // writes completed before it entered the barrier, and no peer writes it
                    // again before the next barrier.
                    let other = unsafe { std::slice::from_raw_parts(recv_ptr, n) };
                    // SAFETY: as above for the keys block (no put in flight).
                    let own = unsafe { std::slice::from_raw_parts_mut(own_ptr, n) };
                    let low = (((me >> i) & 1) == 0) == (me < partner);
                    compare_split(own, other, low, &mut scratch);
                    ctx.barrier("app-merged");
                }
            }
        }
        // SAFETY: as above.
        let own = unsafe { std::slice::from_raw_parts(own_ptr, n) };
        *ctx.served.verify.lock().unwrap() = record(own, pre);
        ctx.barrier("app-sorted");
        let secs = t0.elapsed().as_secs_f64();
        if let Some(before) = before {
            let ok = verify(ctx);
            let after = all_stats(ctx);
            let sum = |f: fn(&TargetStats) -> u64| -> u64 {
                after.iter().zip(&before).map(|(x, y)| f(x) - f(y)).sum()
            };
            let row = AppRow {
                series: t.name(),
                ranks: p,
                keys_per_rank: n,
                reps: a.app_reps,
                secs,
                puts: p as u64 * steps * chunks_per_block * a.app_reps as u64,
                hits: sum(|s| s.hits),
                misses: sum(|s| s.misses),
                moves: sum(|s| s.moves),
                verified: ok,
            };
            if !ok {
                fail(format!("app: {} sorted wrongly", row.series));
            }
            rep.add_app(row);
        }
        ctx.barrier("app-done");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_split_keeps_the_right_half() {
        let mut scratch = Vec::new();
        let mut a = vec![1, 4, 6, 9];
        compare_split(&mut a, &[2, 3, 7, 8], true, &mut scratch);
        assert_eq!(a, vec![1, 2, 3, 4]);
        let mut b = vec![1, 4, 6, 9];
        compare_split(&mut b, &[2, 3, 7, 8], false, &mut scratch);
        assert_eq!(b, vec![6, 7, 8, 9]);
        let mut c = vec![5, 5];
        compare_split(&mut c, &[5, 5], false, &mut scratch);
        assert_eq!(c, vec![5, 5]);
    }

    /// The bitonic network over blocks, simulated in one process, sorts.
    #[test]
    fn bitonic_blocks_sort() {
        let (p, n) = (8u32, 16usize);
        let mut rng = Rng::with_seed(7);
        let mut blocks: Vec<Vec<u64>> = (0..p)
            .map(|_| {
                let mut v: Vec<u64> = (0..n).map(|_| rng.u64(..1000)).collect();
                v.sort_unstable();
                v
            })
            .collect();
        let mut all: Vec<u64> = blocks.concat();
        all.sort_unstable();
        let mut scratch = Vec::new();
        let log_p = p.trailing_zeros();
        for i in 1..=log_p {
            for j in (0..i).rev() {
                let snapshot = blocks.clone();
                for me in 0..p {
                    let partner = me ^ (1 << j);
                    let low = (((me >> i) & 1) == 0) == (me < partner);
                    compare_split(
                        &mut blocks[me as usize],
                        &snapshot[partner as usize],
                        low,
                        &mut scratch,
                    );
                }
            }
        }
        assert_eq!(blocks.concat(), all);
    }
}
