//! Rights per operation in the sans-IO algorithm: a get asks the target for a
//! read-only pin, a put for a write-only one; a chunk used both ways is upgraded to one region
//! with both (never to one with fewer than the firehose it replaces); a target reuses a region
//! only for pins it has the rights for; the bound, the refcounts and the invariants hold all
//! along. The driver's side (verbs access flags, read-only memory) is in `tests/rma_sim_rights.rs`.

use firehose_proto::{Acquire, Event, Firehose, FirehoseConfig, PinFailure, RegionPins, Rights};

const BASE: u64 = 0x4000_0000;
const PAGE: u64 = 4096;

/// Target pins that log the rights of every pin and check the bound at each.
#[derive(Default)]
struct Log {
    pins: Vec<(u64, usize, Rights)>,
    live: std::collections::HashMap<u32, usize>,
    bytes: u64,
    bound: u64,
    next: u32,
}

impl RegionPins for Log {
    fn pin(&mut self, addr: u64, len: usize, rights: Rights) -> Result<u32, PinFailure> {
        self.pins.push((addr, len, rights));
        self.next += 1;
        self.live.insert(self.next, len);
        self.bytes += len as u64;
        assert!(self.bytes <= self.bound, "pinned {} > bound", self.bytes);
        Ok(self.next)
    }
    fn unpin(&mut self, _: u64, len: usize, rkey: u32) {
        assert_eq!(
            self.live.remove(&rkey),
            Some(len),
            "unpin of an unknown region"
        );
        self.bytes -= len as u64;
    }
    fn write(&mut self, _: u64, _: &[u8]) -> Result<(), PinFailure> {
        Ok(())
    }
}

/// `size` ranks, regions of 4 pages, 4 regions per peer, MAXVICTIM one region.
fn world(size: u32) -> (Vec<Firehose>, Vec<Log>) {
    let fhs: Vec<Firehose> = (0..size)
        .map(|r| {
            let mut c = FirehoseConfig::new(r, size);
            c.bucket_size = PAGE as usize;
            c.max_region_buckets = 4;
            c.m_bytes = 16 * PAGE as usize * (size as usize - 1);
            c.max_victim_bytes = 4 * PAGE as usize;
            Firehose::new(c).unwrap()
        })
        .collect();
    let logs = fhs
        .iter()
        .map(|f| Log {
            bound: (f.config().m_bytes + f.config().max_victim_bytes) as u64,
            ..Log::default()
        })
        .collect();
    (fhs, logs)
}

/// Carries every message until none is left; returns the events of every rank.
fn settle(fhs: &mut [Firehose], logs: &mut [Log]) -> Vec<(usize, Event)> {
    let mut evs = Vec::new();
    loop {
        let mut moved = false;
        for from in 0..fhs.len() {
            while let Some((to, m)) = fhs[from].poll_transmit() {
                moved = true;
                fhs[to as usize]
                    .handle_message(from as u32, &m, &mut logs[to as usize])
                    .unwrap();
            }
            while let Some(e) = fhs[from].poll_event() {
                evs.push((from, e));
            }
        }
        for f in fhs.iter() {
            f.check_invariants().unwrap();
        }
        if !moved {
            return evs;
        }
    }
}

/// One op of `from` on rank `to`'s page `page` (8 bytes), run to its end and released.
/// Whether it hit.
fn op(
    fhs: &mut [Firehose],
    logs: &mut [Log],
    from: usize,
    to: u32,
    id: u64,
    page: u64,
    rights: Rights,
) -> bool {
    let a = fhs[from]
        .acquire_for(id, to, BASE + page * PAGE, 8, rights, None)
        .unwrap();
    let hit = matches!(a, Acquire::Hit(_));
    if !hit {
        let evs = settle(fhs, logs);
        assert!(
            evs.iter()
                .any(|(r, e)| *r == from && matches!(e, Event::Ready { op, .. } if *op == id)),
            "op {id} not ready: {evs:?}"
        );
    }
    fhs[from].release(id).unwrap();
    settle(fhs, logs);
    hit
}

#[test]
fn a_get_pins_read_only_and_a_put_upgrades_the_chunk() {
    let (mut f, mut l) = world(2);
    assert!(!op(&mut f, &mut l, 0, 1, 1, 0, Rights::READ), "get misses");
    assert_eq!(
        l[1].pins.last().unwrap().2,
        Rights::READ,
        "a get pins read-only"
    );
    assert!(op(&mut f, &mut l, 0, 1, 2, 1, Rights::READ), "get hits");
    // A put on the read-only chunk misses and asks for both rights (an upgrade).
    assert!(!op(&mut f, &mut l, 0, 1, 3, 0, Rights::WRITE), "put misses");
    assert_eq!(l[1].pins.len(), 2);
    assert_eq!(l[1].pins[1].2, Rights::BOTH, "the chunk is upgraded");
    assert_eq!(l[1].pins[1].0, l[1].pins[0].0, "same chunk");
    // From then on both hit.
    assert!(op(&mut f, &mut l, 0, 1, 4, 2, Rights::WRITE));
    assert!(op(&mut f, &mut l, 0, 1, 5, 3, Rights::READ));
    assert_eq!(l[1].pins.len(), 2);
    // The read-only region is still pinned (held, unused) until quota is needed: filling the
    // quota with other chunks evicts it, and every region is accounted for.
    for (i, chunk) in (1..8u64).enumerate() {
        op(&mut f, &mut l, 0, 1, 10 + i as u64, chunk * 4, Rights::READ);
    }
    assert!(f[1].pinned_bytes() <= l[1].bound);
    assert_eq!(f[1].pinned_bytes(), l[1].bytes);
    assert_eq!(f[0].refs_held(), 0);
}

