//! The simulated job: N ranks' `Firehose` state machines, a per-pair FIFO network with random
//! delays (random choice of which pair delivers next), a fake address space per rank
//! (mapped/unmapped pages with a generation per mapping) that pins, unpins and writes, RDMAs
//! in flight, and the checks after every step.

use firehose_proto::wire::RemoteError;
use firehose_proto::{
    Acquire, Event, FhError, Firehose, FirehoseConfig, InvalId, OpId, PinFailure, RegionPins, Seg,
    WireError,
};
use std::collections::{BTreeMap, HashMap, VecDeque};

pub use crate::sim_mem::Rng;

pub const BASE: u64 = 0x4000_0000;

/// A pinned region as the fake device sees it: its range and the page generations it locked.
#[derive(Debug, Clone)]
pub struct Mr {
    pub addr: u64,
    pub len: usize,
    pub gens: Vec<u64>,
    /// What the key allows (a segment of an op needing other rights is a violation).
    pub rights: firehose_proto::Rights,
}

/// One rank's address space and pinning backend.
#[derive(Debug)]
pub struct Mem {
    pub page: usize,
    pub mapped: Vec<bool>,
    pub gen: Vec<u64>,
    pub mrs: HashMap<u32, Mr>,
    pub next_rkey: u32,
    pub pinned: u64,
    /// RDMA segments in flight per rkey: an unpin while > 0 is the bug the sim hunts.
    pub inflight: HashMap<u32, u32>,
    pub violations: Vec<String>,
}

impl Mem {
    pub fn new(pages: usize, page: usize) -> Self {
        Mem {
            page,
            mapped: vec![true; pages],
            gen: vec![1; pages],
            mrs: HashMap::new(),
            next_rkey: 1,
            pinned: 0,
            inflight: HashMap::new(),
            violations: Vec::new(),
        }
    }
    fn pages(&self, addr: u64, len: usize) -> Option<std::ops::Range<usize>> {
        if addr < BASE {
            return None;
        }
        let lo = ((addr - BASE) / self.page as u64) as usize;
        let hi = ((addr - BASE + len as u64).div_ceil(self.page as u64)) as usize;
        (hi <= self.mapped.len()).then_some(lo..hi)
    }
}

impl RegionPins for Mem {
    fn pin(
        &mut self,
        addr: u64,
        len: usize,
        rights: firehose_proto::Rights,
    ) -> Result<u32, PinFailure> {
        let r = self.pages(addr, len).ok_or(PinFailure::Unmapped)?;
        if !self.mapped[r.clone()].iter().all(|&m| m) {
            return Err(PinFailure::Unmapped);
        }
        let rkey = self.next_rkey;
        self.next_rkey += 1;
        self.mrs.insert(
            rkey,
            Mr {
                addr,
                len,
                gens: self.gen[r].to_vec(),
                rights,
            },
        );
        self.pinned += len as u64;
        Ok(rkey)
    }
    fn unpin(&mut self, addr: u64, len: usize, rkey: u32) {
        match self.mrs.remove(&rkey) {
            Some(mr) if mr.addr == addr && mr.len == len => {}
            other => self
                .violations
                .push(format!("unpin of {addr:#x}+{len} key {rkey}: {other:?}")),
        }
        if self.inflight.get(&rkey).copied().unwrap_or(0) > 0 {
            self.violations
                .push(format!("unpin of key {rkey} while an RDMA uses it"));
        }
        self.pinned -= len as u64;
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), PinFailure> {
        let r = self.pages(addr, data.len()).ok_or(PinFailure::Unmapped)?;
        if self.mapped[r].iter().all(|&m| m) {
            Ok(())
        } else {
            Err(PinFailure::Unmapped)
        }
    }
}

#[derive(Debug, Clone)]
pub struct OpInfo {
    pub peer: u32,
    pub raddr: u64,
    pub len: usize,
    /// Per page of the op: the lowest generation an MR may have locked (invalidations done
    /// before the op was acquired).
    pub floor: Vec<u64>,
    /// Some page was unmapped at acquire time or later (a Remote(Unmapped) failure is fine).
    pub put: bool,
    /// What it does at the target (`World::mixed_rights`; else both).
    pub rights: firehose_proto::Rights,
}

