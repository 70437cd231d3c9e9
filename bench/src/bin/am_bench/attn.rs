//! Attentiveness: how soon a rank that is busy with its own work answers a peer. Rank 1 runs
//! blocks of `--block-ms` (first busy compute, then sleep) and calls `progress` only between
//! blocks; with `FH_PROGRESS_THREAD=1` its progress thread answers meanwhile. Rank 0 sends ECHO
//! requests at random times (uniform gaps below one block, so they land anywhere in a block) and
//! times each reply. Without the thread a reply waits for the end of the block: half a block on
//! average.

use crate::args::Args;
use crate::pace;
use crate::summary::Summary;
use crate::{fail, Ctx, ECHO};
use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    Compute,
    Sleep,
}

impl Busy {
    pub fn name(self) -> &'static str {
        match self {
            Busy::Compute => "compute",
            Busy::Sleep => "sleep",
        }
    }
}

pub struct Phase {
    pub busy: Busy,
    /// Reply latencies in microseconds.
    pub reply: Summary,
    pub samples: usize,
}

pub struct Attn {
    pub progress_thread: bool,
    pub phases: Vec<Phase>,
}

const PHASES: [Busy; 2] = [Busy::Compute, Busy::Sleep];

pub fn run(ctx: &Ctx, a: &Args) -> Option<Attn> {
    match ctx.peers.rank() {
        0 => {
            let phases = PHASES.iter().map(|&b| ask(ctx, a, b)).collect();
            // mpirun -x gives every rank the same environment; rank 1 applies it (main.rs).
            Some(Attn {
                // `auto` (the default) is on in this 2-rank job.
                progress_thread: std::env::var("FH_PROGRESS_THREAD")
                    .map_or(true, |v| !matches!(v.trim(), "0" | "no" | "off" | "false")),
                phases,
            })
        }
        1 => {
            for b in PHASES {
                work(ctx, a, b);
                ctx.barrier(b.name());
            }
            None
        }
        _ => {
            for b in PHASES {
                ctx.barrier(b.name());
            }
            None
        }
    }
}

/// Rank 1: blocks of work until STOP; progress only between blocks unless a thread does it.
fn work(ctx: &Ctx, a: &Args, b: Busy) {
    let block = Duration::from_millis(a.block_ms);
    let threaded = ctx.peers.am().has_progress_thread();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    while !ctx.stop.swap(false, Ordering::AcqRel) {
        match b {
            Busy::Sleep => std::thread::sleep(block),
            Busy::Compute => x = pace::compute(block, x),
        }
        if !threaded {
            if let Err(e) = ctx.peers.progress() {
                fail(format!("rank 1: progress: {e:?}"));
            }
        }
    }
    black_box(x);
}

/// Rank 0: requests at random times (sleeping or busy in between, `--attn-gaps`), each reply
/// timed; then STOP and the phase's barrier.
fn ask(ctx: &Ctx, a: &Args, b: Busy) -> Phase {
    let am = ctx.peers.am();
    let msg = vec![0x3Cu8; a.size];
    let mut rng = pace::rng(b as usize);
    let block_us = a.block_ms * 1000;
    let mut us = Vec::with_capacity(a.attn_samples);
    for _ in 0..a.attn_samples {
        let gap = Duration::from_micros(rng.u64(..block_us));
        if a.spin_gaps {
            // Busy, as rank 0 is through the lat test: the reply time then holds no wake-up
            // of the requester itself.
            let end = Instant::now() + gap;
            while Instant::now() < end {
                std::hint::spin_loop();
            }
        } else {
            std::thread::sleep(gap);
        }
        let t = Instant::now();
        let r = am
            .call(1, ECHO, &msg)
            .unwrap_or_else(|e| fail(format!("attn request: {e:?}")));
        us.push(t.elapsed().as_secs_f64() * 1e6);
        if r.len() != msg.len() {
            fail("attn reply length");
        }
    }
    ctx.stop_responder();
    ctx.barrier(b.name());
    Phase {
        busy: b,
        reply: Summary::of(&us),
        samples: us.len(),
    }
}
