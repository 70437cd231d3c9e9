//! Credit flow control toward one peer, as pure state (no locks, no I/O): the endpoint keeps one
//! `PeerFlow` per peer under that peer's lock and does the sends it decides on.
//!
//! A link has `S = recv_slots` receive slots per sender and no flow control of its own, so no
//! rank may ever have more than `S` of its messages occupying slots at one peer (in flight,
//! arrived, or being handled). The slots are split:
//! - `D = S - RESERVED` data slots: a request, reply or one-way takes one *credit*; the receiver
//!   gives it back (piggybacked on any later message, or explicitly) once the slot is free again.
//! - `RESERVED_CREDIT_ONLY = 2` slots for credit-only messages, which take no credit and are
//!   never given back: their slot is free again as soon as they are handled.
//! - `RESERVED_BYE = 1` slot for the one bye a rank ever sends to a peer.
//!
//! # Bound: at most 2 credit-only messages from A ever occupy slots at B
//!
//! A sends a credit-only message only when it owes B at least `T = ceil(D/2)` credits, and every
//! message A sends gives back everything it owes, so every credit-only message carries >= T
//! credits, and the counter restarts from 0 after each. Let U be A's messages whose credits B has
//! not applied yet; the endpoint applies a message's credits only after its slot is free again,
//! so every message still occupying a slot at B is in U. Say k credit-only messages are in U: they
//! carry >= kT credits. A owes (and so gives back) one credit per data message it received from
//! B, and B can have sent at most D + (credits B has applied) data messages (it starts with D and
//! gains only what it applied). Writing R_all for all credits A gave back and R_U for those in U:
//! R_all <= D + (R_all - R_U), so kT <= R_U <= D, so k <= D / ceil(D/2) <= 2. With data messages
//! bounded by D credits and one bye, at most D + 2 + 1 = S of A's messages occupy slots at B:
//! no overrun, also when both sides only send one-way messages and never reply (then credits
//! travel back only through credit-only messages, and those never wait for a credit, so a
//! stalled sender is always unblocked once its peer calls progress).
//!
//! A message that finds no credit, or finds others already waiting, is queued here (FIFO per
//! peer, so one thread's messages stay in order) and counted as a stall; the queue drains as
//! credits come back.

use std::collections::VecDeque;

/// Slots per peer reserved for credit-only messages (see the bound above).
pub(crate) const RESERVED_CREDIT_ONLY: u32 = 2;
/// The slot per peer reserved for the bye at finalize.
pub(crate) const RESERVED_BYE: u32 = 1;
/// All reserved slots; a link needs at least one more (one data slot) per peer.
pub const RESERVED: u32 = RESERVED_CREDIT_ONLY + RESERVED_BYE;

/// What `PeerFlow::admit` decided for a message.
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, PartialEq, Eq)]
pub enum Admit<M> {
    /// A credit was taken: send it now (with `take_owed()` piggybacked).
    SendNow(M),
    /// No credit, or older messages wait first: it was queued (a credit stall).
    Queued,
}

/// Credits and the pending queue toward one peer.
#[derive(Debug)]
pub struct PeerFlow<M> {
    /// Data credits we hold: free data slots at the peer that are ours to fill.
    credits: u32,
    /// `D`: data credits at start; what we hold + what is outstanding always equals it.
    data_slots: u32,
    /// Data messages from the peer we handled and have not given back yet.
    owed: u32,
    /// Owing this much triggers a credit-only message: `ceil(D/2)`.
    threshold: u32,
    pending: VecDeque<M>,
    stalls: u64,
}

impl<M> PeerFlow<M> {
    /// Flow toward a peer that keeps `recv_slots` slots for us. `None` if fewer than
    /// `RESERVED + 1` (no data slot would remain), or too many for the 16-bit credit field.
    pub fn new(recv_slots: u32) -> Option<Self> {
        if recv_slots <= RESERVED || recv_slots > u16::MAX as u32 {
            return None;
        }
        let d = recv_slots - RESERVED;
        Some(PeerFlow {
            credits: d,
            data_slots: d,
            owed: 0,
            threshold: d.div_ceil(2),
            pending: VecDeque::new(),
            stalls: 0,
        })
    }

