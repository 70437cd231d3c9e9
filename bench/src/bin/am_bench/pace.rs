//! What the attentiveness test (attn.rs) and its RDMA-free floor (wake_floor.rs) share, so that
//! both run the same responder work and send requests at the same times.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Busy arithmetic for `block` that the optimiser cannot drop; the clock is read every 4096
/// steps (a read costs microseconds under TCG). Returns the new state.
pub fn compute(block: Duration, mut x: u64) -> u64 {
    let end = Instant::now() + block;
    while Instant::now() < end {
        for _ in 0..4096 {
            x = black_box(x.rotate_left(7) ^ x.wrapping_mul(0xBF58_476D_1CE4_E5B9));
        }
    }
    x
}

/// Phase `i`'s request times: a seeded RNG, so they are the same from run to run.
pub fn rng(i: usize) -> fastrand::Rng {
    fastrand::Rng::with_seed(42 + i as u64)
}
