//! The target side of every rank: the Rendezvous handlers (register on request, reply with the
//! rkey; with-unpin deregisters on DONE), the buffers this rank exposes (address, length and the
//! registered-once floor rkey), its counters, and STOP. All of it runs in AM handlers inside
//! whatever `progress` this rank is in (a wait of its own, or the serve loop).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use firehose::internals::net::{Am, Rank};
use firehose::internals::pin::verbs::{Mr, Pd};
use firehose::internals::pin::Access;
use firehose::internals::rma::Rma;

/// Handler ids (clear of Firehose's 0xFE00 and the barrier's 0xFF00).
pub const RV_REQ: u16 = 0x4601;
pub const RV_DONE: u16 = 0x4602;
pub const INFO: u16 = 0x4603;
pub const STATS: u16 = 0x4604;
pub const STOP: u16 = 0x4605;
pub const VERIFY: u16 = 0x4606;

/// The rights Firehose's own target pins carry (rma::target_pins): the baselines register with
/// the same, so a registration costs them what it costs Firehose.
const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);

/// One exposed buffer: where it is and the rkey of its registered-once MR (the floor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exposed {
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

impl Exposed {
    pub fn encode(list: &[Exposed]) -> Vec<u8> {
        let mut v = Vec::with_capacity(list.len() * 20);
        for e in list {
            v.extend_from_slice(&e.addr.to_le_bytes());
            v.extend_from_slice(&e.len.to_le_bytes());
            v.extend_from_slice(&e.rkey.to_le_bytes());
        }
        v
    }

    pub fn decode(b: &[u8]) -> Option<Vec<Exposed>> {
        if !b.len().is_multiple_of(20) {
            return None;
        }
        Some(
            b.chunks_exact(20)
                .map(|c| Exposed {
                    addr: u64_at(c, 0),
                    len: u64_at(c, 8),
                    rkey: u32::from_le_bytes(c[16..20].try_into().unwrap()),
                })
                .collect(),
        )
    }
}

pub fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// A Rendezvous request: `[raddr u64][len u64][unpin u8]`; the reply `[ok u8][rkey u32][id u32]`.
pub fn rv_request(raddr: u64, len: usize, unpin: bool) -> [u8; 17] {
    let mut m = [0u8; 17];
    m[..8].copy_from_slice(&raddr.to_le_bytes());
    m[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    m[16] = unpin as u8;
    m
}

/// The counters STATS returns (this rank's Firehose target side and its Rendezvous side).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetStats {
    pub pinned_bytes: u64,
    pub pinned_peak: u64,
    pub pins: u64,
    pub unpins: u64,
    pub victim_hits: u64,
    pub rv_regs: u64,
    pub rv_deregs: u64,
    /// Initiator side of this rank (the app gathers them): hits, misses, moves, puts.
    pub hits: u64,
    pub misses: u64,
    pub moves: u64,
    pub puts_in_move: u64,
}

const N_STATS: usize = 11;

impl TargetStats {
    fn encode(&self) -> Vec<u8> {
        [
            self.pinned_bytes,
            self.pinned_peak,
            self.pins,
            self.unpins,
            self.victim_hits,
            self.rv_regs,
            self.rv_deregs,
            self.hits,
            self.misses,
            self.moves,
            self.puts_in_move,
        ]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
    }

    pub fn decode(b: &[u8]) -> Option<TargetStats> {
        if b.len() != N_STATS * 8 {
            return None;
        }
        let v = |i: usize| u64_at(b, i * 8);
        Some(TargetStats {
            pinned_bytes: v(0),
            pinned_peak: v(1),
            pins: v(2),
            unpins: v(3),
            victim_hits: v(4),
            rv_regs: v(5),
            rv_deregs: v(6),
            hits: v(7),
            misses: v(8),
            moves: v(9),
            puts_in_move: v(10),
        })
    }
}

/// What this rank serves.
pub struct Served {
    pd: Arc<Pd>,
    /// No-unpin: page-aligned ranges registered on first request, kept forever.
    forever: Mutex<HashMap<(u64, u64), Mr>>,
    /// With-unpin: one registration per request, dropped (deregistered) on its DONE.
    once: Mutex<HashMap<u32, Mr>>,
    next_id: AtomicU32,
    regs: AtomicU64,
    deregs: AtomicU64,
    exposed: Mutex<(Vec<Exposed>, Vec<Mr>)>,
    /// The app's verification record of this rank (VERIFY replies with it).
    pub verify: Mutex<Vec<u8>>,
    pub stop: AtomicBool,
    page: u64,
}

impl Served {
    pub fn new(pd: Arc<Pd>) -> Arc<Served> {
        Arc::new(Served {
            pd,
            forever: Mutex::new(HashMap::new()),
            once: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(1),
            regs: AtomicU64::new(0),
            deregs: AtomicU64::new(0),
            exposed: Mutex::new((Vec::new(), Vec::new())),
            verify: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            page: 4096,
        })
    }

    /// Registers `buf` once (remote write) and lists it for INFO: the floor's buffer, and the
    /// address the other transports put to.
    pub fn expose(&self, buf: &'static mut [u8]) -> Exposed {
        let mr = Mr::register(&self.pd, buf.as_ptr() as usize, buf.len(), RW)
            .unwrap_or_else(|e| crate::fail(format!("registering the exposed buffer: {e}")));
        let e = Exposed {
            addr: buf.as_ptr() as u64,
            len: buf.len() as u64,
            rkey: mr.rkey(),
        };
        let mut g = self.exposed.lock().unwrap();
        g.0.push(e);
        g.1.push(mr);
        e
    }