    /// A message that needs a credit: sendable now, or queued behind others / for lack of credit.
    #[cfg(any(test, feature = "test-support"))]
    pub fn admit(&mut self, m: M) -> Admit<M> {
        if self.try_take() {
            Admit::SendNow(m)
        } else {
            self.queue(m);
            Admit::Queued
        }
    }

    /// Takes a credit if one is free and nothing waits before us (`admit` without building the
    /// message first, so the common path does not allocate one).
    pub(crate) fn try_take(&mut self) -> bool {
        if self.pending.is_empty() && self.credits > 0 {
            self.credits -= 1;
            true
        } else {
            false
        }
    }

    /// Queues a message `try_take` refused: a credit stall.
    pub fn queue(&mut self, m: M) {
        self.pending.push_back(m);
        self.stalls += 1;
    }

    /// The oldest queued message, if a credit is free for it (the credit is taken).
    pub(crate) fn pop_sendable(&mut self) -> Option<M> {
        if self.credits > 0 {
            let m = self.pending.pop_front()?;
            self.credits -= 1;
            Some(m)
        } else {
            None
        }
    }

    /// The peer gave back `n` credits. More than are outstanding is a peer bug: clamped, and
    /// reported (`false`) so it can be counted.
    pub fn returned(&mut self, n: u32) -> bool {
        let room = self.data_slots - self.credits;
        self.credits += n.min(room);
        n <= room
    }

    /// A data message from the peer was handled and its slot is free again: we owe it a credit.
    pub(crate) fn handled_data(&mut self) {
        self.owed += 1;
    }

    /// Everything owed, for the credit field of a message being sent now.
    pub(crate) fn take_owed(&mut self) -> u16 {
        // owed <= D < 2^16: a peer can only fill the data slots its credits allow; a peer that
        // overruns is clamped here rather than wrapping.
        let n = self.owed.min(u16::MAX as u32) as u16;
        self.owed -= n as u32;
        n
    }

    /// Credits taken by `take_owed` for a message that then failed to reach the wire.
    pub(crate) fn give_back_owed(&mut self, n: u16) {
        self.owed += n as u32;
    }

    /// Whether to send a credit-only message now: we owe at least half the data slots.
    pub(crate) fn wants_credit_only(&self) -> bool {
        self.owed >= self.threshold
    }

    /// A send that had taken a credit failed before reaching the wire: the credit is ours again.
    pub(crate) fn unsend(&mut self) {
        self.credits = (self.credits + 1).min(self.data_slots);
    }

