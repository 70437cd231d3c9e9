//! The miss path: what an op still needs, joining pins in flight ("hit pending"), admission of
//! new pins against the quota (evicting unused firehoses, whose releases ride in the move),
//! building the move messages, puts riding in a move, and ops blocked for quota.

use super::{Initiator, OpState, Pin};
use crate::initiator::acquire::push_seg;
use crate::small::Inline2;
use crate::stats::FirehoseStats;
use crate::wire::{self, Msg, PinReq};
use crate::Rank;
use crate::{Event, OpId, Outbox, Rights, Segs};

/// Missing buckets of one chunk: `[lo, hi)`.
#[derive(Debug, Clone, Copy)]
struct Gap {
    chunk: u64,
    lo: u64,
    hi: u64,
}

impl Initiator {
    /// Moves op `id` (Waiting with nothing outstanding, or Blocked) forward: Ready if covered,
    /// else Waiting on pins (joined or new), else Blocked. `from_queue`: it is the head of its
    /// peer's blocked queue (stays there if still blocked). True unless it is (still) blocked.
    pub(crate) fn advance(
        &mut self,
        id: OpId,
        from_queue: bool,
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) -> bool {
        let (peer, raddr, len, rights, mut held) = {
            let o = self.ops.get_mut(&id).expect("live op");
            (o.peer, o.raddr, o.len, o.rights, std::mem::take(&mut o.fhs))
        };
        // Holds on revoked firehoses go (the ack waits for them).
        let mut kept = Inline2::<u32>::default();
        for &h in held.iter() {
            if self.fhs[h as usize].revoked {
                self.drop_ref(h);
            } else {
                kept.push(h);
            }
        }
        held = kept;
        // What is covered (take a hold on it), what is missing (by chunk).
        let r = self.r as u64;
        let (mut b, last) = self.bucket_span(raddr, len);
        let mut gaps: Vec<Gap> = Vec::new();
        while b <= last {
            let mut best: Option<u64> = None;
            for &h in held.iter() {
                let fh = &self.fhs[h as usize];
                let e = fh.start + fh.nb as u64;
                if fh.start <= b && b < e && best.map_or(true, |x| e > x) {
                    best = Some(e);
                }
            }
            if best.is_none() {
                let m = self.peers[peer as usize].map.get(b);
                if let Some(m) = m.filter(|&m| self.fhs[m as usize].rights.covers(rights)) {
                    self.take_use(m);
                    held.push(m);
                    let fh = &self.fhs[m as usize];
                    best = Some(fh.start + fh.nb as u64);
                }
            }
            match best {
                Some(e) => b = e,
                None => {
                    let chunk = b / r;
                    match gaps.last_mut() {
                        Some(g) if g.chunk == chunk => g.hi = b + 1,
                        _ => gaps.push(Gap {
                            chunk,
                            lo: b,
                            hi: b + 1,
                        }),
                    }
                    b += 1;
                }
            }
        }
        if gaps.is_empty() {
            let segs = self.segs_of(raddr, len, &held);
            let o = self.ops.get_mut(&id).expect("live op");
            o.fhs = held;
            o.state = OpState::Active;
            self.events.push_back(Event::Ready { op: id, segs });
            return true;
        }
        // Join pins in flight whose needed run covers the gap; the rest need new pins.
        let mut joins: Vec<u32> = Vec::new();
        let mut new: Vec<Gap> = Vec::new();
        for g in gaps {
            let joined = self.peers[peer as usize]
                .pending
                .get(&g.chunk)
                .and_then(|ps| {
                    ps.iter().copied().find(|&pid| {
                        let pin = self.pins[pid as usize].as_ref().expect("pending pin");
                        pin.need_lo <= g.lo && g.hi <= pin.need_hi && pin.rights.covers(rights)
                    })
                });
            match joined {
                Some(pid) => joins.push(pid),
                None => new.push(g),
            }
        }
        let mut releases = Vec::new();
        if !new.is_empty() {
            // A new pin asks for all of the op's buckets in its chunk, and the op lets go of
            // the smaller regions it holds there: otherwise a small (fallback) region held by
            // the op itself could keep its own admission from ever fitting the quota.
            let (first, last) = self.bucket_span(raddr, len);
            for g in new.iter_mut() {
                g.lo = first.max(g.chunk * r);
                g.hi = (last + 1).min((g.chunk + 1) * r);
            }
            let mut kept = Inline2::<u32>::default();
            for &h in held.iter() {
                let c = self.fhs[h as usize].start / r;
                if new.iter().any(|g| g.chunk == c) {
                    self.drop_ref(h);
                } else {
                    kept.push(h);
                }
            }
            held = kept;
            let need = new.len() as u64 * r;
            let queued_behind = !from_queue && !self.peers[peer as usize].blocked.is_empty();
            if queued_behind || !self.fits(peer, need) {
                // What is missing, counted before the holds go (they are this op's own needs).
                let p = &self.peers[peer as usize];
                let short = (p.charged - p.fifo_buckets + need).saturating_sub(p.quota);
                for &h in held.iter() {
                    self.drop_ref(h);
                }
                let o = self.ops.get_mut(&id).expect("live op");
                o.state = OpState::Blocked;
                o.epoch = o.epoch.wrapping_add(1);
                let p = &mut self.peers[peer as usize];
                if !from_queue {
                    p.blocked.push_back(id);
                }
                if self.adaptive && !queued_behind && !p.want_sent && short > 0 {
                    p.want_sent = true;
                    p.grantable += short + 4 * u64::from(self.r);
                    self.flush_acks(peer, out);
                    out.push_back((peer, wire::encode(&Msg::QuotaWant(short))));
                }
                return false;
            }
            self.ask_for_more(peer, need, out);
            releases = self.evict_for(peer, need);
        }
        let epoch = {
            let o = self.ops.get_mut(&id).expect("live op");
            o.fhs = held;
            o.state = OpState::Waiting {
                outstanding: (joins.len() + new.len()) as u32,
            };
            o.epoch
        };
        if !joins.is_empty() {
            st.hit_pending += 1;
        }
        for pid in joins {
            let pin = self.pins[pid as usize].as_mut().expect("pending pin");
            pin.waiters.push((id, epoch));
        }
        let pins: Vec<(u32, PinReq)> = new
            .iter()
            .map(|g| {
                let want = self.chunk_rights(peer, g.chunk, rights);
                self.new_pin(peer, *g, want, vec![(id, epoch)])
            })
            .collect();
        self.send_moves(peer, &releases, &pins, None, out, st);
        true
    }

