//! The exposure policy through the whole driver on the simulated link:
//! `FH_EXPOSE=declared` lets peers reach only what the target exposed, with the access it was
//! exposed with; anything else fails at the initiator with `RemoteDenied` and leaves the
//! target's bytes as they were, at every size (a put riding in a move is checked before the
//! target writes it itself; a longer one before anything is pinned). `fh_unexpose` revokes
//! what peers already hold there. In both modes the library's own buffers (the link's rings:
//! `Link::own_buffers`, a stand-in ring on the simulator) are never a target.

use firehose::net::RdmaKind;
use firehose::pin::null::NullPinner;
use firehose::rma::expose::ExposeMode;
use firehose::rma::sim_pins::SimPins;
use firehose::rma::Rma;
use firehose::rma::RmaError::{self, RemoteDenied};
use firehose_proto::Rights;
use std::sync::Arc;

#[path = "common/rma_job.rs"]
#[allow(dead_code)]
mod rma_job;
use rma_job::{fh_config, peers, sim_net, unbounded_cache, Servers, BUCKET};

struct Job {
    _servers: Servers,
    rmas: Vec<Arc<Rma>>,
}

fn job(mode: ExposeMode) -> Job {
    let size = 2;
    let net = sim_net(size, 5, 256);
    let rmas: Vec<Arc<Rma>> = (0..size)
        .map(|r| {
            let cache = unbounded_cache(Arc::new(NullPinner));
            let c = fh_config(r, size, 64, 16, 8);
            let pins = Box::new(SimPins::new(net.clone(), r));
            Rma::with_pins_exposed(peers(&net, r), Some(cache), c, pins, mode).unwrap()
        })
        .collect();
    Job {
        _servers: Servers::start(rmas.clone()),
        rmas,
    }
}

/// A page-aligned buffer of `len` bytes (whole pages) filled with `fill`.
struct Mem(Vec<u8>, usize);

impl Mem {
    fn new(len: usize, fill: u8) -> Mem {
        let v = vec![fill; len + BUCKET];
        let off = (BUCKET - v.as_ptr() as usize % BUCKET) % BUCKET;
        Mem(v, off)
    }
    fn addr(&self) -> u64 {
        self.0.as_ptr() as u64 + self.1 as u64
    }
    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        // SAFETY: inside the buffer; no op runs when tests read it (volatile: the simulator
        // wrote it through raw pointers).
        (0..len)
            .map(|i| unsafe { std::ptr::read_volatile(self.0.as_ptr().add(self.1 + off + i)) })
            .collect()
    }
}

/// Rank 0's blocking op on rank 1.
fn op(j: &Job, kind: RdmaKind, raddr: u64, local: &mut [u8]) -> Result<(), RmaError> {
    // SAFETY: `local` outlives the wait.
    let h = unsafe { j.rmas[0].start(kind, 1, raddr, local.as_mut_ptr(), local.len(), false) }?;
    j.rmas[0].wait(h)
}

/// Sizes: inline (a put in a move), a move's small put, one RDMA chunk, several.
const SIZES: [usize; 4] = [8, 1000, 16 << 10, 256 << 10];

#[test]
fn declared_mode_refuses_what_is_not_exposed_and_changes_nothing() {
    let j = job(ExposeMode::Declared);
    let t = &j.rmas[1];
    let mem = Mem::new(2 << 20, 0x5a);
    let half = 1 << 20;
    // The first half exposed for puts and gets, the second not at all.
    t.expose(mem.addr(), half, Rights::BOTH).unwrap();
    for len in SIZES {
        let mut src = vec![0xc3u8; len];
        op(&j, RdmaKind::Write, mem.addr() + 4096, &mut src).unwrap();
        assert_eq!(mem.bytes(4096, len), src, "put of {len} inside");
        let mut dst = vec![0u8; len];
        op(&j, RdmaKind::Read, mem.addr() + 4096, &mut dst).unwrap();
        assert_eq!(dst, src);
        // Outside: refused, bytes unchanged (also straddling the end of the exposure).
        for off in [half, half + 8192, half - len / 2 - 1] {
            let before = mem.bytes(off, len);
            let r = op(&j, RdmaKind::Write, mem.addr() + off as u64, &mut src);
            assert_eq!(r, Err(RemoteDenied), "put of {len} at {off}");
            assert_eq!(mem.bytes(off, len), before, "put of {len} at {off} wrote");
            let r = op(&j, RdmaKind::Read, mem.addr() + off as u64, &mut dst);
            assert_eq!(r, Err(RemoteDenied), "get of {len} at {off}");
        }
    }
    j.rmas[0].check_idle().unwrap();
}

