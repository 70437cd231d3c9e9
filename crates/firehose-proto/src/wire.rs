//! The Firehose messages on the wire: tagged, versioned, little-endian, length-checked.
//!
//! ```text
//! every message: version u8 (=2), kind u8, then the body of its kind
//! MOVE       req u32, n_release u16, n_pin u16, has_put u8,
//!            n_release × handle u64,
//!            n_pin × (start bucket u64, n buckets u32, need offset u32, need count u32,
//!                     rights u8),
//!            [put: remote addr u64, len u16, len bytes]
//! REPLY      req u32, n u16, has_put u8,
//!            n × (code u8, handle u64, start u64, nb u32, rkey u32, rights u8),
//!            [put code u8]                      (code 0 = pinned; else a `RemoteError` code and
//!                                                 the other fields zero)
//! REVOKE     n u16, n × handle u64              (target -> holder: stop using these regions)
//! REVOKE_ACK n u16, n × handle u64              (holder -> target: released, forget them)
//! QUOTA_WANT want u64                           (adaptive: holder is out of firehoses)
//! QUOTA_SET  quota u64, cut u8                  (adaptive: target sets the holder's quota;
//!                                                 a cut asks for an ack)
//! QUOTA_ACK  quota u64                          (adaptive: the quota the holder accepted)
//! ```
//!
//! `rights` (version 2): the remote rights a pin asks for (`Rights`: 1 read, 2 write, 3 both;
//! never 0, no other bit) and those the granted region has (at least the asked ones: a target
//! may hand out a region it already pinned with more).
//!
//! Decoding checks lengths, counts against the bytes present, reserved values and trailing
//! bytes; semantic checks (known ids, quotas) belong to the receiving side. Encoding is
//! infallible: callers bound counts so messages stay under `max_msg`.

pub use crate::error::RemoteError;
use crate::error::WireError;

pub const VERSION: u8 = 2;
pub const MOVE_FIXED: usize = 2 + 4 + 2 + 2 + 1;
pub const RELEASE_LEN: usize = 8;
pub const PIN_LEN: usize = 21;
pub const PUT_FIXED: usize = 8 + 2;
pub const REPLY_FIXED: usize = 2 + 4 + 2 + 1 + 1;
pub const GRANT_LEN: usize = 1 + 8 + 8 + 4 + 4 + 1;
pub const LIST_FIXED: usize = 2 + 2;
pub const HANDLE_LEN: usize = 8;

const K_MOVE: u8 = 1;
const K_REPLY: u8 = 2;
const K_REVOKE: u8 = 3;
const K_REVOKE_ACK: u8 = 4;
const K_QUOTA_WANT: u8 = 5;
const K_QUOTA_SET: u8 = 6;
const K_QUOTA_ACK: u8 = 7;

/// The remote rights of a pin: what peers may do through its key. A get needs `READ`, a put
/// `WRITE`; a region is pinned with the rights its holder asked for (see `initiator/advance.rs`
/// for when it asks for both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rights(pub u8);

impl Rights {
    pub const NONE: Rights = Rights(0);
    pub const READ: Rights = Rights(1);
    pub const WRITE: Rights = Rights(2);
    pub const BOTH: Rights = Rights(3);

    /// Every right of `want` is in `self`.
    #[inline]
    pub fn covers(self, want: Rights) -> bool {
        self.0 & want.0 == want.0
    }
    #[inline]
    pub fn union(self, other: Rights) -> Rights {
        Rights(self.0 | other.0)
    }
    /// What a pin may ask for: at least one right, no unknown bit.
    #[inline]
    pub fn is_valid(self) -> bool {
        self.0 != 0 && self.0 & !Self::BOTH.0 == 0
    }
    fn decode(b: u8) -> Result<Rights, WireError> {
        let r = Rights(b);
        if r.is_valid() {
            Ok(r)
        } else {
            Err(WireError::Malformed)
        }
    }
}

/// One pin asked for: the aligned range `[start, start + nb)` it may cover, of which the
/// buckets `[start + need_off, start + need_off + need_n)` must be covered, with `rights`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinReq {
    pub start: u64,
    pub nb: u32,
    pub need_off: u32,
    pub need_n: u32,
    pub rights: Rights,
}

