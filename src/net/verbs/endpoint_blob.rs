//! The bytes each rank contributes to the one bootstrap allgather that connects a `VerbsLink`:
//! its address (LID, GID), its probe word (address, rkey), its receive sizing, and for every
//! peer the QP number and first PSN of the QP it made for that peer.
//!
//! Fixed little-endian layout with a magic and a version, checked strictly on decode: a blob from
//! another build, another job size or a corrupted exchange must fail loudly at startup, not
//! connect QPs to garbage.
//!
//! ```text
//! 0  magic u32 "FHVL"   4  version u16   6  reserved u16 (0)
//! 8  rank u32           12 size u32      16 lid u16      18 rd_atomic u16
//! 20 gid [16]           36 probe_addr u64                44 probe_rkey u32
//! 48 recv_depth u32     52 max_size u32
//! 56 size x (qpn u32, psn u32)   (the entry for the rank itself is zero)
//! ```
//!
//! `rd_atomic`: how many RDMA READs this rank's QPs serve at once (their `max_dest_rd_atomic`);
//! a peer's QP must not have more outstanding toward it. Version 2 added it (was reserved).

use std::fmt;

use crate::net::Rank;
use crate::pin::verbs::Gid;

const MAGIC: u32 = u32::from_le_bytes(*b"FHVL");
/// Bump when the layout changes.
pub(crate) const VERSION: u16 = 2;
const HEADER: usize = 56;
const PER_PEER: usize = 8;

/// A blob that does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlobError(pub String);

impl fmt::Display for BlobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "endpoint blob: {}", self.0)
    }
}

impl std::error::Error for BlobError {}

/// One rank's connection information.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankBlob {
    pub rank: Rank,
    pub size: u32,
    pub lid: u16,
    /// RDMA READs this rank serves at once per QP (its responder depth, at least 1).
    pub rd_atomic: u16,
    pub gid: Gid,
    /// Where peers RDMA WRITE their probes (8 bytes per peer, indexed by the writer's rank).
    pub probe_addr: u64,
    pub probe_rkey: u32,
    pub recv_depth: u32,
    pub max_size: u32,
    /// `(qpn, psn)` of this rank's QP for each peer, indexed by peer rank.
    pub qps: Vec<(u32, u32)>,
}

/// Bytes one rank contributes in a job of `size` ranks.
pub(crate) fn blob_len(size: u32) -> usize {
    HEADER + PER_PEER * size as usize
}

