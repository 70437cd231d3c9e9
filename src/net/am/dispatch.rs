//! The receive side: `progress` polls the link, checks every message (it is untrusted), runs
//! handlers with no lock held, and settles credits once a message's slot is free again.
//! Also loopback delivery and finalize.

use super::endpoint::{map_link_err, Inner};
use super::handlers::Handler;
use super::replier::Replier;
use crate::net::wire::{Header, Kind, Reject, HEADER_LEN};
use crate::net::NetError;
use crate::net::{LinkError, LinkEvent, Rank};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What a handled message does to credits, applied only after the link reposted its slot
/// (applying earlier would let us, or the peer, count a slot that is still occupied; the bound in
/// `credits` relies on this order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Settle {
    peer: Rank,
    credits: u16,
    held_credit: bool,
}

/// `Settle::pack`'s mark: a packed settle is never 0.
const PACKED: u64 = 1 << 63;

impl Settle {
    /// In one word, never 0: peer in bits 0..32, credits in 32..48, held credit at 48.
    fn pack(self) -> u64 {
        PACKED
            | u64::from(self.peer)
            | u64::from(self.credits) << 32
            | u64::from(self.held_credit) << 48
    }

    fn unpack(w: u64) -> Settle {
        Settle {
            peer: w as u32,
            credits: (w >> 32) as u16,
            held_credit: w & 1 << 48 != 0,
        }
    }
}

impl Inner {
    /// Inlined into its callers (`Am::progress`, the progress thread): the poll of every wait.
    #[inline(always)]
    pub(super) fn progress(&self) -> Result<usize, NetError> {
        let mut n = self.run_loopback();
        // The credit effects of the last message handled (`Settle::pack`; 0: none): one word,
        // one test per event on the path every RDMA completion takes.
        let mut done = 0u64;
        // SAFETY: `link_obj` is `self.link`'s object, which lives as long as `self`.
        let link = unsafe { self.link_obj.get() };
        let polled = link.poll(&mut |ev| {
            // The previous event's callback returned: its slot is posted again.
            if done != 0 {
                self.settle(Settle::unpack(std::mem::take(&mut done)));
            }
            match ev {
                LinkEvent::Recv { peer, data } => {
                    if let Some(s) = self.on_message(peer, data) {
                        done = s.pack();
                    }
                }
                LinkEvent::PeerLost { peer, .. } => self.lose(peer),
                LinkEvent::RdmaDone {
                    peer,
                    token,
                    result,
                } => self.on_rdma_done(peer, token, result),
            }
        });
        if done != 0 {
            self.settle(Settle::unpack(done));
        }
        n += polled.map_err(|e| map_link_err(&e))?;
        Ok(n)
    }

    /// Passes an RDMA completion up (the link reports each op once; so does this). Without a
    /// handler it is counted and dropped: nobody above posted RDMA through this link.
    fn on_rdma_done(&self, peer: Rank, token: u64, result: Result<(), LinkError>) {
        self.stats.rdma_done(result.is_ok());
        self.handlers.call_rdma(peer, token, result);
    }

    /// Delivers the messages to the own rank that were queued when this call began (not those
    /// its handlers queue: a handler that requests itself cannot make progress loop forever).
    #[inline]
    fn run_loopback(&self) -> usize {
        if self.loopback_len.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.run_loopback_queued()
    }

    /// `run_loopback` with something queued (out of line: the poll loop stays short).
    #[inline(never)]
    fn run_loopback_queued(&self) -> usize {
        let lock = || self.loopback.lock().unwrap_or_else(|e| e.into_inner());
        let queued = lock().len();
        for _ in 0..queued {
            let Some(m) = lock().pop_front() else {
                return queued;
            };
            self.loopback_len.fetch_sub(1, Ordering::AcqRel);
            match self.deliver(self.rank, m.header, &m.payload) {
                Ok(()) => self
                    .stats
                    .received(m.header.kind, HEADER_LEN + m.payload.len()),
                Err(r) => self.stats.rejected(r),
            }
        }
        queued
    }