/// A region granted for a pin: the target's handle (never reused), its buckets, key and rights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub handle: u64,
    pub start: u64,
    pub nb: u32,
    pub rkey: u32,
    pub rights: Rights,
}

impl Grant {
    /// The fields of a refused grant on the wire.
    const ZERO: Grant = Grant {
        handle: 0,
        start: 0,
        nb: 0,
        rkey: 0,
        rights: Rights::NONE,
    };
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg<'a> {
    Move {
        req: u32,
        releases: Vec<u64>,
        pins: Vec<PinReq>,
        put: Option<(u64, &'a [u8])>,
    },
    Reply {
        req: u32,
        grants: Vec<Result<Grant, RemoteError>>,
        put: Option<Result<(), RemoteError>>,
    },
    Revoke(Vec<u64>),
    RevokeAck(Vec<u64>),
    QuotaWant(u64),
    QuotaSet {
        quota: u64,
        cut: bool,
    },
    QuotaAck(u64),
}

struct Rd<'a> {
    b: &'a [u8],
}

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.b.len() < n {
            return Err(WireError::Truncated);
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    /// A count of `each`-byte items that must be present in full (checked before allocating).
    fn count(&mut self, each: usize) -> Result<usize, WireError> {
        let n = self.u16()? as usize;
        if n * each > self.b.len() {
            return Err(WireError::Truncated);
        }
        Ok(n)
    }
    fn handles(&mut self) -> Result<Vec<u64>, WireError> {
        let n = self.count(HANDLE_LEN)?;
        (0..n).map(|_| self.u64()).collect()
    }
    fn flag(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(WireError::Malformed),
        }
    }
}

/// Parses one message; any defect is an error and nothing is returned.
pub fn decode(bytes: &[u8]) -> Result<Msg<'_>, WireError> {
    let mut r = Rd { b: bytes };
    if r.u8()? != VERSION {
        return Err(WireError::BadVersion);
    }
    let msg = match r.u8()? {
        K_MOVE => {
            let req = r.u32()?;
            let n_rel = r.u16()? as usize;
            let n_pin = r.u16()? as usize;
            let has_put = r.flag()?;
            if n_rel * RELEASE_LEN + n_pin * PIN_LEN > r.b.len() {
                return Err(WireError::Truncated);
            }
            let releases = (0..n_rel).map(|_| r.u64()).collect::<Result<_, _>>()?;
            let mut pins = Vec::with_capacity(n_pin);
            for _ in 0..n_pin {
                pins.push(PinReq {
                    start: r.u64()?,
                    nb: r.u32()?,
                    need_off: r.u32()?,
                    need_n: r.u32()?,
                    rights: Rights::decode(r.u8()?)?,
                });
            }
            let put = if has_put {
                let addr = r.u64()?;
                let n = r.u16()? as usize;
                Some((addr, r.take(n)?))
            } else {
                None
            };
            Msg::Move {
                req,
                releases,
                pins,
                put,
            }
        }
        K_REPLY => {
            let req = r.u32()?;
            let n = r.count(GRANT_LEN)?;
            let has_put = r.flag()?;
            let mut grants = Vec::with_capacity(n);
            for _ in 0..n {
                let code = r.u8()?;
                let g = Grant {
                    handle: r.u64()?,
                    start: r.u64()?,
                    nb: r.u32()?,
                    rkey: r.u32()?,
                    rights: Rights(r.u8()?),
                };
                grants.push(if code == 0 {
                    Rights::decode(g.rights.0)?;
                    Ok(g)
                } else if g == Grant::ZERO {
                    Err(RemoteError::from_u8(code).ok_or(WireError::Malformed)?)
                } else {
                    return Err(WireError::Malformed);
                });
            }
            let put = if has_put {
                Some(match r.u8()? {
                    0 => Ok(()),
                    c => Err(RemoteError::from_u8(c).ok_or(WireError::Malformed)?),
                })
            } else {
                None
            };
            Msg::Reply { req, grants, put }
        }
        K_REVOKE => Msg::Revoke(r.handles()?),
        K_REVOKE_ACK => Msg::RevokeAck(r.handles()?),
        K_QUOTA_WANT => Msg::QuotaWant(r.u64()?),
        K_QUOTA_SET => Msg::QuotaSet {
            quota: r.u64()?,
            cut: r.flag()?,
        },
        K_QUOTA_ACK => Msg::QuotaAck(r.u64()?),
        _ => return Err(WireError::UnknownKind),
    };
    if !r.b.is_empty() {
        return Err(WireError::TrailingBytes);
    }
    Ok(msg)
}

