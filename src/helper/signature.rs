//! Call-site signatures (Li et al., "Scalable Memory Registration for High Performance Networks
//! Using Helper Threads" (CF 2011), section 3.1): the current communication point (the caller's
//! return address and the registered address) hashed together with a window of the previous points
//! *of the same thread*. The window is what tells apart the uses of one call site that follow
//! different control paths: in Figure 4's nested loops, the first iteration of inner loop 1 follows
//! loop 2 (its window holds loop 2's call site), the later ones follow loop 1 itself, and each of
//! those contexts has its own period.
//!
//! The paper settles on a window of two previous points (its Figure 6a: a window of 0 loses ~20 %
//! of the accurate predictions on CG, more than one adds little); `MAX_WINDOW` bounds the setting.

/// The longest window the predictor accepts.
pub(crate) const MAX_WINDOW: usize = 4;

/// One communication point: where it was called from and which memory it used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct CallPoint {
    /// The caller's return address (C API), a `#[track_caller]` location (Rust API), or 0 when
    /// unknown (the shim): then the address and the window carry the context alone.
    pub site: usize,
    /// Page-aligned start of the registered range.
    pub addr: usize,
}

/// The previous points of one thread, most recent first.
#[derive(Debug, Clone, Default)]
pub(crate) struct Window {
    prev: [CallPoint; MAX_WINDOW],
    len: usize,
}

/// One round of a 64-bit mixer (the finaliser of splitmix64): every input bit reaches every
/// output bit, so signatures of nearby addresses do not collide in a hash map's low bits.
#[inline]
fn mix(h: u64, v: u64) -> u64 {
    let mut x = h ^ v.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Window {
    /// The signature of `cur` in this context, using the `window` most recent previous points
    /// (fewer at the start of the thread: a distinct context, as the paper's first iteration).
    pub(crate) fn signature(&self, cur: CallPoint, window: usize) -> u64 {
        let mut h = mix(mix(0, cur.site as u64), cur.addr as u64);
        let n = window.min(self.len);
        for p in &self.prev[..n] {
            h = mix(mix(h, p.site as u64), p.addr as u64);
        }
        // The count too, so "no previous point" differs from a previous point of (0, 0).
        mix(h, n as u64)
    }

    /// `cur` becomes the most recent previous point.
    pub(crate) fn push(&mut self, cur: CallPoint) {
        self.prev.copy_within(0..MAX_WINDOW - 1, 1);
        self.prev[0] = cur;
        self.len = (self.len + 1).min(MAX_WINDOW);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(site: usize, addr: usize) -> CallPoint {
        CallPoint { site, addr }
    }

    #[test]
    fn context_separates_the_same_call_site() {
        let mut w = Window::default();
        let first = w.signature(p(1, 0x1000), 2);
        w.push(p(2, 0x2000));
        let after_other = w.signature(p(1, 0x1000), 2);
        w.push(p(1, 0x1000));
        let after_self = w.signature(p(1, 0x1000), 2);
        assert_ne!(first, after_other);
        assert_ne!(after_other, after_self);
        // Window 0: only the point itself counts.
        assert_eq!(
            Window::default().signature(p(1, 0x1000), 0),
            w.signature(p(1, 0x1000), 0)
        );
        // Beyond the window, older points do not matter.
        let mut a = Window::default();
        let mut b = Window::default();
        a.push(p(9, 9));
        for q in [p(1, 1), p(2, 2)] {
            a.push(q);
            b.push(q);
        }
        assert_eq!(a.signature(p(3, 3), 2), b.signature(p(3, 3), 2));
        assert_ne!(a.signature(p(3, 3), 3), b.signature(p(3, 3), 3));
    }

    #[test]
    fn site_and_address_both_count() {
        let w = Window::default();
        assert_ne!(w.signature(p(1, 0x1000), 2), w.signature(p(2, 0x1000), 2));
        assert_ne!(w.signature(p(1, 0x1000), 2), w.signature(p(1, 0x2000), 2));
        // (0, 0) with no context differs from no context at all being pushed as (0, 0).
        let mut z = Window::default();
        z.push(p(0, 0));
        assert_ne!(
            Window::default().signature(p(0, 0), 2),
            z.signature(p(0, 0), 2)
        );
    }
}
