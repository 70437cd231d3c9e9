//! The modelled rows: the same programs through the helper's planner on a modelled clock
//! (`firehose::internals::helper::sim`), with the backend's pin and unpin costs calibrated on the real
//! backend and each transfer's time measured here. Deterministic: what the helper does when it
//! gets the idle core the paper's placement policy asks for, which this shared, loaded host
//! cannot give the measured rows (a 400 us computation was seen to take 15 ms there).

use std::sync::Arc;
use std::time::Instant;

use firehose::internals::helper::cost;
use firehose::internals::helper::sim::{self, Costs, Outcome, Step};
use firehose::internals::helper::Key;
use firehose::internals::pin::Pinner;

use crate::workload::Program;
use crate::Mode;

/// The calibrated costs: (ns, ns per page) for pin and unpin.
pub fn costs(backend: &Arc<dyn Pinner>) -> Costs {
    let m = cost::calibrate(&**backend, 1 << 20);
    let line = |f: &cost::Fit| {
        let (a, b) = f.line().unwrap_or(m.fallback);
        (a as u64, b as u64)
    };
    Costs {
        pin: line(&m.pin),
        unpin: line(&m.unpin),
        poll: 500_000,
    }
}

/// Median time of copying `len` bytes between two resident buffers (the transfer).
pub fn copy_ns(len: usize) -> u64 {
    let a = vec![1u8; len];
    let mut b = vec![0u8; len];
    let mut t: Vec<u64> = (0..7)
        .map(|_| {
            let t0 = Instant::now();
            b.copy_from_slice(&a);
            std::hint::black_box(&b);
            t0.elapsed().as_nanos() as u64
        })
        .collect();
    t.sort_unstable();
    t[t.len() / 2]
}

/// The program as the simulation's steps.
pub fn steps(p: &Program) -> Vec<Step> {
    let hold: Vec<u64> = p.bufs.iter().map(|&l| copy_ns(l)).collect();
    p.steps
        .iter()
        .map(|s| {
            let start = (s.buf + 1) << 32;
            Step {
                site: s.site,
                key: Key {
                    start,
                    end: start + p.bufs[s.buf],
                    access: 1 | 4,
                },
                hold: hold[s.buf],
                compute: s.compute_us * 1000,
            }
        })
        .collect()
}

pub fn run(steps: &[Step], mode: Mode, costs: Costs) -> Outcome {
    let m = match mode {
        Mode::NoCache => sim::Mode::NoCache,
        Mode::Lazy => sim::Mode::Lazy,
        Mode::Helper | Mode::Tracked => sim::Mode::Helper(mode.planner()),
    };
    sim::simulate(steps, m, costs)
}
