//! The driver's shape: one `Firehose` per rank behind a Mutex, 16 threads issuing ops at once,
//! each pumping messages between the two ranks when its op is pending. Every op completes, every
//! segment covers its op, the bound holds, and nothing is left in flight.

use firehose_proto::{Acquire, Event, Firehose, FirehoseConfig, OpId, PinFailure, RegionPins};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Pins {
    next: u32,
    pinned: u64,
}
impl RegionPins for Pins {
    fn pin(&mut self, _: u64, len: usize, _: firehose_proto::Rights) -> Result<u32, PinFailure> {
        self.next += 1;
        self.pinned += len as u64;
        Ok(self.next)
    }
    fn unpin(&mut self, _: u64, len: usize, _: u32) {
        self.pinned -= len as u64;
    }
    fn write(&mut self, _: u64, _: &[u8]) -> Result<(), PinFailure> {
        Ok(())
    }
}

/// Both ranks and the events nobody has claimed yet, under one lock (lock order is trivial).
struct Job {
    fh: [Firehose; 2],
    pins: [Pins; 2],
    events: HashMap<OpId, Event>,
}

impl Job {
    fn pump(&mut self) {
        for from in 0..2 {
            while let Some((to, m)) = self.fh[from].poll_transmit() {
                let to = to as usize;
                let (f, p) = (&mut self.fh[to], &mut self.pins[to]);
                f.handle_message(from as u32, &m, p).expect("in protocol");
            }
            while let Some(e) = self.fh[from].poll_event() {
                let op = match &e {
                    Event::Ready { op, .. } | Event::Failed { op, .. } | Event::PutDone { op } => {
                        *op
                    }
                };
                self.events.insert(op, e);
            }
        }
    }
}

#[test]
fn sixteen_threads_through_a_mutex() {
    let cfg = |r| {
        let mut c = FirehoseConfig::new(r, 2);
        c.bucket_size = 4096;
        c.m_bytes = 64 * 4096;
        c.max_victim_bytes = 16 * 4096;
        c.max_region_buckets = 4;
        c
    };
    let job = Arc::new(Mutex::new(Job {
        fh: [
            Firehose::new(cfg(0)).unwrap(),
            Firehose::new(cfg(1)).unwrap(),
        ],
        pins: [Pins::default(), Pins::default()],
        events: HashMap::new(),
    }));
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let job = job.clone();
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(t + 1);
                for i in 0..2000u64 {
                    let s = rng.u64(..);
                    let from = (s % 2) as usize;
                    let addr = 0x10_0000 + (s >> 8) % (256 * 4096);
                    let len = 1 + (s >> 40) as usize % 5000;
                    let op = (t << 32) | i;
                    let segs = {
                        let mut j = job.lock().unwrap();
                        match j.fh[from]
                            .acquire(op, 1 - from as u32, addr, len, None)
                            .unwrap()
                        {
                            Acquire::Hit(segs) => segs,
                            Acquire::Pending => loop {
                                j.pump();
                                if let Some(e) = j.events.remove(&op) {
                                    match e {
                                        Event::Ready { segs, .. } => break segs,
                                        e => panic!("{e:?}"),
                                    }
                                }
                                drop(j);
                                std::thread::yield_now();
                                j = job.lock().unwrap();
                            },
                            Acquire::DoneInMove => unreachable!(),
                        }
                    };
                    assert_eq!(segs.iter().map(|s| s.len).sum::<usize>(), len);
                    assert_eq!(segs[0].raddr, addr);
                    let mut j = job.lock().unwrap();
                    j.fh[from].release(op).unwrap();
                    j.pump();
                    for r in 0..2 {
                        assert!(j.fh[r].pinned_bytes() <= (64 + 16) * 4096);
                        j.fh[r].check_invariants().unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut j = job.lock().unwrap();
    j.pump();
    for r in 0..2 {
        assert_eq!(j.fh[r].ops_in_flight(), 0);
        assert_eq!(j.fh[r].pinned_bytes(), j.pins[r].pinned);
    }
    assert!(j.events.is_empty());
}
