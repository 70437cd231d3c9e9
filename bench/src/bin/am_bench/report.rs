//! Output: perftest-style tables (`ib_send_lat`'s latency columns, `ib_send_bw`'s rate columns)
//! or one JSON object per test per line (`--json`), printed by rank 0.

use crate::args::Args;
use crate::attn::Attn;
use crate::lat::Lat;
use crate::rate::Rate;
use crate::summary::Summary;
use crate::Ctx;
use serde_json::json;

const RULE: &str =
    "---------------------------------------------------------------------------------------\n";

pub fn header(ctx: &Ctx, a: &Args) -> String {
    let s = ctx.peers.settings();
    format!(
        "{RULE} am_bench: firehose net::Peers active messages, rank 0 -> rank 1 of {}\n \
         payload {} B (+16 B header), FH_AM_RECV_DEPTH {} (window {} messages), max message {} B, requester spins {} us before sleeping\n{RULE}",
        ctx.peers.size(),
        a.size,
        s.recv_depth,
        s.recv_depth - firehose::internals::net::RESERVED,
        s.max_size,
        s.spin.as_micros(),
    )
}

fn lat_row(label: &str, bytes: usize, n: usize, s: &Summary) -> String {
    format!(
        " {bytes:<10} {n:<12} {:<12.2} {:<12.2} {:<14.2} {:<12.2} {:<12.2} {:<18.2} {:<18.2} {label}\n",
        s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999
    )
}

const LAT_COLS: &str = " #bytes     #iterations  t_min[usec]  t_max[usec]  t_typical[usec] t_avg[usec]  t_stdev[usec] 99% percentile[usec] 99.9% percentile[usec]\n";

pub fn lat(r: &Lat, a: &Args) -> String {
    let half = r.rtt.scaled(0.5);
    if a.json {
        return format!(
            "{}\n",
            json!({"test": "lat", "bytes": a.size, "iterations": r.iters,
                   "rtt_us": r.rtt, "half_rtt_us": half})
        );
    }
    format!(
        "AM round trip (request/reply, requester busy-polls wait)\n{LAT_COLS}{}{}{RULE}",
        lat_row("RTT/2 (ib_send_lat's unit)", a.size, r.iters, &half),
        lat_row("RTT", a.size, r.iters, &r.rtt),
    )
}

pub fn rate(r: &Rate, a: &Args) -> String {
    let mb = (r.msgs * a.size) as f64 / r.secs / 1e6;
    if a.json {
        return format!(
            "{}\n",
            json!({"test": "rate", "bytes": a.size, "iterations": r.msgs, "secs": r.secs,
                   "msg_rate_mpps": r.mpps(), "bw_mb_s": mb, "credit_stalls": r.credit_stalls,
                   "credit_only_in": r.credit_only_in})
        );
    }
    format!(
        "AM one-way message rate (until a final request's reply)\n \
         #bytes     #iterations    BW average[MB/sec]   MsgRate[Mpps]   credit stalls  credit-only in\n \
         {:<10} {:<14} {:<20.3} {:<15.6} {:<14} {}\n{RULE}",
        a.size, r.msgs, mb, r.mpps(), r.credit_stalls, r.credit_only_in
    )
}

pub fn attn(r: &Attn, a: &Args) -> String {
    if a.json {
        let phases: Vec<_> = r
            .phases
            .iter()
            .map(|p| json!({"busy": p.busy.name(), "samples": p.samples, "reply_us": p.reply}))
            .collect();
        return format!(
            "{}\n",
            json!({"test": "attn", "bytes": a.size, "block_ms": a.block_ms,
                   "gaps": if a.spin_gaps { "spin" } else { "sleep" },
                   "progress_thread": r.progress_thread, "phases": phases})
        );
    }
    let mut s = format!(
        "Attentiveness: rank 1 busy in {} ms blocks, progress thread {}; reply latency of requests at random times (rank 0 {} in between)\n \
         busy      #samples  t_min[usec]  t_typical[usec]  99% percentile[usec]  t_max[usec]\n",
        a.block_ms,
        if r.progress_thread { "on" } else { "off" },
        if a.spin_gaps { "busy" } else { "asleep" }
    );
    for p in &r.phases {
        s += &format!(
            " {:<9} {:<9} {:<12.1} {:<16.1} {:<21.1} {:.1}\n",
            p.busy.name(),
            p.samples,
            p.reply.min,
            p.reply.typical,
            p.reply.p99,
            p.reply.max
        );
    }
    s + RULE
}