    /// Checks and handles one message from the link; returns its credit effects, if any. (Out of
    /// line: the poll closure that calls it also carries every RDMA completion.)
    #[inline(never)]
    fn on_message(&self, from: Rank, data: &[u8]) -> Option<Settle> {
        let (h, payload) = match Header::decode(data) {
            Ok(x) => x,
            Err(r) => {
                // Garbage: its credit field cannot be trusted, so nothing is settled.
                self.stats.rejected(r);
                return None;
            }
        };
        let (lost, got_bye) = {
            let p = self.peer(from);
            (p.lost, p.got_bye)
        };
        if lost {
            return None; // nothing arrives after PeerLost; a link that says otherwise is ignored
        }
        let finalized = self.finalized.load(Ordering::Acquire);
        if got_bye || (finalized && h.kind.uses_credit()) {
            self.stats.rejected(Reject::AfterFinalize);
            return None;
        }
        let settle = Settle {
            peer: from,
            credits: h.credits,
            held_credit: h.kind.uses_credit(),
        };
        match h.kind {
            Kind::CreditOnly => {}
            Kind::Bye => {
                self.stats.received(h.kind, data.len());
                self.on_bye(from);
                return None;
            }
            _ => {
                if let Err(r) = self.deliver(from, h, payload) {
                    // A well-formed message the sender paid a credit for: still settled, or a
                    // peer that raced its handler registration would lose credits for good.
                    self.stats.rejected(r);
                    if r == Reject::UnknownHandler
                        && !self.warned_no_handler.swap(true, Ordering::Relaxed)
                    {
                        // Once per endpoint: whoever waits for this message's effect will wait
                        // until its bound, and this line says why.
                        crate::fh_warn!(
                            "firehose: rank {}: a message from rank {from} for handler {:#06x} arrived before any handler was registered for it; dropped (further ones only counted)",
                            self.rank,
                            h.handler
                        );
                    }
                    return Some(settle);
                }
            }
        }
        self.stats.received(h.kind, data.len());
        Some(settle)
    }

    /// Runs the handler of a request or one-way message, or completes the ticket of a reply.
    fn deliver(&self, from: Rank, h: Header, payload: &[u8]) -> Result<(), Reject> {
        match h.kind {
            Kind::Request => match self.handlers.get(h.handler) {
                Some(Handler::Request(f)) => {
                    let r = Replier {
                        inner: self.me.clone(),
                        peer: from,
                        token: h.token,
                    };
                    f(from, payload, r);
                    Ok(())
                }
                _ => Err(Reject::UnknownHandler),
            },
            Kind::OneWay => match self.handlers.get(h.handler) {
                Some(Handler::OneWay(f)) => {
                    f(from, payload);
                    Ok(())
                }
                _ => Err(Reject::UnknownHandler),
            },
            Kind::Reply => {
                if self.tickets.complete(h.token, from, payload) {
                    Ok(())
                } else {
                    Err(Reject::UnknownToken)
                }
            }
            Kind::CreditOnly | Kind::Bye => Ok(()),
        }
    }

    #[inline(never)]
    fn settle(&self, s: Settle) {
        let mut p = self.peer(s.peer);
        if p.lost {
            return;
        }
        let r = p.settle(&self.out(s.peer), s.credits, s.held_credit);
        drop(p);
        if let Err(LinkError::PeerLost(_)) = r {
            self.lose(s.peer);
        }
    }

    /// The peer finalized: nothing more to or from it; its outstanding requests fail, and so,
    /// through the peer-loss handler, does what the layer above waits on it for (Firehose's
    /// moves would otherwise wait for a probe, which a live peer that left never fails).
    fn on_bye(&self, from: Rank) {
        let mut p = self.peer(from);
        p.got_bye = true;
        p.drop_queued();
        drop(p);
        self.tickets.fail_peer(Some(from), NetError::PeerLost);
        self.tell_lost(from);
    }

    pub(super) fn finalize(&self) -> Result<(), NetError> {
        if self.finalized.load(Ordering::Acquire) {
            return Ok(());
        }
        // Give queued messages a chance to leave (bounded: a peer that never returns credits
        // must not hang finalize).
        let until = Instant::now() + self.settings.probe.min(Duration::from_secs(1));
        while self.any_pending() && Instant::now() < until {
            self.progress()?;
            std::thread::yield_now();
        }
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        for r in (0..self.size).filter(|&r| r != self.rank) {
            let mut p = self.peer(r);
            p.drop_queued();
            if !p.closed() {
                // Best effort: a peer we cannot reach does not need to hear it.
                let _ = p.send_control(&self.out(r), Kind::Bye);
            }
            p.said_bye = true;
        }
        self.tickets.fail_peer(None, NetError::Finalized);
        Ok(())
    }

    fn any_pending(&self) -> bool {
        (0..self.size).filter(|&r| r != self.rank).any(|r| {
            let p = self.peer(r);
            !p.closed() && p.flow.pending_len() > 0
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settle_packs_into_a_non_zero_word_and_back() {
        for (peer, credits, held_credit) in
            [(0, 0, false), (u32::MAX, u16::MAX, true), (7, 3, false)]
        {
            let s = Settle {
                peer,
                credits,
                held_credit,
            };
            assert_ne!(s.pack(), 0);
            assert_eq!(Settle::unpack(s.pack()), s);
        }
    }
}