pub struct Rdma {
    pub rank: u32,
    pub op: OpId,
    pub peer: u32,
    pub segs: Vec<Seg>,
}

pub struct Params {
    pub n: u32,
    pub bucket: usize,
    pub region_buckets: u32,
    pub f_buckets: u64,
    pub victim_buckets: u64,
    pub pages: usize,
    pub ws_pages: usize,
    pub max_len: usize,
    pub adaptive: bool,
    /// Ranks that issue ops (others are idle initiators, still targets).
    pub busy: Vec<u32>,
    /// Per busy rank (same order), the peer it targets (None: random peers).
    pub target: Vec<Option<u32>>,
    /// Lengths: 0 = the mixed default, else uniform 1..=this.
    pub len_max: usize,
}

pub struct World {
    pub p: Params,
    pub fh: Vec<Firehose>,
    pub mem: Vec<Mem>,
    pub net: BTreeMap<(u32, u32), VecDeque<Vec<u8>>>,
    pub rdma: Vec<Rdma>,
    pub ops: Vec<HashMap<OpId, OpInfo>>,
    /// Per rank, per page: generation floor set by finished invalidations.
    pub floor: Vec<Vec<u64>>,
    pub invals: Vec<(u32, InvalId, std::ops::Range<usize>, Vec<u64>)>,
    pub lost: Vec<bool>,
    pub next_op: OpId,
    pub rng: Rng,
    pub completed: u64,
    pub failed_unmapped: u64,
    pub steps: u64,
    /// Ops are gets (read) or puts (write) at random, through `acquire_for`; off (the default):
    /// every op asks for both rights (`acquire`), and the random sequence is unchanged.
    pub mixed_rights: bool,
}

impl World {
    pub fn new(p: Params, seed: u64) -> Self {
        let n = p.n;
        let fh = (0..n)
            .map(|r| {
                let mut c = FirehoseConfig::new(r, n);
                c.bucket_size = p.bucket;
                c.m_bytes = (p.f_buckets * (n as u64 - 1)) as usize * p.bucket;
                c.max_victim_bytes = p.victim_buckets as usize * p.bucket;
                c.max_region_buckets = p.region_buckets;
                c.adaptive = p.adaptive;
                Firehose::new(c).expect("valid config")
            })
            .collect();
        World {
            mem: (0..n).map(|_| Mem::new(p.pages, p.bucket)).collect(),
            fh,
            net: BTreeMap::new(),
            rdma: Vec::new(),
            ops: (0..n).map(|_| HashMap::new()).collect(),
            floor: (0..n).map(|_| vec![0; p.pages]).collect(),
            invals: Vec::new(),
            lost: vec![false; n as usize],
            next_op: 1,
            rng: Rng::new(seed),
            completed: 0,
            failed_unmapped: 0,
            steps: 0,
            mixed_rights: false,
            p,
        }
    }

    fn live(&self, r: u32) -> bool {
        !self.lost[r as usize]
    }

    /// Moves every rank's outgoing messages onto the wire.
    pub fn pump(&mut self) {
        for r in 0..self.p.n {
            while let Some((to, bytes)) = self.fh[r as usize].poll_transmit() {
                assert!(bytes.len() <= firehose_proto::config::DEFAULT_MAX_MSG);
                if self.live(r) && self.live(to) {
                    self.net.entry((r, to)).or_default().push_back(bytes);
                }
            }
        }
    }