    /// Handles a Rendezvous request: the reply bytes.
    fn rv(&self, p: &[u8]) -> [u8; 9] {
        let mut out = [0u8; 9];
        if p.len() != 17 {
            return out;
        }
        let (addr, len, unpin) = (u64_at(p, 0), u64_at(p, 8), p[16] != 0);
        let Some(end) = addr.checked_add(len).filter(|_| len > 0) else {
            return out;
        };
        let access = RW;
        let (rkey, id) = if unpin {
            let Ok(mr) = Mr::register(&self.pd, addr as usize, len as usize, access) else {
                return out;
            };
            self.regs.fetch_add(1, Relaxed);
            let id = self.next_id.fetch_add(1, Relaxed);
            let rkey = mr.rkey();
            self.once.lock().unwrap().insert(id, mr);
            (rkey, id)
        } else {
            let key = (
                addr / self.page * self.page,
                end.div_ceil(self.page) * self.page,
            );
            let mut m = self.forever.lock().unwrap();
            if let Some(mr) = m.get(&key) {
                (mr.rkey(), 0)
            } else {
                let len = (key.1 - key.0) as usize;
                let Ok(mr) = Mr::register(&self.pd, key.0 as usize, len, access) else {
                    return out;
                };
                self.regs.fetch_add(1, Relaxed);
                let rkey = mr.rkey();
                m.insert(key, mr);
                (rkey, 0)
            }
        };
        out[0] = 1;
        out[1..5].copy_from_slice(&rkey.to_le_bytes());
        out[5..9].copy_from_slice(&id.to_le_bytes());
        out
    }

    /// Rendezvous no-unpin's registrations now (dropped between tests).
    pub fn forget_forever(&self) {
        self.forever.lock().unwrap().clear();
    }

    pub fn stats(&self, rma: &Rma) -> TargetStats {
        let s = rma.stats();
        TargetStats {
            pinned_bytes: s.fh.pinned_bytes,
            pinned_peak: s.fh.pinned_peak,
            pins: s.fh.pins,
            unpins: s.fh.unpins,
            victim_hits: s.fh.victim_hits,
            rv_regs: self.regs.load(Relaxed),
            rv_deregs: self.deregs.load(Relaxed),
            hits: s.fh.hits,
            misses: s.fh.misses,
            moves: s.fh.moves_sent,
            puts_in_move: s.fh.puts_in_move,
        }
    }

    /// Installs the handlers on `am`; they hold `self` and `rma` (the process keeps both to
    /// the end, so the cycle through the endpoint is harmless).
    pub fn install(self: &Arc<Self>, am: &Am, rma: &Arc<Rma>) {
        let s = self.clone();
        am.register_request(RV_REQ, move |_, p, r| {
            let _ = r.reply(&s.rv(p));
        });
        let s = self.clone();
        am.register_oneway(RV_DONE, move |_, p| {
            if let Ok(id) = <[u8; 4]>::try_from(p) {
                if s.once
                    .lock()
                    .unwrap()
                    .remove(&u32::from_le_bytes(id))
                    .is_some()
                {
                    s.deregs.fetch_add(1, Relaxed);
                }
            }
        });
        let s = self.clone();
        am.register_request(INFO, move |_, _, r| {
            let b = Exposed::encode(&s.exposed.lock().unwrap().0);
            let _ = r.reply(&b);
        });
        let (s, rm) = (self.clone(), rma.clone());
        am.register_request(STATS, move |_, _, r| {
            let _ = r.reply(&s.stats(&rm).encode());
        });
        let s = self.clone();
        am.register_request(VERIFY, move |_, _, r| {
            let b = s.verify.lock().unwrap().clone();
            let _ = r.reply(&b);
        });
        let s = self.clone();
        am.register_oneway(STOP, move |_, _| s.stop.store(true, Relaxed));
    }
}

impl Served {
    /// Replaces every handler by one that holds nothing (breaks the Rma -> endpoint -> handler
    /// -> Rma cycle at the end of the run).
    pub fn uninstall(&self, am: &Am) {
        for id in [RV_REQ, INFO, STATS, VERIFY] {
            am.register_request(id, |_, _, _| {});
        }
        for id in [RV_DONE, STOP] {
            am.register_oneway(id, |_, _| {});
        }
    }
}

/// Asks `peer` for what it exposes.
pub fn info(am: &Am, peer: Rank) -> Vec<Exposed> {
    let b = am
        .call(peer, INFO, &[])
        .unwrap_or_else(|e| crate::fail(format!("INFO from rank {peer}: {e:?}")));
    Exposed::decode(&b).unwrap_or_else(|| crate::fail("INFO reply malformed"))
}

/// Asks `peer` for its counters.
pub fn stats(am: &Am, peer: Rank) -> TargetStats {
    let b = am
        .call(peer, STATS, &[])
        .unwrap_or_else(|e| crate::fail(format!("STATS from rank {peer}: {e:?}")));
    TargetStats::decode(&b).unwrap_or_else(|| crate::fail("STATS reply malformed"))
}
