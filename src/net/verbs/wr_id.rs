//! Work request ids: every completion must say which peer (and which receive slot or send) it is
//! for without a lookup table, so the 64-bit `wr_id` packs `kind:2 | peer:30 | low:32`.
//! `low` is the receive slot for a receive, and the low 32 bits of the per-peer send sequence
//! number for a send, probe or RDMA op (the full number is rebuilt from the completed count:
//! fewer than 2^32 sends are ever outstanding). An RDMA op's caller token (64 bits, no room here)
//! sits in the peer's token table at `seq % sq_depth` (peer.rs), found again through `low`.

use crate::net::Rank;

/// Ranks must fit the 30-bit peer field.
pub(crate) const MAX_RANKS: u32 = 1 << 30;

/// What a work request was posted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WrKind {
    /// A receive slot.
    Recv = 0,
    /// A SEND of a message.
    Send = 1,
    /// An RDMA WRITE to the peer's probe word.
    Probe = 2,
    /// A caller's RDMA WRITE or READ (`Link::rdma`), always signaled.
    Rdma = 3,
}

/// Pack a work request id. `peer < MAX_RANKS`.
#[inline]
pub(crate) fn encode(kind: WrKind, peer: Rank, low: u32) -> u64 {
    debug_assert!(peer < MAX_RANKS);
    ((kind as u64) << 62) | (u64::from(peer & (MAX_RANKS - 1)) << 32) | u64::from(low)
}

/// Unpack a work request id. Every 2-bit kind is in use, so every id decodes; the caller still
/// checks the peer and slot against its tables (`Option` is kept for a future kind that is not).
#[inline]
pub(crate) fn decode(wr_id: u64) -> Option<(WrKind, Rank, u32)> {
    let kind = match wr_id >> 62 {
        0 => WrKind::Recv,
        1 => WrKind::Send,
        2 => WrKind::Probe,
        _ => WrKind::Rdma,
    };
    Some((kind, ((wr_id >> 32) as u32) & (MAX_RANKS - 1), wr_id as u32))
}

/// The full sequence number whose low 32 bits are `low`, given that it is at or after
/// `completed` and fewer than 2^32 sequence numbers past it.
#[inline]
pub(crate) fn full_seq(completed: u64, low: u32) -> u64 {
    completed + u64::from(low.wrapping_sub(completed as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_kind_and_extremes() {
        for kind in [WrKind::Recv, WrKind::Send, WrKind::Probe, WrKind::Rdma] {
            for peer in [0, 1, 3, MAX_RANKS - 1] {
                for low in [0, 1, 63, u32::MAX] {
                    assert_eq!(decode(encode(kind, peer, low)), Some((kind, peer, low)));
                }
            }
        }
    }

    #[test]
    fn fields_do_not_bleed_into_each_other() {
        let a = encode(WrKind::Send, 5, u32::MAX);
        let b = encode(WrKind::Send, 6, 0);
        assert_ne!(a, b);
        assert_eq!(decode(a).unwrap().1, 5);
        assert_eq!(decode(encode(WrKind::Recv, 0, 7)).unwrap().0, WrKind::Recv);
    }

    #[test]
    fn kind_three_is_rdma() {
        assert_eq!(decode(3 << 62), Some((WrKind::Rdma, 0, 0)));
        assert_eq!(decode(encode(WrKind::Rdma, 9, 4)).unwrap().0, WrKind::Rdma);
    }

    #[test]
    fn full_seq_rebuilds_across_the_32_bit_wrap() {
        assert_eq!(full_seq(0, 5), 5);
        assert_eq!(full_seq(10, 10), 10);
        let base = (1u64 << 32) - 2;
        assert_eq!(full_seq(base, (base + 3) as u32), base + 3);
        assert_eq!(full_seq(7 << 32, 1), (7 << 32) + 1);
    }
}