/// Serializes `m`. Counts must fit in u16 and a put in u16 bytes (callers bound them).
pub fn encode(m: &Msg<'_>) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    v.push(VERSION);
    let handles = |v: &mut Vec<u8>, hs: &[u64]| {
        v.extend_from_slice(&(hs.len() as u16).to_le_bytes());
        for h in hs {
            v.extend_from_slice(&h.to_le_bytes());
        }
    };
    match m {
        Msg::Move {
            req,
            releases,
            pins,
            put,
        } => {
            v.push(K_MOVE);
            v.extend_from_slice(&req.to_le_bytes());
            v.extend_from_slice(&(releases.len() as u16).to_le_bytes());
            v.extend_from_slice(&(pins.len() as u16).to_le_bytes());
            v.push(put.is_some() as u8);
            for h in releases {
                v.extend_from_slice(&h.to_le_bytes());
            }
            for p in pins {
                v.extend_from_slice(&p.start.to_le_bytes());
                v.extend_from_slice(&p.nb.to_le_bytes());
                v.extend_from_slice(&p.need_off.to_le_bytes());
                v.extend_from_slice(&p.need_n.to_le_bytes());
                v.push(p.rights.0);
            }
            if let Some((addr, data)) = put {
                v.extend_from_slice(&addr.to_le_bytes());
                v.extend_from_slice(&(data.len() as u16).to_le_bytes());
                v.extend_from_slice(data);
            }
        }
        Msg::Reply { req, grants, put } => {
            v.push(K_REPLY);
            v.extend_from_slice(&req.to_le_bytes());
            v.extend_from_slice(&(grants.len() as u16).to_le_bytes());
            v.push(put.is_some() as u8);
            for g in grants {
                let (code, g) = match g {
                    Ok(g) => (0, *g),
                    Err(e) => (*e as u8, Grant::ZERO),
                };
                v.push(code);
                v.extend_from_slice(&g.handle.to_le_bytes());
                v.extend_from_slice(&g.start.to_le_bytes());
                v.extend_from_slice(&g.nb.to_le_bytes());
                v.extend_from_slice(&g.rkey.to_le_bytes());
                v.push(g.rights.0);
            }
            if let Some(p) = put {
                v.push(match p {
                    Ok(()) => 0,
                    Err(e) => *e as u8,
                });
            }
        }
        Msg::Revoke(hs) => {
            v.push(K_REVOKE);
            handles(&mut v, hs);
        }
        Msg::RevokeAck(hs) => {
            v.push(K_REVOKE_ACK);
            handles(&mut v, hs);
        }
        Msg::QuotaWant(w) => {
            v.push(K_QUOTA_WANT);
            v.extend_from_slice(&w.to_le_bytes());
        }
        Msg::QuotaSet { quota, cut } => {
            v.push(K_QUOTA_SET);
            v.extend_from_slice(&quota.to_le_bytes());
            v.push(*cut as u8);
        }
        Msg::QuotaAck(q) => {
            v.push(K_QUOTA_ACK);
            v.extend_from_slice(&q.to_le_bytes());
        }
    }
    v
}

/// Handles per REVOKE / REVOKE_ACK message under `max_msg`.
pub fn handles_per_msg(max_msg: usize) -> usize {
    ((max_msg - LIST_FIXED) / HANDLE_LEN).min(u16::MAX as usize)
}