#[test]
fn declared_access_is_per_direction() {
    let j = job(ExposeMode::Declared);
    let t = &j.rmas[1];
    let ro = Mem::new(64 << 10, 1);
    let wo = Mem::new(64 << 10, 2);
    t.expose(ro.addr(), 64 << 10, Rights::READ).unwrap();
    t.expose(wo.addr(), 64 << 10, Rights::WRITE).unwrap();
    for len in SIZES.into_iter().filter(|&l| l <= 32 << 10) {
        let mut b = vec![9u8; len];
        assert_eq!(
            op(&j, RdmaKind::Write, ro.addr(), &mut b),
            Err(RemoteDenied)
        );
        assert_eq!(ro.bytes(0, len), vec![1u8; len]);
        op(&j, RdmaKind::Read, ro.addr(), &mut b).unwrap();
        assert_eq!(b, vec![1u8; len]);
        assert_eq!(op(&j, RdmaKind::Read, wo.addr(), &mut b), Err(RemoteDenied));
        let mut b = vec![7u8; len];
        op(&j, RdmaKind::Write, wo.addr(), &mut b).unwrap();
        assert_eq!(wo.bytes(0, len), b);
    }
}

/// `unexpose` revokes what the peer holds: a put that hit before is refused after, and the
/// target's bytes stay.
#[test]
fn unexpose_revokes_what_peers_hold() {
    let j = job(ExposeMode::Declared);
    let t = &j.rmas[1];
    let mem = Mem::new(64 << 10, 0);
    t.expose(mem.addr(), 64 << 10, Rights::BOTH).unwrap();
    let mut b = vec![4u8; 16 << 10];
    op(&j, RdmaKind::Write, mem.addr(), &mut b).unwrap();
    let hits = j.rmas[0].stats().fh.hits;
    op(&j, RdmaKind::Write, mem.addr(), &mut b).unwrap();
    assert_eq!(j.rmas[0].stats().fh.hits, hits + 1, "held: a hit");
    t.unexpose(mem.addr(), 64 << 10).unwrap();
    assert_eq!(
        t.unexpose(mem.addr(), 64 << 10),
        Err(RmaError::UnknownHandle)
    );
    let mut c = vec![5u8; 16 << 10];
    assert_eq!(
        op(&j, RdmaKind::Write, mem.addr(), &mut c),
        Err(RemoteDenied)
    );
    assert_eq!(mem.bytes(0, 16 << 10), b, "nothing landed after unexpose");
    assert_eq!(t.stats().fh.revokes, 1);
}

/// In both modes a put aimed at the target's own link buffers (its receive ring) is refused,
/// at every size, and a get from them too; `fh_expose` cannot open them.
#[test]
fn the_library_buffers_are_never_a_target() {
    for mode in [ExposeMode::All, ExposeMode::Declared] {
        let j = job(mode);
        let t = &j.rmas[1];
        let lib = t.exposure().library();
        assert!(!lib.is_empty(), "the link reports its buffers");
        let (ring, ring_len) = lib[0];
        t.expose(ring & !(BUCKET as u64 - 1), ring_len + BUCKET, Rights::BOTH)
            .unwrap();
        // SAFETY: the ring is the link's, alive while `j` is; read only.
        let snapshot =
            || unsafe { std::slice::from_raw_parts(ring as *const u8, ring_len).to_vec() };
        let before = snapshot();
        for len in [8, 1000, ring_len] {
            let mut src = vec![0xabu8; len];
            let r = op(&j, RdmaKind::Write, ring, &mut src);
            assert_eq!(r, Err(RemoteDenied), "{mode:?} put of {len}");
            let r = op(&j, RdmaKind::Read, ring, &mut src);
            assert_eq!(r, Err(RemoteDenied), "{mode:?} get of {len}");
        }
        assert_eq!(snapshot(), before, "{mode:?}: the ring was written");
        // The context still works with other memory.
        let mem = Mem::new(8192, 0);
        t.expose(mem.addr(), 8192, Rights::BOTH).unwrap();
        let mut b = vec![3u8; 100];
        op(&j, RdmaKind::Write, mem.addr(), &mut b).unwrap();
        assert_eq!(mem.bytes(0, 100), b);
    }
}
