//! The active-message wire header: 16 bytes in front of every message, little-endian.
//!
//! ```text
//!  0      1        2     3         4..6        6..8       8..12      12..16
//! magic  version  kind  reserved  handler id  credits    token      payload length
//! 0xFA   1        1..5  0         u16         u16        u32        u32
//! ```
//!
//! 16 bytes so that header + a small payload stays inside a verbs inline send. `credits` is the
//! number of receive slots the sender gives back to the receiver (every kind piggybacks them);
//! `token` pairs a reply with its request. Everything a peer sends is untrusted: `decode` checks
//! what it can alone (size, magic, version, kind, fields a kind must leave zero, length); the
//! endpoint checks the rest (handler id, token, finalize) and reports them with the same
//! `Reject` type so every reason is counted on its own. Pure: no I/O, no allocation.

/// Bytes of header in front of every payload.
pub const HEADER_LEN: usize = 16;
/// First byte of every message: a stray or garbage buffer is unlikely to start with it.
pub const MAGIC: u8 = 0xFA;
/// Bumped on any incompatible change; a peer with another version is rejected, not guessed at.
pub(crate) const VERSION: u8 = 1;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Asks for a reply: carries a handler id and the requester's token.
    Request = 1,
    /// Answers a request: carries the request's token, no handler id.
    Reply = 2,
    /// A handler call with no reply.
    OneWay = 3,
    /// Only returns credits (no payload, no handler); sent without a credit, into a reserved slot.
    CreditOnly = 4,
    /// The sender finalized: nothing more comes from it (no payload); sent into a reserved slot.
    Bye = 5,
}

impl Kind {
    /// Number of kinds, for per-kind counters indexed by `index()`.
    pub const COUNT: usize = 5;
    pub const ALL: [Kind; Kind::COUNT] = [
        Kind::Request,
        Kind::Reply,
        Kind::OneWay,
        Kind::CreditOnly,
        Kind::Bye,
    ];

    fn from_u8(b: u8) -> Option<Kind> {
        Kind::ALL.get((b as usize).wrapping_sub(1)).copied()
    }

    /// 0-based index for counter arrays.
    pub fn index(self) -> usize {
        self as usize - 1
    }

    /// Request, reply and one-way hold a credit each (a data slot at the receiver); credit-only
    /// and bye use the slots reserved for them (see `credits`).
    pub(crate) fn uses_credit(self) -> bool {
        matches!(self, Kind::Request | Kind::Reply | Kind::OneWay)
    }
}

/// Why a received message was dropped. Each reason has its own counter in `net::stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reject {
    /// Shorter than a header.
    Truncated,
    BadMagic,
    BadVersion,
    UnknownKind,
    /// The header's payload length disagrees with the received length.
    BadLength,
    /// A field this kind must leave zero is not (reserved byte, a handler id on a reply, a
    /// payload on credit-only/bye, a token on one-way...).
    Malformed,
    /// No handler registered under this id for this kind.
    UnknownHandler,
    /// A reply whose token matches no outstanding request from that peer (stale or forged).
    UnknownToken,
    /// The sender said bye, or this endpoint finalized, before the message arrived.
    AfterFinalize,
}

impl Reject {
    pub const COUNT: usize = 9;

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    /// Handler id (request, one-way); 0 otherwise.
    pub handler: u16,
    /// Credits returned to the receiver of this message.
    pub credits: u16,
    /// Request: the requester's token; reply: the same token back; 0 otherwise.
    pub token: u32,
    /// Bytes of payload after the header.
    pub len: u32,
}