    /// The rights a new pin of `chunk` asks for: the op's, plus those of the firehoses and pins
    /// in flight there (an upgrade: a chunk read and then written is pinned for both once, not
    /// alternately for each; a region is never replaced by one with fewer rights).
    fn chunk_rights(&self, peer: Rank, chunk: u64, op: Rights) -> Rights {
        let p = &self.peers[peer as usize];
        let r = self.r as u64;
        let mut want = op;
        for b in chunk * r..(chunk + 1) * r {
            if let Some(m) = p.map.get(b) {
                want = want.union(self.fhs[m as usize].rights);
            }
        }
        if let Some(ps) = p.pending.get(&chunk) {
            for &pid in ps.iter() {
                want = want.union(self.pins[pid as usize].as_ref().expect("pending").rights);
            }
        }
        want
    }

    /// A put that misses rides in a move (never blocks); pins for its uncovered chunks go
    /// along when the quota allows, so later ops there hit.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_in_move(
        &mut self,
        id: OpId,
        peer: Rank,
        raddr: u64,
        rights: Rights,
        data: &[u8],
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) {
        let r = self.r as u64;
        let (first, last) = self.bucket_span(raddr, data.len());
        let mut new: Vec<Gap> = Vec::new();
        let p = &self.peers[peer as usize];
        for b in first..=last {
            let chunk = b / r;
            let covered = p
                .map
                .get(b)
                .is_some_and(|m| self.fhs[m as usize].rights.covers(rights));
            if covered || p.pending.contains_key(&chunk) {
                continue;
            }
            match new.last_mut() {
                Some(g) if g.chunk == chunk => g.hi = b + 1,
                _ => new.push(Gap {
                    chunk,
                    lo: b,
                    hi: b + 1,
                }),
            }
        }
        let need = new.len() as u64 * r;
        let mut releases = Vec::new();
        let mut pins = Vec::new();
        let admissible = !new.is_empty() && p.blocked.is_empty() && self.fits(peer, need);
        if admissible && !self.small_put_pins(peer) {
            st.puts_in_move_unpinned += 1;
        } else if admissible {
            self.ask_for_more(peer, need, out);
            releases = self.evict_for(peer, need);
            pins = new
                .iter()
                .map(|g| {
                    let want = self.chunk_rights(peer, g.chunk, rights);
                    self.new_pin(peer, *g, want, Vec::new())
                })
                .collect();
        }
        let o = super::Op::new(
            peer,
            raddr,
            data.len(),
            rights,
            Inline2::default(),
            OpState::PutInMove,
        );
        self.ops.insert(id, o);
        st.puts_in_move += 1;
        self.send_moves(peer, &releases, &pins, Some((id, raddr, data)), out, st);
        self.flush_acks(peer, out);
    }

    /// Adaptive: `need` more buckets fit only by evicting firehoses we may use again, so ask
    /// the target for more quota (one request outstanding; it grows geometrically).
    fn ask_for_more(&mut self, peer: Rank, need: u64, out: &mut Outbox) {
        let p = &mut self.peers[peer as usize];
        if !self.adaptive || p.want_sent || p.cut.is_some() || p.charged + need <= p.quota {
            return;
        }
        p.want_sent = true;
        let want = need.max(p.quota / 2);
        p.grantable += want + 4 * u64::from(self.r);
        self.flush_acks(peer, out);
        out.push_back((peer, wire::encode(&Msg::QuotaWant(want))));
    }

    /// Could `need` more buckets be reserved, evicting unused firehoses if necessary?
    fn fits(&self, peer: Rank, need: u64) -> bool {
        let p = &self.peers[peer as usize];
        p.charged - p.fifo_buckets + need <= p.quota
    }

    /// Evicts the oldest unused firehoses until `need` more buckets fit; reserves them.
    /// Returns the handles to release (in the move about to be sent).
    fn evict_for(&mut self, peer: Rank, need: u64) -> Vec<u64> {
        let mut rel = Vec::new();
        while {
            let p = &self.peers[peer as usize];
            p.charged + need > p.quota
        } {
            let id = self.pop_unused(peer).expect("fits() was checked");
            rel.push(self.handles[id as usize]);
            self.note_evicted(peer, u32::from(self.fhs[id as usize].uses));
            self.unmap(id);
            self.forget(id, false);
        }
        self.peers[peer as usize].charged += need;
        rel
    }

    /// Evicts unused firehoses while `charged` exceeds `limit` (a quota cut); their handles.
    pub(crate) fn evict_down_to(&mut self, peer: Rank, limit: u64) -> Vec<u64> {
        let mut rel = Vec::new();
        loop {
            if self.peers[peer as usize].charged <= limit {
                break;
            }
            let Some(id) = self.pop_unused(peer) else {
                break;
            };
            rel.push(self.handles[id as usize]);
            self.note_evicted(peer, u32::from(self.fhs[id as usize].uses));
            self.unmap(id);
            self.forget(id, false);
        }
        rel
    }

    fn new_pin(
        &mut self,
        peer: Rank,
        g: Gap,
        rights: Rights,
        waiters: Vec<(OpId, u32)>,
    ) -> (u32, PinReq) {
        let r = self.r as u64;
        let start = g.chunk * r;
        let pin = Pin {
            chunk: g.chunk,
            need_lo: g.lo,
            need_hi: g.hi,
            rights,
            waiters,
        };
        let pid = match self.pin_free.pop() {
            Some(i) => {
                self.pins[i as usize] = Some(pin);
                i
            }
            None => {
                self.pins.push(Some(pin));
                (self.pins.len() - 1) as u32
            }
        };
        self.peers[peer as usize]
            .pending
            .entry(g.chunk)
            .or_default()
            .push(pid);
        let req = PinReq {
            start,
            nb: self.r,
            need_off: (g.lo - start) as u32,
            need_n: (g.hi - g.lo) as u32,
            rights,
        };
        (pid, req)
    }

    /// Packs releases, pins and a put into as few move messages as `max_msg` allows; the put
    /// rides in the last. Messages that expect a reply are recorded by request id.
    pub(crate) fn send_moves(
        &mut self,
        peer: Rank,
        releases: &[u64],
        pins: &[(u32, PinReq)],
        put: Option<(OpId, u64, &[u8])>,
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) {
        self.flush_acks(peer, out);
        if releases.is_empty() && pins.is_empty() && put.is_none() {
            return;
        }
        let per_move = wire::pins_per_move(self.max_msg);
        let (mut ri, mut pi) = (0, 0);
        let mut put = put;
        loop {
            let mut room = self.max_msg - wire::MOVE_FIXED;
            let nrel = (releases.len() - ri).min(room / wire::RELEASE_LEN);
            room -= nrel * wire::RELEASE_LEN;
            let npin = (pins.len() - pi).min(room / wire::PIN_LEN).min(per_move);
            room -= npin * wire::PIN_LEN;
            let rest_done = ri + nrel == releases.len() && pi + npin == pins.len();
            let this_put = match put {
                Some((_, _, d)) if rest_done && room >= wire::PUT_FIXED + d.len() => put.take(),
                _ => None,
            };
            let req = if npin > 0 || this_put.is_some() {
                let p = &mut self.peers[peer as usize];
                p.last_req = p.last_req.wrapping_add(1).max(1);
                let req = p.last_req;
                self.moves.insert(
                    (peer, req),
                    super::MoveRec {
                        pins: pins[pi..pi + npin].iter().map(|&(id, _)| id).collect(),
                        put_op: this_put.map(|(op, _, _)| op),
                    },
                );
                req
            } else {
                0
            };
            let m = Msg::Move {
                req,
                releases: releases[ri..ri + nrel].to_vec(),
                pins: pins[pi..pi + npin].iter().map(|&(_, p)| p).collect(),
                put: this_put.map(|(_, a, d)| (a, d)),
            };
            out.push_back((peer, wire::encode(&m)));
            st.moves_sent += 1;
            ri += nrel;
            pi += npin;
            if ri == releases.len() && pi == pins.len() && put.is_none() {
                break;
            }
        }
    }

    /// Segments of `[raddr, raddr + len)` through the firehoses `held` (which cover it).
    pub(crate) fn segs_of(&self, raddr: u64, len: usize, held: &[u32]) -> Segs {
        let end = raddr + len as u64;
        let (mut b, last) = self.bucket_span(raddr, len);
        let mut cur = raddr;
        let mut segs = Segs::default();
        loop {
            let (fh_end, rkey) = held
                .iter()
                .map(|&h| &self.fhs[h as usize])
                .filter(|fh| fh.start <= b && b < fh.start + fh.nb as u64)
                .map(|fh| (fh.start + fh.nb as u64, fh.rkey))
                .max_by_key(|&(e, _)| e)
                .expect("held firehoses cover the op");
            let seg_end = if fh_end > last {
                end
            } else {
                fh_end << self.shift
            };
            push_seg(&mut segs, cur, seg_end, rkey);
            if fh_end > last {
                return segs;
            }
            b = fh_end;
            cur = seg_end;
        }
    }

    /// Something freed quota at `peer`: acks out, a pending cut settled, blocked ops retried.
    pub(crate) fn after_budget_change(
        &mut self,
        peer: Rank,
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) {
        self.flush_acks(peer, out);
        self.settle_cut(peer, out, st);
        while let Some(&id) = self.peers[peer as usize].blocked.front() {
            if !self.ops.contains_key(&id) || self.advance(id, true, out, st) {
                self.peers[peer as usize].blocked.pop_front();
            } else {
                break;
            }
        }
        self.flush_acks(peer, out);
    }
}
