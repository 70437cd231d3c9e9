//! A hasher for the endpoint's small integer keys (ticket tokens, handler ids): one multiply
//! instead of SipHash, which cost ~700 instructions per round trip (callgrind, `am_profile rtt`).
//! Safe against flooding here: only this process chooses the keys it inserts (tokens are
//! sequential, handler ids are the application's); a peer's forged key can only miss a lookup.

use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci hashing: the product's high bits, which hashbrown uses for its control bytes, depend
/// on every bit of the key.
#[derive(Default, Clone, Copy)]
pub struct SmallKeyHasher(u64);

impl Hasher for SmallKeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Not used by u16/u32 keys; kept correct for any other key anyway.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub type SmallKeyMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<SmallKeyHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn sequential_keys_spread_over_the_high_bits() {
        let b = BuildHasherDefault::<SmallKeyHasher>::default();
        let tops: std::collections::HashSet<u64> =
            (1u32..=128).map(|k| b.hash_one(k) >> 57).collect();
        assert!(
            tops.len() > 64,
            "only {} distinct top-7-bit values",
            tops.len()
        );
    }

    #[test]
    fn map_works_with_it() {
        let mut m = SmallKeyMap::<u32, u32>::default();
        for k in 0..10_000 {
            m.insert(k, k * 2);
        }
        assert!((0..10_000).all(|k| m.get(&k) == Some(&(k * 2))));
        assert_eq!(m.get(&10_000), None);
    }
}
