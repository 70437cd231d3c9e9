//! The hot path: `acquire` on a hit and `release`, plus the refcount helpers everything uses.

use super::{Front, Initiator, Op, OpState};
use crate::error::FhError;
use crate::small::Inline2;
use crate::stats::FirehoseStats;
use crate::Rank;
use crate::{Acquire, OpId, Outbox, Rights, Seg, Segs};

/// Appends `[cur, seg_end)` with `rkey`, merged into the previous segment when contiguous with
/// the same key.
#[inline]
pub(crate) fn push_seg(segs: &mut Segs, cur: u64, seg_end: u64, rkey: u32) {
    if let Some(prev) = segs.last_mut() {
        if prev.rkey == rkey && prev.raddr + prev.len as u64 == cur {
            prev.len += (seg_end - cur) as usize;
            return;
        }
    }
    segs.push(Seg {
        raddr: cur,
        len: (seg_end - cur) as usize,
        rkey,
    });
}

impl Initiator {
    /// Checks the op, takes the common hit (one region covers it) here, inlined into the
    /// caller, and leaves everything else to `acquire_rest`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn acquire(
        &mut self,
        op: OpId,
        peer: Rank,
        raddr: u64,
        len: usize,
        rights: Rights,
        small_put: Option<&[u8]>,
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) -> Result<Acquire, FhError> {
        // Valid rights are 1..=3: one compare on the hit path (the small put's check is a miss's).
        if rights.0.wrapping_sub(1) > 2 {
            return Err(FhError::BadRights);
        }
        if len == 0 {
            return Err(FhError::ZeroLength);
        }
        let end = raddr.checked_add(len as u64).ok_or(FhError::Overflow)?;
        let Some(p) = self.peers.get(peer as usize) else {
            return Err(FhError::BadRank(peer));
        };
        if peer == self.me {
            return Err(FhError::SelfRank);
        }
        if len > self.max_op_len {
            return Err(FhError::TooLong {
                max: self.max_op_len,
            });
        }
        if small_put.is_some_and(|d| d.len() != len) {
            return Err(FhError::PutLength);
        }
        if small_put.is_some() && !rights.covers(Rights::WRITE) {
            return Err(FhError::BadRights);
        }
        if p.lost {
            return Err(FhError::PeerLost(peer));
        }
        // Hit path: one map lookup per region spanned. The duplicate-op check follows it
        // (nothing has changed yet); on a hit it skips the table while the table is empty.
        let (b, last) = self.bucket_span(raddr, len);
        let next = p.map.get(b);
        // The common hit: one region covers the whole op. One segment, one reference, no lists
        // built (the loop below would find the same with more bookkeeping).
        if let Some(id) = next {
            let fh = &self.fhs[id as usize];
            if fh.start + fh.nb as u64 > last && fh.rights.covers(rights) {
                let rkey = fh.rkey;
                if self.front.op == Some(op) || (!self.ops.is_empty() && self.ops.contains_key(&op))
                {
                    return Err(FhError::DuplicateOp);
                }
                self.take_use(id);
                if self.front.op.is_none() {
                    self.front = Front::new(op, peer, [id, id], 1);
                } else {
                    let fhs = Inline2::one(id);
                    let o = Op::new(peer, raddr, len, rights, fhs, OpState::Active);
                    self.ops.insert(op, o);
                }
                st.hits += 1;
                return Ok(Acquire::Hit(Segs::one(Seg { raddr, len, rkey })));
            }
        }
        let found = (last, next, end);
        self.acquire_rest(op, peer, raddr, len, rights, small_put, found, out, st)
    }

    /// The common hit alone, for a driver's fast path (`Firehose::acquire_hit`): one firehose
    /// covers the whole op with its rights and the front slot is free. Takes what `acquire`'s
    /// hit takes (a use, the front slot) and returns the one segment; anything else (a bad
    /// argument, a lost peer, a duplicate id, a miss, a hit over several regions, the front
    /// slot taken) returns `None` having changed nothing, for `acquire` to handle.
    #[inline(always)]
    pub fn acquire_hit(
        &mut self,
        op: OpId,
        peer: Rank,
        raddr: u64,
        len: usize,
        rights: Rights,
    ) -> Option<Seg> {
        // `len - 1 < max_op_len`: not zero and not too long, one compare.
        if self.front.op.is_some()
            || rights.0.wrapping_sub(1) > 2
            || len.wrapping_sub(1) >= self.max_op_len
            || peer == self.me
        {
            return None;
        }
        raddr.checked_add(len as u64)?;
        let (b, last) = self.bucket_span(raddr, len);
        // The peer and the firehose are looked up once: `take_use` written out on them (the
        // firehose is the peer's, as every entry of its bucket map).
        let p = self.peers.get_mut(peer as usize)?;
        if p.lost {
            return None;
        }
        let id = p.map.get(b)?;
        let fh = &mut self.fhs[id as usize];
        if fh.start + fh.nb as u64 <= last || !fh.rights.covers(rights) {
            return None;
        }
        if !self.ops.is_empty() && self.ops.contains_key(&op) {
            return None;
        }
        debug_assert_eq!(fh.peer, peer);
        fh.refs += 1;
        if fh.refs == 1 {
            p.fifo_buckets -= fh.nb as u64;
        }
        // Saturating (as `saturating_add`, in fewer instructions).
        fh.uses += u8::from(fh.uses != u8::MAX);
        let rkey = fh.rkey;
        self.front = Front::new(op, peer, [id, id], 1);
        Some(Seg { raddr, len, rkey })
    }

    /// `release(old)` then `acquire_hit(op, ...)` in one, when `old` holds the front slot alone
    /// on one firehose and `op` hits that same firehose alone, with nothing waiting for the
    /// release: the reference passes from `old` to `op` (what the two calls leave: the
    /// firehose marked recently used if `old` held its last reference, one more use, a hit
    /// counted by the caller). Anything else returns `None` having changed nothing: make the
    /// two calls.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn pass_front(
        &mut self,
        old: OpId,
        op: OpId,
        peer: Rank,
        raddr: u64,
        len: usize,
        rights: Rights,
    ) -> Option<Seg> {
        let Front {
            op: held, n, ids, ..
        } = self.front;
        // (Not this rank: the firehose found below is `old`'s, on another rank.)
        if held != Some(old)
            || n != 1
            || rights.0.wrapping_sub(1) > 2
            || len.wrapping_sub(1) >= self.max_op_len
        {
            return None;
        }
        raddr.checked_add(len as u64)?;
        let (b, last) = self.bucket_span(raddr, len);
        let p = self.peers.get(peer as usize)?;
        // `old`'s release would do more than drop its reference (`release`'s common case).
        if p.lost || !p.blocked.is_empty() || p.cut.is_some() || !p.acks.is_empty() {
            return None;
        }
        let id = p.map.get(b)?;
        if id != ids[0] || !self.links.is_linked(id) {
            return None;
        }
        let fh = &mut self.fhs[id as usize];
        // (Not revoked: a revoked firehose leaves the bucket map.)
        if fh.start + fh.nb as u64 <= last || !fh.rights.covers(rights) {
            return None;
        }
        if !self.ops.is_empty() && self.ops.contains_key(&op) {
            return None;
        }
        debug_assert!(fh.peer == peer && !fh.revoked && peer != self.me);
        if fh.refs == 1 {
            fh.recent = true;
        }
        fh.uses += u8::from(fh.uses != u8::MAX);
        let rkey = fh.rkey;
        self.front.op = Some(op);
        Some(Seg { raddr, len, rkey })
    }

    /// `acquire` past the checks and the one-region hit: a hit over several regions, or a miss.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn acquire_rest(
        &mut self,
        op: OpId,
        peer: Rank,
        raddr: u64,
        len: usize,
        rights: Rights,
        small_put: Option<&[u8]>,
        // From `acquire`: the op's last bucket, its first bucket's firehose, its end.
        (last, mut next, end): (u64, Option<u32>, u64),
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) -> Result<Acquire, FhError> {
        let p = &self.peers[peer as usize];
        let mut cur = raddr;
        let mut segs = Segs::default();
        let mut fhs = Inline2::<u32>::default();
        let hit = loop {
            let Some(id) = next else {
                break false;
            };
            let fh = &self.fhs[id as usize];
            if !fh.rights.covers(rights) {
                break false;
            }
            let fh_end = fh.start + fh.nb as u64;
            let seg_end = if fh_end > last {
                end
            } else {
                fh_end << self.shift
            };
            push_seg(&mut segs, cur, seg_end, fh.rkey);
            if !fhs.contains(&id) {
                fhs.push(id);
            }
            if fh_end > last {
                break true;
            }
            cur = seg_end;
            next = p.map.get(fh_end);
        };
        if hit {
            if self.front.op == Some(op) || (!self.ops.is_empty() && self.ops.contains_key(&op)) {
                return Err(FhError::DuplicateOp);
            }
            for &id in fhs.iter() {
                self.take_use(id);
            }
            match (self.front.op, fhs.as_slice()) {
                (None, &[a]) => self.front = Front::new(op, peer, [a, a], 1),
                (None, &[a, b]) => self.front = Front::new(op, peer, [a, b], 2),
                _ => {
                    let o = Op::new(peer, raddr, len, rights, fhs, OpState::Active);
                    self.ops.insert(op, o);
                }
            }
            st.hits += 1;
            return Ok(Acquire::Hit(segs));
        }
        if self.front.op == Some(op) || self.ops.contains_key(&op) {
            return Err(FhError::DuplicateOp);
        }
        st.misses += 1;
        if let Some(data) = small_put.filter(|d| d.len() <= self.small_put_max) {
            self.put_in_move(op, peer, raddr, rights, data, out, st);
            return Ok(Acquire::DoneInMove);
        }
        let o = Op::new(
            peer,
            raddr,
            len,
            rights,
            Inline2::default(),
            OpState::Waiting { outstanding: 0 },
        );
        self.ops.insert(op, o);
        self.advance(op, false, out, st);
        // A new op queued behind blocked ones drops its holds into the FIFO: that may be
        // what the head of the queue was waiting for.
        self.after_budget_change(peer, out, st);
        Ok(Acquire::Pending)
    }

    /// The front slot's release here, inlined into the caller; the table's in `release_rest`.
    #[inline(always)]
    pub fn release(
        &mut self,
        op: OpId,
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) -> Result<(), FhError> {
        if self.front.op != Some(op) {
            return self.release_rest(op, out, st);
        }
        // Out of the slot: its `op` says whether it is taken, the rest is read only then.
        self.front.op = None;
        let Front { peer, n, ids, .. } = self.front;
        // The common hit's release: one firehose, its peer looked up once (`drop_ref` and
        // `after_release` written out for a firehose that stays, or lazily still is, in the
        // FIFO); anything else (two firehoses, a revoked one, one to queue) in `release_front`.
        let id = ids[0];
        if n == 1 && self.links.is_linked(id) {
            let fh = &mut self.fhs[id as usize];
            let p = &mut self.peers[peer as usize];
            debug_assert_eq!(fh.peer, peer);
            if fh.refs > 1 {
                fh.refs -= 1;
            } else if fh.refs == 1 && !fh.revoked {
                fh.refs = 0;
                p.fifo_buckets += fh.nb as u64;
                fh.recent = true;
            } else {
                return self.release_front(peer, n, ids, out, st);
            }
            if !p.blocked.is_empty() || p.cut.is_some() || !p.acks.is_empty() {
                self.after_budget_change(peer, out, st);
            }
            return Ok(());
        }
        self.release_front(peer, n, ids, out, st)
    }

    /// `Firehose::front_awaited`.
    #[inline(always)]
    pub fn front_awaited(&self) -> bool {
        if self.front.op.is_none() {
            return false;
        }
        let Front { peer, n, ids, .. } = self.front;
        let p = &self.peers[peer as usize];
        !p.blocked.is_empty()
            || p.cut.is_some()
            || !p.acks.is_empty()
            || self.fhs[ids[0] as usize].revoked
            || (n == 2 && self.fhs[ids[1] as usize].revoked)
    }

    /// `release` of the front slot's op (taken out of the slot: `peer`, `n` firehoses `ids`)
    /// past the common case.
    #[inline(never)]
    fn release_front(
        &mut self,
        peer: Rank,
        n: u32,
        ids: [u32; 2],
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) -> Result<(), FhError> {
        self.drop_ref(ids[0]);
        if n == 2 {
            self.drop_ref(ids[1]);
        }
        self.after_release(peer, out, st);
        Ok(())
    }

    #[inline(never)]
    fn release_rest(
        &mut self,
        op: OpId,
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) -> Result<(), FhError> {
        match self.ops.get(&op) {
            Some(o) if o.state == OpState::Active => {}
            _ => return Err(FhError::UnknownOp),
        }
        let o = self.ops.remove(&op).expect("checked");
        for &id in o.fhs.iter() {
            self.drop_ref(id);
        }
        self.after_release(o.peer, out, st);
        Ok(())
    }

    /// What a release may unblock: queued ops, a cut, acks waiting for refs to drop.
    #[inline]
    fn after_release(&mut self, peer: Rank, out: &mut Outbox, st: &mut FirehoseStats) {
        let p = &self.peers[peer as usize];
        if !p.blocked.is_empty() || p.cut.is_some() || !p.acks.is_empty() {
            self.after_budget_change(peer, out, st);
        }
    }

    /// One more ref on firehose `id`. A firehose that was unused stays where it is in its
    /// peer's FIFO (lazy removal: the eviction scan drops entries in use, `pop_unused`), so
    /// a hit touches the firehose and its peer, not its FIFO neighbours.
    #[inline(always)]
    pub(crate) fn take_ref(&mut self, id: u32) {
        let fh = &mut self.fhs[id as usize];
        fh.refs += 1;
        if fh.refs == 1 {
            self.peers[fh.peer as usize].fifo_buckets -= fh.nb as u64;
        }
    }

    /// A ref for an op that found firehose `id` already there: counted as a use (`thrash`).
    #[inline(always)]
    pub(crate) fn take_use(&mut self, id: u32) {
        self.take_ref(id);
        let fh = &mut self.fhs[id as usize];
        // Saturating (as `saturating_add`, in fewer instructions).
        fh.uses += u8::from(fh.uses != u8::MAX);
    }

    /// One ref less; at zero the firehose is unused again: still in its peer's FIFO, it is
    /// marked recently used (the scan gives it a second chance); out of it, it goes to the
    /// tail. Revoked, it is acked and forgotten.
    #[inline]
    pub(crate) fn drop_ref(&mut self, id: u32) {
        let fh = &mut self.fhs[id as usize];
        fh.refs -= 1;
        if fh.refs == 0 {
            if fh.revoked {
                self.forget(id, true);
            } else {
                let p = &mut self.peers[fh.peer as usize];
                p.fifo_buckets += fh.nb as u64;
                if self.links.is_linked(id) {
                    fh.recent = true;
                } else {
                    self.links.push_back(&mut p.fifo, id);
                }
            }
        }
    }

    /// The oldest unused firehose of `peer`, out of its FIFO and off `fifo_buckets` (the
    /// caller evicts it). On the way, entries in use leave the FIFO
    /// (their last release puts them back at the tail) and entries used since they were
    /// queued go to the tail once (second chance: the order stays close to least recently
    /// released, as the paper's FIFO, without touching the FIFO on every hit).
    pub(crate) fn pop_unused(&mut self, peer: Rank) -> Option<u32> {
        let p = &mut self.peers[peer as usize];
        loop {
            let id = self.links.pop_front(&mut p.fifo)?;
            let fh = &mut self.fhs[id as usize];
            if fh.refs > 0 {
                fh.recent = false;
                continue;
            }
            if fh.recent {
                fh.recent = false;
                self.links.push_back(&mut p.fifo, id);
                continue;
            }
            p.fifo_buckets -= fh.nb as u64;
            return Some(id);
        }
    }

    /// Takes a revoked firehose out of its peer's FIFO (it may sit there in use, lazily).
    pub(crate) fn unqueue(&mut self, id: u32) {
        let peer = self.fhs[id as usize].peer;
        self.links.remove(&mut self.peers[peer as usize].fifo, id);
    }

    /// Drops a firehose with no refs and out of the FIFO: its charge goes; a revoked one is
    /// acked (unless its peer is lost).
    pub(crate) fn forget(&mut self, id: u32, ack: bool) {
        let fh = self.fhs[id as usize];
        debug_assert_eq!(fh.refs, 0);
        let p = &mut self.peers[fh.peer as usize];
        let handle = self.handles[id as usize];
        p.by_handle.remove(&handle);
        p.charged -= fh.nb as u64;
        if ack && !p.lost {
            p.acks.push(handle);
        }
        self.fh_free.push(id);
    }

    /// Removes the bucket-map entries that still point at `id`.
    pub(crate) fn unmap(&mut self, id: u32) {
        let fh = self.fhs[id as usize];
        let p = &mut self.peers[fh.peer as usize];
        for b in fh.start..fh.start + fh.nb as u64 {
            if p.map.get(b) == Some(id) {
                p.map.remove(b);
            }
        }
    }
}