impl Header {
    /// Writes the header into the first `HEADER_LEN` bytes of `out` (panics if shorter: a
    /// caller bug, never peer input).
    pub fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..HEADER_LEN];
        out[0] = MAGIC;
        out[1] = VERSION;
        out[2] = self.kind as u8;
        out[3] = 0;
        out[4..6].copy_from_slice(&self.handler.to_le_bytes());
        out[6..8].copy_from_slice(&self.credits.to_le_bytes());
        out[8..12].copy_from_slice(&self.token.to_le_bytes());
        out[12..16].copy_from_slice(&self.len.to_le_bytes());
    }

    /// Rewrites only the credit field of an encoded message (a queued message gets the credits
    /// owed at the moment it is really sent, not when it was queued).
    pub(crate) fn patch_credits(msg: &mut [u8], credits: u16) {
        msg[6..8].copy_from_slice(&credits.to_le_bytes());
    }

    /// Checks everything a message can be checked for on its own; returns the header and the
    /// payload.
    pub fn decode(msg: &[u8]) -> Result<(Header, &[u8]), Reject> {
        if msg.len() < HEADER_LEN {
            return Err(Reject::Truncated);
        }
        if msg[0] != MAGIC {
            return Err(Reject::BadMagic);
        }
        if msg[1] != VERSION {
            return Err(Reject::BadVersion);
        }
        let kind = Kind::from_u8(msg[2]).ok_or(Reject::UnknownKind)?;
        let u16_at = |i: usize| u16::from_le_bytes([msg[i], msg[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([msg[i], msg[i + 1], msg[i + 2], msg[i + 3]]);
        let h = Header {
            kind,
            handler: u16_at(4),
            credits: u16_at(6),
            token: u32_at(8),
            len: u32_at(12),
        };
        let payload = &msg[HEADER_LEN..];
        if h.len as usize != payload.len() {
            return Err(Reject::BadLength);
        }
        let malformed = msg[3] != 0
            || match kind {
                Kind::Request => false,
                Kind::Reply => h.handler != 0,
                Kind::OneWay => h.token != 0,
                Kind::CreditOnly | Kind::Bye => h.handler != 0 || h.token != 0 || h.len != 0,
            };
        if malformed {
            return Err(Reject::Malformed);
        }
        Ok((h, payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(h: Header, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0; HEADER_LEN + payload.len()];
        h.encode(&mut v);
        v[HEADER_LEN..].copy_from_slice(payload);
        v
    }

    fn req() -> Header {
        Header {
            kind: Kind::Request,
            handler: 7,
            credits: 3,
            token: 0xdead_beef,
            len: 5,
        }
    }

    #[test]
    fn round_trip_every_kind() {
        for kind in Kind::ALL {
            let data: &[u8] = if matches!(kind, Kind::CreditOnly | Kind::Bye) {
                b""
            } else {
                b"hello"
            };
            let h = Header {
                kind,
                handler: if matches!(kind, Kind::Request | Kind::OneWay) {
                    9
                } else {
                    0
                },
                credits: 65535,
                token: if matches!(kind, Kind::Request | Kind::Reply) {
                    42
                } else {
                    0
                },
                len: data.len() as u32,
            };
            let m = msg(h, data);
            assert_eq!(Header::decode(&m), Ok((h, data)));
        }
    }

    #[test]
    fn each_defect_has_its_reason() {
        let good = msg(req(), b"12345");
        assert_eq!(Header::decode(&good[..15]), Err(Reject::Truncated));
        assert_eq!(Header::decode(&[]), Err(Reject::Truncated));
        let mut m = good.clone();
        m[0] ^= 1;
        assert_eq!(Header::decode(&m), Err(Reject::BadMagic));
        let mut m = good.clone();
        m[1] = 2;
        assert_eq!(Header::decode(&m), Err(Reject::BadVersion));
        for k in [0u8, 6, 255] {
            let mut m = good.clone();
            m[2] = k;
            assert_eq!(Header::decode(&m), Err(Reject::UnknownKind));
        }
        assert_eq!(Header::decode(&good[..20]), Err(Reject::BadLength));
        let mut long = good.clone();
        long.push(0);
        assert_eq!(Header::decode(&long), Err(Reject::BadLength));
        let mut m = good.clone();
        m[3] = 1;
        assert_eq!(Header::decode(&m), Err(Reject::Malformed));
        let co = Header {
            kind: Kind::CreditOnly,
            handler: 0,
            credits: 1,
            token: 0,
            len: 1,
        };
        assert_eq!(Header::decode(&msg(co, b"x")), Err(Reject::Malformed));
        let rep = Header {
            kind: Kind::Reply,
            handler: 1,
            ..req()
        };
        assert_eq!(Header::decode(&msg(rep, b"12345")), Err(Reject::Malformed));
    }

    #[test]
    fn patch_credits_changes_only_credits() {
        let mut m = msg(req(), b"12345");
        Header::patch_credits(&mut m, 77);
        let (h, p) = Header::decode(&m).unwrap();
        assert_eq!(
            h,
            Header {
                credits: 77,
                ..req()
            }
        );
        assert_eq!(p, b"12345");
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic the decoder, and whatever it accepts re-encodes to itself.
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            if let Ok((h, p)) = Header::decode(&bytes) {
                proptest::prop_assert_eq!(msg(h, p), bytes);
            }
        }
    }
}
