//! One-way message rate: rank 0 sends `--msgs` SINK messages to rank 1 as fast as credits allow
//! (the window is the receiver's data slots, FH_AM_RECV_DEPTH minus the reserved ones), then a
//! COUNT request; the clock stops at its reply, which can only come after every message was
//! handled. Rate = messages / that time.

use crate::args::Args;
use crate::{fail, Ctx, COUNT, SINK};
use std::time::Instant;

pub struct Rate {
    pub msgs: usize,
    pub secs: f64,
    /// Sends that found no credit and were queued.
    pub credit_stalls: u64,
    /// Credit-only messages rank 0 received (credits the receiver could not piggyback).
    pub credit_only_in: u64,
}

impl Rate {
    pub fn mpps(&self) -> f64 {
        self.msgs as f64 / self.secs / 1e6
    }
}

pub fn run(ctx: &Ctx, a: &Args) -> Option<Rate> {
    match ctx.peers.rank() {
        0 => Some(measure(ctx, a)),
        1 => {
            ctx.serve();
            None
        }
        _ => None,
    }
}

/// Sends `n` one-way messages, progressing every few sends so returned credits flush the queue.
fn burst(ctx: &Ctx, n: usize, msg: &[u8]) {
    let am = ctx.peers.am();
    for i in 0..n {
        if let Err(e) = am.send_oneway(1, SINK, msg) {
            fail(format!("send_oneway: {e:?}"));
        }
        if i % 8 == 7 {
            let _ = ctx.peers.progress();
        }
    }
}

/// How many SINK messages rank 1 has handled (after everything sent before this call).
fn count(ctx: &Ctx) -> u64 {
    let r = ctx
        .peers
        .am()
        .call(1, COUNT, &[])
        .unwrap_or_else(|e| fail(format!("COUNT: {e:?}")));
    u64::from_le_bytes(r.try_into().unwrap_or_else(|_| fail("COUNT reply length")))
}

fn measure(ctx: &Ctx, a: &Args) -> Rate {
    let msg = vec![0xA5u8; a.size];
    burst(ctx, a.warmup, &msg);
    let before = count(ctx);
    let s0 = ctx.peers.am().stats();
    let t0 = Instant::now();
    burst(ctx, a.msgs, &msg);
    let after = count(ctx);
    let secs = t0.elapsed().as_secs_f64();
    let s1 = ctx.peers.am().stats();
    if after - before != a.msgs as u64 {
        fail(format!(
            "rank 1 handled {} of {} messages",
            after - before,
            a.msgs
        ));
    }
    ctx.stop_responder();
    let credit_only = |s: &firehose::internals::net::StatsSnapshot| {
        s.received(firehose::internals::net::WireKind::CreditOnly)
    };
    Rate {
        msgs: a.msgs,
        secs,
        credit_stalls: s1.credit_stalls - s0.credit_stalls,
        credit_only_in: credit_only(&s1) - credit_only(&s0),
    }
}