#[test]
fn a_put_pins_write_only_and_a_get_upgrades() {
    let (mut f, mut l) = world(2);
    assert!(!op(&mut f, &mut l, 0, 1, 1, 5, Rights::WRITE));
    assert_eq!(l[1].pins[0].2, Rights::WRITE, "a put pins write-only");
    assert!(op(&mut f, &mut l, 0, 1, 2, 5, Rights::WRITE));
    assert!(
        !op(&mut f, &mut l, 0, 1, 3, 5, Rights::READ),
        "no read through a write key"
    );
    assert_eq!(l[1].pins[1].2, Rights::BOTH);
    assert!(op(&mut f, &mut l, 0, 1, 4, 6, Rights::WRITE));
}

/// A small put that rides in a move pins what it goes along with for writing only.
#[test]
fn a_put_in_a_move_pins_for_writing() {
    let (mut f, mut l) = world(2);
    let a = f[0]
        .acquire_for(1, 1, BASE, 8, Rights::WRITE, Some(&[1u8; 8]))
        .unwrap();
    assert_eq!(a, Acquire::DoneInMove);
    let evs = settle(&mut f, &mut l);
    assert!(evs
        .iter()
        .any(|(_, e)| matches!(e, Event::PutDone { op: 1 })));
    assert_eq!(l[1].pins[0].2, Rights::WRITE);
    // A small put with read rights only is refused (nothing sent).
    assert!(f[0]
        .acquire_for(2, 1, BASE + 5 * PAGE, 8, Rights::READ, Some(&[1u8; 8]))
        .is_err());
    assert!(f[0]
        .acquire_for(2, 1, BASE + 5 * PAGE, 8, Rights(0), None)
        .is_err());
    assert!(f[0].poll_transmit().is_none());
}

/// A target shares a region between peers only when it has the rights asked for: rank 2's put
/// does not get rank 0's read-only region (nor does rank 0's key gain a write right); rank 0's
/// later get may use rank 2's region only if it has read rights (it does not: a new pin).
#[test]
fn a_region_serves_only_pins_it_has_the_rights_for() {
    let (mut f, mut l) = world(3);
    assert!(!op(&mut f, &mut l, 0, 1, 1, 0, Rights::READ));
    assert!(!op(&mut f, &mut l, 2, 1, 2, 0, Rights::WRITE));
    let rights: Vec<Rights> = l[1].pins.iter().map(|p| p.2).collect();
    assert_eq!(rights, [Rights::READ, Rights::WRITE]);
    // Rank 2 reads: upgraded to both; then rank 0 writes: shares rank 2's region (both).
    assert!(!op(&mut f, &mut l, 2, 1, 3, 0, Rights::READ));
    assert_eq!(l[1].pins.last().unwrap().2, Rights::BOTH);
    let n = l[1].pins.len();
    assert!(!op(&mut f, &mut l, 0, 1, 4, 0, Rights::WRITE));
    assert_eq!(l[1].pins.len(), n, "shared, not pinned again");
    assert_eq!(f[1].stats().shared_hits, 1);
}

#[path = "../../../tests/common/sim_mem.rs"]
#[allow(dead_code)]
mod sim_mem;
#[path = "firehose_sim/world.rs"]
#[allow(dead_code)]
mod world;

/// The deterministic simulation (`tests/firehose_sim.rs`: reordering, unmaps, lost peers,
/// adaptive lending, every invariant after every step) with gets and puts mixed at random, so
/// chunks are pinned read-only, write-only and upgraded under all of it; every segment goes
/// through a key with the op's rights (checked in `World::start_rdma`).
#[test]
fn simulation_with_mixed_rights() {
    let mut upgrades = 0u64;
    let mut hits = 0u64;
    for seed in 0..60u64 {
        let mut g = world::Rng::new(seed ^ 0x5151);
        let n = 2 + (seed % 5) as u32;
        let region_buckets = [1u32, 2, 4, 8][g.below(4) as usize];
        let f = (2 * region_buckets as u64).max([4u64, 8, 16][g.below(3) as usize]);
        let victim = [0, f / 2, f][g.below(3) as usize];
        let ws = [(f / 2).max(2), f + victim / 2, 8 * f][(seed % 3) as usize] as usize;
        let mut cfg = FirehoseConfig::new(0, n);
        cfg.bucket_size = 4096;
        cfg.m_bytes = (f * (n as u64 - 1)) as usize * 4096;
        cfg.max_region_buckets = region_buckets;
        let p = world::Params {
            n,
            bucket: 4096,
            region_buckets,
            f_buckets: f,
            victim_buckets: victim,
            pages: ws + 16,
            ws_pages: ws,
            max_len: cfg.max_op_len().min(12 * 4096),
            adaptive: g.chance(30),
            busy: (0..n).collect(),
            target: vec![],
            len_max: 0,
        };
        let mut w = world::World::new(p, seed);
        w.mixed_rights = true;
        let unmap = if seed % 2 == 0 { 6 } else { 0 };
        for i in 0..1500 {
            if n > 2 && seed % 10 == 7 && i == 750 {
                w.lose((seed % n as u64) as u32);
            }
            w.step(45, unmap);
        }
        w.drain();
        hits += w.fh.iter().map(|f| f.stats().hits).sum::<u64>();
        upgrades += w
            .mem
            .iter()
            .flat_map(|m| m.mrs.values())
            .filter(|mr| mr.rights == Rights::BOTH)
            .count() as u64;
    }
    eprintln!("hits {hits}, regions with both rights left pinned {upgrades}");
    assert!(
        hits > 1000 && upgrades > 0,
        "hits {hits} upgrades {upgrades}"
    );
}