    /// Issues one random op from a busy rank.
    pub fn issue(&mut self) {
        let busy = &self.p.busy;
        let k = self.rng.below(busy.len() as u64) as usize;
        let r = busy[k];
        if !self.live(r) {
            return;
        }
        let mut peer = self.rng.below(self.p.n as u64 - 1) as u32;
        if peer >= r {
            peer += 1;
        }
        if let Some(t) = self.p.target.get(k).copied().flatten() {
            peer = t;
        }
        if !self.live(peer) {
            return;
        }
        let page = self.p.bucket as u64;
        let ws = self.p.ws_pages as u64;
        let len = match self.rng.below(10) {
            _ if self.p.len_max > 0 => 1 + self.rng.below(self.p.len_max as u64) as usize,
            0..=5 => 1 + self.rng.below(64) as usize,
            6..=8 => 1 + self.rng.below(2 * page) as usize,
            _ => 1 + self.rng.below(self.p.max_len as u64) as usize,
        };
        let off = self.rng.below(ws * page);
        let raddr = BASE + off.min(ws * page - len.min((ws * page) as usize) as u64);
        let put = len <= 3072 && self.rng.chance(30);
        use firehose_proto::Rights;
        let rights = match (self.mixed_rights, put) {
            (false, _) => Rights::BOTH,
            (true, true) => Rights::WRITE,
            (true, false) if self.rng.chance(50) => Rights::READ,
            (true, false) => Rights::WRITE,
        };
        let data = vec![0xAB; len];
        let op = self.next_op;
        self.next_op += 1;
        let pg = |a: u64| ((a - BASE) / page) as usize;
        let floor = (pg(raddr)..=pg(raddr + len as u64 - 1))
            .map(|i| self.floor[peer as usize].get(i).copied().unwrap_or(0))
            .collect();
        let info = OpInfo {
            peer,
            raddr,
            len,
            floor,
            put,
            rights,
        };
        let res =
            self.fh[r as usize].acquire_for(op, peer, raddr, len, rights, put.then_some(&data[..]));
        match res {
            Ok(Acquire::Hit(segs)) => {
                self.ops[r as usize].insert(op, info);
                self.start_rdma(r, op, segs.to_vec());
            }
            Ok(_) => {
                self.ops[r as usize].insert(op, info);
            }
            Err(e) => panic!("acquire {raddr:#x}+{len} to {peer}: {e:?}"),
        }
    }

    /// Checks the segments handed out for `op` and puts its RDMA in flight.
    fn start_rdma(&mut self, r: u32, op: OpId, segs: Vec<Seg>) {
        let info = self.ops[r as usize][&op].clone();
        let mut cur = info.raddr;
        let page = self.p.bucket as u64;
        let mem = &mut self.mem[info.peer as usize];
        for s in &segs {
            assert_eq!(s.raddr, cur, "op {op}: segments not contiguous: {segs:?}");
            assert!(s.len > 0);
            cur += s.len as u64;
            let mr = mem
                .mrs
                .get(&s.rkey)
                .unwrap_or_else(|| panic!("op {op}: key {} not pinned at {}", s.rkey, info.peer));
            assert!(
                s.raddr >= mr.addr && s.raddr + s.len as u64 <= mr.addr + mr.len as u64,
                "op {op}: segment {s:?} outside its region {mr:?}"
            );
            assert!(
                mr.rights.covers(info.rights),
                "op {op} ({:?}): segment {s:?} through a key with {:?}",
                info.rights,
                mr.rights
            );
            for a in (s.raddr / page..=(s.raddr + s.len as u64 - 1) / page).map(|x| x * page) {
                let mr_gen = mr.gens[((a - mr.addr) / page) as usize];
                let op_page = ((a - info.raddr / page * page) / page) as usize;
                assert!(
                    mr_gen >= info.floor[op_page],
                    "op {op} of rank {r} acquired after an invalidation finished targets the old page {a:#x} (gen {mr_gen} < {})",
                    info.floor[op_page]
                );
            }
            *mem.inflight.entry(s.rkey).or_insert(0) += 1;
        }
        assert_eq!(cur, info.raddr + info.len as u64, "op {op}: segments short");
        self.rdma.push(Rdma {
            rank: r,
            op,
            peer: info.peer,
            segs,
        });
    }

