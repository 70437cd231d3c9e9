//! A cheap hasher for the shim's small integer keys (wrapper addresses, (pd, rights), lkeys).
//!
//! The hit path looks up three maps per `ibv_reg_mr` + `ibv_dereg_mr`; with std's SipHash that
//! was about a third of the shim's instructions per hit. The keys are addresses and keys chosen
//! by us or the kernel, not by a peer, so hash flooding is not a concern: one multiply per word
//! plus a fold (hashbrown uses both the low and the top bits) is enough.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default, Clone, Copy)]
pub struct WordHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        // A multiply only mixes upwards: fold the well-mixed high half into the low bits, which
        // pick the bucket (aligned addresses would otherwise share them).
        self.0 ^ (self.0 >> 44)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(K);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<WordHasher>>;

/// An empty map (usable where `HashMap::new` was).
pub fn new_map<K, V>() -> FastMap<K, V> {
    HashMap::with_hasher(BuildHasherDefault::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn distinct_small_keys_spread_over_the_top_bits() {
        let b = BuildHasherDefault::<WordHasher>::default();
        // Wrapper addresses differ by the allocation size in the low bits only; hashbrown picks
        // the bucket from the low bits and a 7-bit tag from the top ones: both must vary.
        let hs: Vec<u64> = (0..64u64)
            .map(|i| b.hash_one(0x5555_0000_0000usize + i as usize * 64))
            .collect();
        let low: std::collections::HashSet<u64> = hs.iter().map(|h| h & 63).collect();
        let top: std::collections::HashSet<u64> = hs.iter().map(|h| h >> 57).collect();
        assert!(low.len() > 32, "low bits collide: {}", low.len());
        assert!(top.len() > 32, "top bits collide: {}", top.len());
        assert_ne!(b.hash_one((1usize, 2u32)), b.hash_one((2usize, 1u32)));
    }
}
