//! Send state toward one peer, kept under that peer's lock: its credits and pending queue, a
//! reusable send buffer (no allocation per message unless it has to wait for a credit), and
//! whether the connection is gone or either side said bye.

use crate::net::credits::PeerFlow;
use crate::net::stats::Stats;
use crate::net::wire::{Header, Kind, HEADER_LEN};
use crate::net::{Link, LinkError, Rank};

pub(super) struct Peer {
    pub flow: PeerFlow<Vec<u8>>,
    scratch: Vec<u8>,
    /// Queued messages popped for one batch (kept: no allocation per flush).
    batch: Vec<Vec<u8>>,
    /// The link reported the connection gone (or a send found it so).
    pub lost: bool,
    /// The peer finalized: anything more from it is rejected, nothing more goes to it.
    pub got_bye: bool,
    /// We finalized toward it (or gave up on it): nothing more goes to it.
    pub said_bye: bool,
    /// The peer-loss handler was told about it (once: a loss, a goodbye, or giving up).
    pub told_lost: bool,
    /// Bytes of the messages in `flow`'s queue (bounded: `queue_bound`).
    pub queued_bytes: usize,
}

/// Where a message goes out: the link, and the counters.
pub(super) struct Out<'a> {
    pub link: &'a dyn Link,
    pub stats: &'a Stats,
    pub to: Rank,
}

impl Out<'_> {
    fn send(&self, kind: Kind, msg: &[u8]) -> Result<(), LinkError> {
        self.link.send(self.to, msg)?;
        self.stats.sent(kind, msg.len());
        Ok(())
    }

    /// Queued messages (whole, header first) in one link batch.
    fn send_batch(&self, msgs: &[Vec<u8>]) -> Result<(), LinkError> {
        let mut refs: [&[u8]; FLUSH_BATCH] = [&[]; FLUSH_BATCH];
        for (r, m) in refs.iter_mut().zip(msgs) {
            *r = m;
        }
        self.link
            .send_batch(self.to, &refs[..msgs.len().min(FLUSH_BATCH)])?;
        for m in msgs {
            let kind = Header::decode(m).map_or(Kind::OneWay, |(h, _)| h.kind);
            self.stats.sent(kind, m.len());
        }
        Ok(())
    }
}

/// Queued messages sent per link batch when credits come back: one doorbell (with Soft-RoCE
/// one system call) for up to this many instead of one each.
const FLUSH_BATCH: usize = 16;

impl Peer {
    pub(super) fn new(flow: PeerFlow<Vec<u8>>, max_size: usize) -> Peer {
        Peer {
            flow,
            scratch: Vec::with_capacity(max_size),
            batch: Vec::with_capacity(FLUSH_BATCH),
            lost: false,
            got_bye: false,
            said_bye: false,
            told_lost: false,
            queued_bytes: 0,
        }
    }

    /// Drops every queued message (the peer is gone, or we are).
    pub(super) fn drop_queued(&mut self) {
        self.flow.drain_pending().for_each(drop);
        self.queued_bytes = 0;
    }

    /// Nothing may be sent to this peer any more.
    pub(super) fn closed(&self) -> bool {
        self.lost || self.got_bye || self.said_bye
    }

    /// Sends a request, reply or one-way now if a credit is free, else queues it (a stall, counted
    /// by the caller from the return value `Ok(false)`).
    pub(super) fn send_data(
        &mut self,
        out: &Out,
        mut h: Header,
        payload: &[u8],
    ) -> Result<bool, LinkError> {
        debug_assert!(h.kind.uses_credit());
        h.len = payload.len() as u32;
        if !self.flow.try_take() {
            let mut m = vec![0; HEADER_LEN + payload.len()];
            h.encode(&mut m);
            m[HEADER_LEN..].copy_from_slice(payload);
            self.queued_bytes += m.len();
            self.flow.queue(m);
            return Ok(false);
        }
        h.credits = self.flow.take_owed();
        self.scratch.clear();
        self.scratch.resize(HEADER_LEN, 0);
        h.encode(&mut self.scratch);
        self.scratch.extend_from_slice(payload);
        if let Err(e) = out.send(h.kind, &self.scratch) {
            // Never reached the wire: the credit and what we owed are still ours.
            self.flow.unsend();
            self.flow.give_back_owed(h.credits);
            return Err(e);
        }
        Ok(true)
    }

    /// A message from this peer is done with (its slot is free again): apply the credits it gave
    /// back, owe one for it if it held a credit, then send what that made possible: queued
    /// messages, and a credit-only message if we owe at least half the peer's data slots.
    pub(super) fn settle(
        &mut self,
        out: &Out,
        credits: u16,
        held_credit: bool,
    ) -> Result<(), LinkError> {
        if !self.flow.returned(credits as u32) {
            out.stats.excess_credits();
        }
        if held_credit {
            self.flow.handled_data();
        }
        self.flush(out)
    }

    /// Sends queued messages while credits last, then a credit-only message if one is due.
    pub(super) fn flush(&mut self, out: &Out) -> Result<(), LinkError> {
        if self.closed() {
            return Ok(());
        }
        loop {
            self.batch.clear();
            while self.batch.len() < FLUSH_BATCH {
                let Some(mut m) = self.flow.pop_sendable() else {
                    break;
                };
                self.queued_bytes -= m.len();
                // The first of the batch carries all we owe; the others then carry 0.
                let owed = self.flow.take_owed();
                Header::patch_credits(&mut m, owed);
                self.batch.push(m);
            }
            if self.batch.is_empty() {
                break;
            }
            // On error the batch is lost with its credits: the peer is gone (or the device).
            out.send_batch(&self.batch)?;
        }
        if self.flow.wants_credit_only() {
            self.send_control(out, Kind::CreditOnly)?;
        }
        Ok(())
    }

    /// Sends a credit-only or bye message (no credit needed: reserved slots) with all we owe.
    pub(super) fn send_control(&mut self, out: &Out, kind: Kind) -> Result<(), LinkError> {
        let mut m = [0u8; HEADER_LEN];
        let h = Header {
            kind,
            handler: 0,
            credits: self.flow.take_owed(),
            token: 0,
            len: 0,
        };
        h.encode(&mut m);
        out.send(kind, &m)
            .inspect_err(|_| self.flow.give_back_owed(h.credits))
    }
}