    pub fn complete_rdma(&mut self) {
        if self.rdma.is_empty() {
            return;
        }
        let i = self.rng.below(self.rdma.len() as u64) as usize;
        let d = self.rdma.swap_remove(i);
        self.end_rdma(&d);
        self.fh[d.rank as usize].release(d.op).expect("release");
        self.ops[d.rank as usize].remove(&d.op);
        self.completed += 1;
    }

    fn end_rdma(&mut self, d: &Rdma) {
        let mem = &mut self.mem[d.peer as usize];
        for s in &d.segs {
            assert!(
                mem.mrs.contains_key(&s.rkey),
                "RDMA completed on an unpinned key"
            );
            *mem.inflight.get_mut(&s.rkey).unwrap() -= 1;
        }
    }

    pub fn deliver(&mut self) -> bool {
        let keys: Vec<(u32, u32)> = self
            .net
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(k, _)| *k)
            .collect();
        if keys.is_empty() {
            return false;
        }
        let (from, to) = keys[self.rng.below(keys.len() as u64) as usize];
        let bytes = self.net.get_mut(&(from, to)).unwrap().pop_front().unwrap();
        let res = self.fh[to as usize].handle_message(from, &bytes, &mut self.mem[to as usize]);
        if let Err(e) = res {
            panic!("rank {to} rejected an in-protocol message from {from}: {e:?}");
        }
        true
    }

    pub fn drain_events(&mut self) {
        for r in 0..self.p.n {
            while let Some(ev) = self.fh[r as usize].poll_event() {
                match ev {
                    Event::Ready { op, segs } => self.start_rdma(r, op, segs.to_vec()),
                    Event::PutDone { op } => {
                        let info = self.ops[r as usize].remove(&op).expect("known op");
                        assert!(info.put);
                        self.completed += 1;
                    }
                    Event::Failed { op, error } => {
                        self.ops[r as usize].remove(&op).expect("known op");
                        match error {
                            FhError::Remote(RemoteError::Unmapped) => self.failed_unmapped += 1,
                            FhError::PeerLost(_) => {}
                            e => panic!("op {op} failed: {e:?}"),
                        }
                        self.completed += 1;
                    }
                }
            }
        }
    }

    /// Unmaps a few pages of a random rank and tells its Firehose.
    pub fn unmap(&mut self) {
        let r = self.rng.below(self.p.n as u64) as u32;
        if !self.live(r) {
            return;
        }
        let n = 1 + self.rng.below(6) as usize;
        let lo = self
            .rng
            .below((self.p.ws_pages.saturating_sub(n) + 1) as u64) as usize;
        let m = &mut self.mem[r as usize];
        for i in lo..lo + n {
            m.mapped[i] = false;
            m.gen[i] += 1;
        }
        let gens = m.gen[lo..lo + n].to_vec();
        let addr = BASE + (lo * self.p.bucket) as u64;
        let id = self.fh[r as usize].invalidate(addr, n * self.p.bucket, &mut self.mem[r as usize]);
        self.invals.push((r, id, lo..lo + n, gens));
    }

    /// Maps a random unmapped page range again (new pages at the old address).
    pub fn remap(&mut self) {
        let r = self.rng.below(self.p.n as u64) as usize;
        let m = &mut self.mem[r];
        let start = self.rng.below(m.mapped.len() as u64) as usize;
        if let Some(i) = (start..m.mapped.len()).find(|&i| !m.mapped[i]) {
            let mut j = i;
            while j < m.mapped.len() && !m.mapped[j] && j < i + 8 {
                m.mapped[j] = true;
                j += 1;
            }
        }
    }

    pub fn lose(&mut self, r: u32) {
        self.lost[r as usize] = true;
        // Its RDMAs stop, and RDMAs to it fail (released by their initiators).
        let ds: Vec<Rdma> = std::mem::take(&mut self.rdma);
        for d in ds {
            if d.rank == r || d.peer == r {
                self.end_rdma(&d);
                if d.rank != r {
                    self.fh[d.rank as usize].release(d.op).expect("release");
                    self.ops[d.rank as usize].remove(&d.op);
                }
            } else {
                self.rdma.push(d);
            }
        }
        self.net.retain(|k, _| k.0 != r && k.1 != r);
        self.ops[r as usize].clear();
        for o in 0..self.p.n {
            if o != r && self.live(o) {
                self.fh[o as usize].peer_lost(r, &mut self.mem[o as usize]);
            }
        }
    }

    /// The checks after every step.
    pub fn check(&mut self) {
        let bound = (self.p.f_buckets * (self.p.n as u64 - 1) + self.p.victim_buckets)
            * self.p.bucket as u64;
        for r in 0..self.p.n as usize {
            if self.lost[r] {
                continue;
            }
            let f = &self.fh[r];
            if let Err(e) = f.check_invariants() {
                panic!("rank {r}: {e} (step {})", self.steps);
            }
            assert!(
                f.pinned_bytes() <= bound,
                "rank {r}: pinned {} > M + MAXVICTIM {bound}",
                f.pinned_bytes()
            );
            assert_eq!(
                f.pinned_bytes(),
                self.mem[r].pinned,
                "rank {r}: pinned count vs device"
            );
            assert!(
                self.mem[r].violations.is_empty(),
                "rank {r}: {:?}",
                self.mem[r].violations
            );
        }
        // Finished invalidations raise the generation floor for ops acquired from now on.
        let mut i = 0;
        while i < self.invals.len() {
            let (r, id, ref pages, ref gens) = self.invals[i];
            if self.lost[r as usize] || self.fh[r as usize].invalidation_done(id) {
                for (k, p) in pages.clone().enumerate() {
                    let f = &mut self.floor[r as usize][p];
                    *f = (*f).max(gens[k]);
                }
                self.invals.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    pub fn step(&mut self, issue_pct: u64, unmap_pct: u64) {
        self.steps += 1;
        let x = self.rng.below(1000);
        let inflight: usize = self.ops.iter().map(|o| o.len()).sum();
        if x < issue_pct * 10 {
            if inflight < 64 {
                self.issue();
            } else {
                self.deliver();
            }
        } else if x < issue_pct * 10 + unmap_pct {
            if self.rng.chance(50) {
                self.unmap();
            } else {
                self.remap();
            }
        } else if x % 3 == 0 {
            self.complete_rdma();
        } else {
            self.deliver();
        }
        self.pump();
        self.drain_events();
        self.pump();
        self.check();
    }

    /// Runs until no message, event or RDMA is left; then every op must have completed.
    pub fn drain(&mut self) {
        let mut guard = 0;
        loop {
            guard += 1;
            assert!(guard < 1_000_000, "no quiescence");
            self.steps += 1;
            let moved = self.deliver();
            if !moved {
                if self.rdma.is_empty() {
                    break;
                }
                self.complete_rdma();
            } else if self.rng.chance(30) {
                self.complete_rdma();
            }
            self.pump();
            self.drain_events();
            self.pump();
            self.check();
        }
        for r in 0..self.p.n as usize {
            if self.lost[r] {
                continue;
            }
            assert!(
                self.ops[r].is_empty(),
                "rank {r}: ops never completed: {:?}",
                self.ops[r]
                    .keys()
                    .map(|&o| (o, self.ops[r][&o].clone(), self.fh[r].debug_op(o)))
                    .collect::<Vec<_>>()
            );
            assert_eq!(self.fh[r].ops_in_flight(), 0, "rank {r}");
            assert_eq!(
                self.fh[r].invalidations_pending(),
                0,
                "rank {r}: invalidation never finished"
            );
        }
    }

    /// Offers a message to `to` as if from `from`; returns the error, or None if accepted.
    pub fn inject(&mut self, from: u32, to: u32, bytes: &[u8]) -> Option<WireError> {
        self.fh[to as usize]
            .handle_message(from, bytes, &mut self.mem[to as usize])
            .err()
    }
}