/// Pins per move under `max_msg`, so that both the move and its reply fit.
pub fn pins_per_move(max_msg: usize) -> usize {
    ((max_msg - MOVE_FIXED) / PIN_LEN)
        .min((max_msg - REPLY_FIXED) / GRANT_LEN)
        .min(u16::MAX as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Msg<'static>> {
        vec![
            Msg::Move {
                req: 7,
                releases: vec![1, u64::MAX],
                pins: vec![PinReq {
                    start: 64,
                    nb: 32,
                    need_off: 3,
                    need_n: 2,
                    rights: Rights::READ,
                }],
                put: Some((0x1000, b"hello")),
            },
            Msg::Move {
                req: 0,
                releases: vec![],
                pins: vec![],
                put: None,
            },
            Msg::Reply {
                req: 9,
                grants: vec![
                    Ok(Grant {
                        handle: 5,
                        start: 64,
                        nb: 32,
                        rkey: 77,
                        rights: Rights::BOTH,
                    }),
                    Err(RemoteError::Unmapped),
                    Err(RemoteError::Denied),
                ],
                put: Some(Err(RemoteError::NoMemory)),
            },
            Msg::Reply {
                req: 1,
                grants: vec![],
                put: None,
            },
            Msg::Revoke(vec![1, 2, 3]),
            Msg::RevokeAck(vec![]),
            Msg::QuotaWant(12),
            Msg::QuotaSet {
                quota: 99,
                cut: true,
            },
            Msg::QuotaAck(98),
        ]
    }

    #[test]
    fn round_trip_and_every_truncation_fails() {
        for m in all() {
            let b = encode(&m);
            assert_eq!(decode(&b).unwrap(), m);
            for n in 0..b.len() {
                assert!(decode(&b[..n]).is_err(), "{m:?} cut at {n}");
            }
            let mut long = b.clone();
            long.push(0);
            assert_eq!(decode(&long), Err(WireError::TrailingBytes));
        }
    }

    #[test]
    fn bad_header_and_fields() {
        assert_eq!(decode(&[3, 1]), Err(WireError::BadVersion));
        assert_eq!(decode(&[2, 0]), Err(WireError::UnknownKind));
        assert_eq!(decode(&[2, 99]), Err(WireError::UnknownKind));
        // A huge count with few bytes behind it is truncated, not an allocation.
        assert_eq!(decode(&[2, 3, 0xff, 0xff, 0, 0]), Err(WireError::Truncated));
        let mut b = encode(&Msg::QuotaSet {
            quota: 1,
            cut: false,
        });
        *b.last_mut().unwrap() = 2;
        assert_eq!(decode(&b), Err(WireError::Malformed));
        // An error grant with nonzero fields, and an unknown error code.
        let mut b = encode(&Msg::Reply {
            req: 1,
            grants: vec![Err(RemoteError::Unmapped)],
            put: None,
        });
        b[10] = 1;
        assert_eq!(decode(&b), Err(WireError::Malformed));
        let mut b = encode(&Msg::Reply {
            req: 1,
            grants: vec![Err(RemoteError::Unmapped)],
            put: None,
        });
        b[9] = 9;
        assert_eq!(decode(&b), Err(WireError::Malformed));
        // Rights: a pin asking for none or an unknown one, a grant with none, an error grant
        // with some.
        for bad in [0u8, 4, 0x83] {
            let mut b = encode(&Msg::Move {
                req: 1,
                releases: vec![],
                pins: vec![PinReq {
                    start: 0,
                    nb: 1,
                    need_off: 0,
                    need_n: 1,
                    rights: Rights::READ,
                }],
                put: None,
            });
            *b.last_mut().unwrap() = bad;
            assert_eq!(decode(&b), Err(WireError::Malformed), "pin rights {bad}");
            let mut b = encode(&Msg::Reply {
                req: 1,
                grants: vec![Ok(Grant {
                    handle: 1,
                    start: 0,
                    nb: 1,
                    rkey: 1,
                    rights: Rights::READ,
                })],
                put: None,
            });
            *b.last_mut().unwrap() = bad;
            assert_eq!(decode(&b), Err(WireError::Malformed), "grant rights {bad}");
        }
        let mut b = encode(&Msg::Reply {
            req: 1,
            grants: vec![Err(RemoteError::Denied)],
            put: None,
        });
        *b.last_mut().unwrap() = 1;
        assert_eq!(decode(&b), Err(WireError::Malformed));
        // A version 1 peer (no rights on the wire) is refused, never misparsed.
        let mut b = encode(&Msg::QuotaAck(1));
        b[0] = 1;
        assert_eq!(decode(&b), Err(WireError::BadVersion));
    }
}
