//! What targets send us: move replies (install firehoses, wake the ops waiting on them, fail
//! them on a remote error, finish a put that rode in the move), revokes (stop using, ack when
//! released), quota changes (adaptive); and a peer declared lost.
//!
//! Ordering assumption (RC, per pair FIFO both ways): a grant always arrives before a revoke of
//! the same region (the target revokes only what it granted, after granting), and our release
//! of a region arrives at the target before our ack could: so a REVOKE for a handle we no
//! longer know means our release is on its way, and is ignored.

use super::{Fh, Initiator, OpState};
use crate::error::{FhError, WireError};
use crate::stats::FirehoseStats;
use crate::wire::{self, Grant, Msg, RemoteError};
use crate::Rank;
use crate::{Event, OpId, Outbox};

impl Initiator {
    pub fn handle_reply(
        &mut self,
        from: Rank,
        req: u32,
        grants: &[Result<Grant, RemoteError>],
        put: Option<Result<(), RemoteError>>,
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) -> Result<(), WireError> {
        let rec = self
            .moves
            .get(&(from, req))
            .ok_or(WireError::UnknownRequest)?;
        if grants.len() != rec.pins.len() || put.is_some() != rec.put_op.is_some() {
            return Err(WireError::UnknownRequest);
        }
        let r = self.r as u64;
        let known = &self.peers[from as usize].by_handle;
        for (i, (g, &pid)) in grants.iter().zip(&rec.pins).enumerate() {
            let Ok(g) = g else { continue };
            let pin = self.pins[pid as usize].as_ref().expect("pin of a move");
            let lo = pin.chunk * r;
            let end = g.start.checked_add(g.nb as u64);
            let ok = g.nb >= 1
                && end.is_some_and(|e| g.start >= lo && e <= lo + r && e >= pin.need_hi)
                && g.start <= pin.need_lo
                && g.rights.covers(pin.rights)
                && !known.contains_key(&g.handle)
                && !grants[..i]
                    .iter()
                    .any(|x| matches!(x, Ok(x) if x.handle == g.handle));
            if !ok {
                return Err(WireError::BadGrant);
            }
        }
        // Valid: apply.
        let rec = self.moves.remove(&(from, req)).expect("checked");
        let mut ready: Vec<OpId> = Vec::new();
        for (g, pid) in grants.iter().zip(rec.pins) {
            let pin = self.pins[pid as usize].take().expect("pin of a move");
            self.pin_free.push(pid);
            let p = &mut self.peers[from as usize];
            if let Some(list) = p.pending.get_mut(&pin.chunk) {
                let kept: Vec<u32> = list.iter().copied().filter(|&x| x != pid).collect();
                list.clear();
                for x in &kept {
                    list.push(*x);
                }
                if list.is_empty() {
                    p.pending.remove(&pin.chunk);
                }
            }
            p.charged -= r;
            match g {
                Ok(g) => {
                    let id = self.install(from, g);
                    for (op, ep) in pin.waiters {
                        let Some(o) = self.ops.get_mut(&op) else {
                            continue;
                        };
                        let OpState::Waiting { outstanding } = &mut o.state else {
                            continue;
                        };
                        if o.epoch != ep {
                            continue;
                        }
                        *outstanding -= 1;
                        o.fhs.push(id);
                        if *outstanding == 0 {
                            ready.push(op);
                        }
                        self.take_ref(id);
                    }
                    // Queued now if no waiter holds it, else at its last release (as fresh:
                    // the uses it was pinned for do not earn it a second chance).
                    if self.fhs[id as usize].refs == 0 {
                        self.links
                            .push_back(&mut self.peers[from as usize].fifo, id);
                    }
                }
                Err(e) => {
                    for (op, ep) in pin.waiters {
                        if self.ops.get(&op).is_some_and(|o| o.epoch == ep) {
                            self.fail_op(op, FhError::Remote(*e));
                        }
                    }
                }
            }
        }
        if let Some(op) = rec.put_op {
            self.ops.remove(&op);
            match put.expect("checked") {
                Ok(()) => self.events.push_back(Event::PutDone { op }),
                Err(e) => {
                    st.failures += 1;
                    self.events.push_back(Event::Failed {
                        op,
                        error: FhError::Remote(e),
                    });
                }
            }
        }
        for op in ready {
            if self.ops.contains_key(&op) {
                self.advance(op, false, out, st);
            }
        }
        self.after_budget_change(from, out, st);
        st.failures += self.take_failures();
        Ok(())
    }

    fn install(&mut self, peer: Rank, g: &Grant) -> u32 {
        let fh = Fh {
            peer,
            start: g.start,
            nb: g.nb,
            rkey: g.rkey,
            refs: 0,
            revoked: false,
            recent: false,
            uses: 0,
            rights: g.rights,
        };
        let id = match self.fh_free.pop() {
            Some(i) => {
                self.fhs[i as usize] = fh;
                self.handles[i as usize] = g.handle;
                i
            }
            None => {
                self.fhs.push(fh);
                self.handles.push(g.handle);
                (self.fhs.len() - 1) as u32
            }
        };
        let p = &mut self.peers[peer as usize];
        p.charged += g.nb as u64;
        p.by_handle.insert(g.handle, id);
        for b in g.start..g.start + g.nb as u64 {
            // Never over a firehose with rights this one lacks (a read pin answered after a
            // write upgrade was asked for): that one keeps serving them.
            match p.map.get(b) {
                Some(old) if !g.rights.covers(self.fhs[old as usize].rights) => {}
                _ => {
                    p.map.insert(b, id);
                }
            }
        }
        // Unused until its waiters take their refs (the caller queues it).
        p.fifo_buckets += g.nb as u64;
        id
    }