    /// Empties the queue (peer lost or finalized) so the caller can fail what was in it.
    pub(crate) fn drain_pending(&mut self) -> impl Iterator<Item = M> + '_ {
        self.pending.drain(..)
    }

    #[cfg(any(test, feature = "test-support"))]
    pub fn credits(&self) -> u32 {
        self.credits
    }
    pub(crate) fn pending_len(&self) -> usize {
        self.pending.len()
    }
    /// Messages that found no credit, since creation.
    #[cfg(any(test, feature = "test-support"))]
    pub fn stalls(&self) -> u64 {
        self.stalls
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[test]
    fn needs_a_data_slot_and_fits_the_wire() {
        assert!(PeerFlow::<()>::new(RESERVED).is_none());
        assert!(PeerFlow::<()>::new(65536).is_none());
        let f = PeerFlow::<()>::new(RESERVED + 1).unwrap();
        assert_eq!((f.credits(), f.threshold), (1, 1));
        let f = PeerFlow::<()>::new(32).unwrap();
        assert_eq!((f.credits(), f.threshold), (29, 15));
    }

    #[test]
    fn queue_keeps_order_and_drains_on_return() {
        let mut f = PeerFlow::new(RESERVED + 2).unwrap();
        assert_eq!(f.admit(1), Admit::SendNow(1));
        assert_eq!(f.admit(2), Admit::SendNow(2));
        assert_eq!(f.admit(3), Admit::Queued);
        assert_eq!(f.admit(4), Admit::Queued);
        assert_eq!(f.stalls(), 2);
        assert_eq!(f.pop_sendable(), None);
        assert!(f.returned(1));
        assert_eq!(f.pop_sendable(), Some(3));
        assert_eq!(f.pop_sendable(), None);
        // A new message waits behind the queued one even when a credit is back.
        assert!(f.returned(1));
        assert_eq!(f.admit(5), Admit::Queued);
        assert_eq!(f.pop_sendable(), Some(4));
        assert!(!f.returned(5), "more than outstanding is reported");
        assert_eq!(f.credits(), 2);
    }

    #[test]
    fn owed_threshold_is_half() {
        let mut f = PeerFlow::<()>::new(RESERVED + 4).unwrap();
        f.handled_data();
        assert!(!f.wants_credit_only());
        f.handled_data();
        assert!(f.wants_credit_only());
        assert_eq!(f.take_owed(), 2);
        assert!(!f.wants_credit_only());
    }

    /// A message in the model's network: its credits, and whether it is credit-only.
    #[derive(Clone, Copy, Debug)]
    struct Wire {
        credits: u16,
        data: bool,
    }

    /// One side of a two-rank model that follows the endpoint's rules exactly.
    struct Side {
        flow: PeerFlow<()>,
        /// Messages in flight toward the other side (FIFO, as RC) and arrived-but-unhandled.
        to_peer: VecDeque<Wire>,
        sent_data: u64,
    }

    /// The model's sender: piggyback, then a credit-only message when owed >= T.
    fn flush(s: &mut Side) {
        while s.flow.pop_sendable().is_some() {
            let c = s.flow.take_owed();
            s.to_peer.push_back(Wire {
                credits: c,
                data: true,
            });
            s.sent_data += 1;
        }
        if s.flow.wants_credit_only() {
            let c = s.flow.take_owed();
            s.to_peer.push_back(Wire {
                credits: c,
                data: false,
            });
        }
    }

    proptest! {
        /// Both sides send only one-way messages in random bursts, handle in random order of
        /// sides: slots occupied at a receiver never exceed S - 1 (bye not used), credit-only
        /// messages occupying slots never exceed 2, and everything queued is eventually sent.
        #[test]
        fn one_way_both_ways_never_overruns(
            slots in (RESERVED + 1)..40u32,
            ops in proptest::collection::vec((0u8..4, 1u8..8), 1..400),
        ) {
            let mk = || Side { flow: PeerFlow::new(slots).unwrap(), to_peer: VecDeque::new(), sent_data: 0 };
            let mut sides = [mk(), mk()];
            let mut wanted = [0u64; 2];
            let check = |sides: &[Side; 2]| -> Result<(), TestCaseError> {
                for s in sides {
                    prop_assert!(s.to_peer.len() as u32 <= slots - RESERVED_BYE);
                    let ctl = s.to_peer.iter().filter(|w| !w.data).count() as u32;
                    prop_assert!(ctl <= RESERVED_CREDIT_ONLY);
                    let data = s.to_peer.iter().filter(|w| w.data).count() as u32;
                    prop_assert!(data <= slots - RESERVED);
                }
                Ok(())
            };
            for (op, n) in ops {
                let i = (op & 1) as usize;
                if op < 2 {
                    // Side i wants to send n one-way messages.
                    for _ in 0..n {
                        wanted[i] += 1;
                        if let Admit::SendNow(()) = sides[i].flow.admit(()) {
                            let c = sides[i].flow.take_owed();
                            sides[i].to_peer.push_back(Wire { credits: c, data: true });
                            sides[i].sent_data += 1;
                        }
                    }
                } else {
                    // Side i handles up to n messages from the other side; each one's credits
                    // are applied after its slot is free (popped), then side i flushes.
                    let j = 1 - i;
                    for _ in 0..n {
                        let Some(w) = sides[j].to_peer.pop_front() else { break };
                        prop_assert!(sides[i].flow.returned(w.credits as u32));
                        if w.data {
                            sides[i].flow.handled_data();
                        }
                        flush(&mut sides[i]);
                    }
                }
                check(&sides)?;
            }
            // Liveness: alternate handling until both queues are empty.
            for _ in 0..10_000 {
                if sides.iter().all(|s| s.to_peer.is_empty() && s.flow.pending_len() == 0) {
                    break;
                }
                for i in 0..2 {
                    let j = 1 - i;
                    if let Some(w) = sides[j].to_peer.pop_front() {
                        prop_assert!(sides[i].flow.returned(w.credits as u32));
                        if w.data {
                            sides[i].flow.handled_data();
                        }
                    }
                    flush(&mut sides[i]);
                    check(&sides)?;
                }
            }
            prop_assert_eq!(sides[0].sent_data, wanted[0]);
            prop_assert_eq!(sides[1].sent_data, wanted[1]);
        }
    }
}
