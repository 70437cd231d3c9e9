//! Request/reply round trip: rank 0 sends an ECHO request to rank 1 and busy-polls `wait` for
//! the reply, one at a time; rank 1 busy-polls `progress`. Half the round trip is what
//! perftest's `ib_send_lat` reports as latency, so both are kept.

use crate::args::Args;
use crate::clock::ns_per_tick;
use crate::summary::Summary;
use crate::{fail, Ctx, ECHO};
use std::time::Instant;

pub struct Lat {
    pub iters: usize,
    /// Round trips in microseconds.
    pub rtt: Summary,
}

/// `Some` on rank 0 (the measuring side), `None` elsewhere.
pub fn run(ctx: &Ctx, a: &Args) -> Option<Lat> {
    match ctx.peers.rank() {
        0 => Some(measure(ctx, a)),
        1 => {
            ctx.serve();
            None
        }
        _ => None,
    }
}

fn measure(ctx: &Ctx, a: &Args) -> Lat {
    let am = ctx.peers.am();
    let msg = vec![0x5Au8; a.size];
    let round = || {
        let t = am
            .request(1, ECHO, &msg)
            .unwrap_or_else(|e| fail(format!("request: {e:?}")));
        let r = am
            .wait(t, None)
            .unwrap_or_else(|e| fail(format!("wait: {e:?}")));
        if r.len() != msg.len() {
            fail(format!("reply of {} bytes to {}", r.len(), msg.len()));
        }
    };
    for _ in 0..a.warmup {
        round();
    }
    let mut ticks = Vec::with_capacity(a.iters);
    let (t0, c0) = (Instant::now(), ctx.clock.now());
    for _ in 0..a.iters {
        let c = ctx.clock.now();
        round();
        ticks.push(ctx.clock.now() - c);
    }
    let f = ns_per_tick(
        crate::clock::Kind::default_for_target(),
        ctx.clock.now() - c0,
        t0.elapsed().as_nanos() as u64,
    );
    ctx.stop_responder();
    let us: Vec<f64> = ticks.iter().map(|&t| t as f64 * f / 1e3).collect();
    Lat {
        iters: a.iters,
        rtt: Summary::of(&us),
    }
}