impl RankBlob {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(blob_len(self.size));
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&self.rank.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        b.extend_from_slice(&self.lid.to_le_bytes());
        b.extend_from_slice(&self.rd_atomic.to_le_bytes());
        b.extend_from_slice(&self.gid.0);
        b.extend_from_slice(&self.probe_addr.to_le_bytes());
        b.extend_from_slice(&self.probe_rkey.to_le_bytes());
        b.extend_from_slice(&self.recv_depth.to_le_bytes());
        b.extend_from_slice(&self.max_size.to_le_bytes());
        for &(qpn, psn) in &self.qps {
            b.extend_from_slice(&qpn.to_le_bytes());
            b.extend_from_slice(&psn.to_le_bytes());
        }
        debug_assert_eq!(b.len(), blob_len(self.size));
        b
    }

    /// Decode the blob at position `rank` of a job of `size` ranks.
    pub(crate) fn decode(b: &[u8], rank: Rank, size: u32) -> Result<Self, BlobError> {
        if b.len() != blob_len(size) {
            return Err(BlobError(format!(
                "rank {rank}: {} bytes, expected {} for {size} ranks",
                b.len(),
                blob_len(size)
            )));
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        if u32_at(0) != MAGIC {
            return Err(BlobError(format!(
                "rank {rank}: bad magic {:#010x}",
                u32_at(0)
            )));
        }
        if u16_at(4) != VERSION {
            return Err(BlobError(format!(
                "rank {rank}: version {} (this build speaks {VERSION})",
                u16_at(4)
            )));
        }
        let blob = RankBlob {
            rank: u32_at(8),
            size: u32_at(12),
            lid: u16_at(16),
            rd_atomic: u16_at(18),
            gid: Gid(b[20..36].try_into().unwrap()),
            probe_addr: u64_at(36),
            probe_rkey: u32_at(44),
            recv_depth: u32_at(48),
            max_size: u32_at(52),
            qps: (0..size as usize)
                .map(|i| {
                    let o = HEADER + PER_PEER * i;
                    (u32_at(o), u32_at(o + 4))
                })
                .collect(),
        };
        if blob.rank != rank || blob.size != size {
            return Err(BlobError(format!(
                "position {rank} of {size} holds rank {} of {}",
                blob.rank, blob.size
            )));
        }
        Ok(blob)
    }

    /// Split an allgather result into the `size` blobs, each checked.
    pub(crate) fn decode_all(all: &[u8], size: u32) -> Result<Vec<Self>, BlobError> {
        let len = blob_len(size);
        if all.len() != len * size as usize {
            return Err(BlobError(format!(
                "allgather gave {} bytes, expected {size} x {len}",
                all.len()
            )));
        }
        all.chunks_exact(len)
            .enumerate()
            .map(|(r, b)| Self::decode(b, r as Rank, size))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rank: Rank, size: u32) -> RankBlob {
        RankBlob {
            rank,
            size,
            lid: 0x1234,
            rd_atomic: 16 + rank as u16,
            gid: Gid([7; 16]),
            probe_addr: 0xdead_beef_0000 + u64::from(rank),
            probe_rkey: 0xabcd,
            recv_depth: 64,
            max_size: 4096,
            qps: (0..size).map(|p| (100 + p, 0x00ff_0000 | p)).collect(),
        }
    }

    #[test]
    fn round_trip_one_and_all() {
        let b = sample(2, 4);
        let bytes = b.encode();
        assert_eq!(bytes.len(), blob_len(4));
        assert_eq!(RankBlob::decode(&bytes, 2, 4).unwrap(), b);
        let all: Vec<u8> = (0..4).flat_map(|r| sample(r, 4).encode()).collect();
        let got = RankBlob::decode_all(&all, 4).unwrap();
        assert_eq!(got, (0..4).map(|r| sample(r, 4)).collect::<Vec<_>>());
    }

    #[test]
    fn responder_depth_sits_at_offset_18() {
        let bytes = sample(3, 4).encode();
        assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), 19);
        assert_eq!(RankBlob::decode(&bytes, 3, 4).unwrap().rd_atomic, 19);
    }

    #[test]
    fn wrong_length_is_rejected() {
        let bytes = sample(0, 3).encode();
        assert!(RankBlob::decode(&bytes[..bytes.len() - 1], 0, 3).is_err());
        assert!(RankBlob::decode(&[bytes.clone(), vec![0]].concat(), 0, 3).is_err());
        assert!(RankBlob::decode(&bytes, 0, 4).is_err());
        assert!(RankBlob::decode_all(&bytes, 3).is_err());
        assert!(RankBlob::decode(&[], 0, 1).is_err());
    }

    #[test]
    fn wrong_version_or_magic_is_rejected() {
        let mut bytes = sample(1, 2).encode();
        bytes[4] = VERSION as u8 + 1;
        let e = RankBlob::decode(&bytes, 1, 2).unwrap_err();
        assert!(e.0.contains("version"), "{e}");
        let mut bytes = sample(1, 2).encode();
        bytes[0] ^= 1;
        assert!(RankBlob::decode(&bytes, 1, 2)
            .unwrap_err()
            .0
            .contains("magic"));
    }

    #[test]
    fn blob_at_the_wrong_position_is_rejected() {
        let all: Vec<u8> = [sample(1, 2), sample(0, 2)]
            .iter()
            .flat_map(RankBlob::encode)
            .collect();
        assert!(RankBlob::decode_all(&all, 2).is_err());
    }
}
