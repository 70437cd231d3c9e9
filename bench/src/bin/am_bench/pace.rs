//! What the attentiveness test (attn.rs) and its RDMA-free floor (wake_floor.rs) share, so that
//! both run the same responder work and send requests at the same times.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// splitmix64 step: the request times, reproducible from run to run.
pub fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

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

/// The seed of phase `i`'s request times.
pub fn seed(i: usize) -> u64 {
    42 + i as u64
}