    /// Ends op `op` with `error` (drops its holds, leaves the blocked queue).
    pub(crate) fn fail_op(&mut self, op: OpId, error: FhError) {
        let Some(o) = self.ops.remove(&op) else {
            return;
        };
        for &h in o.fhs.iter() {
            self.drop_ref(h);
        }
        if o.state == OpState::Blocked {
            self.peers[o.peer as usize].blocked.retain(|&x| x != op);
        }
        self.failed += 1;
        self.events.push_back(Event::Failed { op, error });
    }

    pub(crate) fn take_failures(&mut self) -> u64 {
        std::mem::take(&mut self.failed)
    }

    pub fn handle_revoke(
        &mut self,
        from: Rank,
        handles: &[u64],
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) {
        for h in handles {
            let Some(&id) = self.peers[from as usize].by_handle.get(h) else {
                continue; // released already: our release counts as the ack
            };
            if self.fhs[id as usize].revoked {
                continue;
            }
            self.fhs[id as usize].revoked = true;
            st.revoked += 1;
            self.unmap(id);
            self.unqueue(id);
            if self.fhs[id as usize].refs == 0 {
                self.peers[from as usize].fifo_buckets -= self.fhs[id as usize].nb as u64;
                self.forget(id, true);
            }
        }
        self.after_budget_change(from, out, st);
    }

    pub fn handle_quota_set(
        &mut self,
        from: Rank,
        quota: u64,
        cut: bool,
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) -> Result<(), WireError> {
        if !self.adaptive {
            return Err(WireError::BadQuota);
        }
        // Only what an honest target sends (`target/quota.rs`) is taken: a raise (no cut) by no
        // more than our wants let it grant (`PeerI::grantable`); a cut, one at a time, to no
        // more than the quota and no less than the floor a target keeps (2 regions, or F if
        // smaller: what an op needs to run at all). Anything else is refused and counted: an
        // unrequested raise would have us pin past the bound of a target that never lent, a cut
        // below the floor would leave our ops blocked for ever. (FIFO per pair: a grant the
        // target made before a cut arrives before it, and it grants nothing while a cut is
        // unsettled, so our quota is the one it cuts from.)
        let r = u64::from(self.r);
        let p = &mut self.peers[from as usize];
        let ok = if cut {
            p.cut.is_none() && quota <= p.quota && quota >= (2 * r).min(self.f)
        } else {
            p.cut.is_none() && quota > p.quota && quota - p.quota <= p.grantable
        };
        if !ok {
            st.bad_quota_sets += 1;
            return Err(WireError::BadQuota);
        }
        if cut {
            p.cut = Some(quota);
        } else {
            p.grantable -= quota - p.quota;
            p.want_sent = false;
        }
        p.quota = quota;
        self.after_budget_change(from, out, st);
        st.failures += self.take_failures();
        Ok(())
    }

    /// A quota cut is acked once our charge fits it; unused firehoses go first.
    pub(crate) fn settle_cut(&mut self, peer: Rank, out: &mut Outbox, st: &mut FirehoseStats) {
        let Some(c) = self.peers[peer as usize].cut else {
            return;
        };
        let rel = self.evict_down_to(peer, c);
        self.send_moves(peer, &rel, &[], None, out, st);
        if self.peers[peer as usize].charged <= c {
            self.peers[peer as usize].cut = None;
            out.push_back((peer, wire::encode(&Msg::QuotaAck(c))));
        }
    }

    /// REVOKE_ACKs owed to `peer`, before anything else goes to it.
    pub(crate) fn flush_acks(&mut self, peer: Rank, out: &mut Outbox) {
        let p = &mut self.peers[peer as usize];
        if p.acks.is_empty() {
            return;
        }
        let acks = std::mem::take(&mut p.acks);
        for chunk in acks.chunks(wire::handles_per_msg(self.max_msg)) {
            out.push_back((peer, wire::encode(&Msg::RevokeAck(chunk.to_vec()))));
        }
    }

    /// `peer` is gone: its unfinished ops fail, its firehoses are dropped (no acks), new ops
    /// to it are refused. Ops already Active stay until released (their RDMA fails).
    pub fn peer_lost(&mut self, peer: Rank, st: &mut FirehoseStats) {
        let p = &mut self.peers[peer as usize];
        if p.lost {
            return;
        }
        p.lost = true;
        p.blocked.clear();
        p.pending.clear();
        p.acks.clear();
        let mut doomed: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, o)| o.peer == peer && o.state != OpState::Active)
            .map(|(&id, _)| id)
            .collect();
        doomed.sort_unstable();
        for op in doomed {
            self.fail_op(op, FhError::PeerLost(peer));
        }
        let reqs: Vec<(Rank, u32)> = self.moves.keys().filter(|k| k.0 == peer).copied().collect();
        for k in reqs {
            let rec = self.moves.remove(&k).expect("listed");
            for pid in rec.pins {
                self.pins[pid as usize] = None;
                self.pin_free.push(pid);
                self.peers[peer as usize].charged -= self.r as u64;
            }
        }
        let ids: Vec<u32> = self.peers[peer as usize]
            .by_handle
            .values()
            .copied()
            .collect();
        for id in ids {
            if self.fhs[id as usize].revoked {
                continue;
            }
            self.fhs[id as usize].revoked = true;
            self.unmap(id);
            self.unqueue(id);
            if self.fhs[id as usize].refs == 0 {
                self.peers[peer as usize].fifo_buckets -= self.fhs[id as usize].nb as u64;
                self.forget(id, false);
            }
        }
        st.failures += self.take_failures();
    }
}
