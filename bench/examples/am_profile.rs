//! The active-message layer's own work per message, without a device: two endpoints over the
//! simulated link in one thread, for instruction-level profiling, e.g.
//!
//! ```text
//! cargo build --release -p firehose-bench --example am_profile
//! valgrind --tool=callgrind target/release/examples/am_profile rtt 100000
//! valgrind --tool=callgrind target/release/examples/am_profile rate 100000
//! ```
//!
//! `rtt`: request, the responder's progress (handler + reply), the requester's `wait`.
//! `rate`: one-way messages in bursts of the credit window, the receiver progressing after each
//! burst and the sender after that (credits come back), as the rate bench's pipeline does.
//! The simulator's own work (a mutex, a `Vec` per message) is in the count too: compare runs,
//! and read the per-function split (`callgrind_annotate`) for the AM layer's share.
use std::sync::Arc;
use std::time::{Duration, Instant};

use firehose::internals::net::Am;
use firehose::internals::net::NetSettings;
use firehose::internals::net::{Delivery, SimConfig, SimNet};

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "rtt".into());
    let n: usize = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let mut cfg = SimConfig::new(2, 1, Delivery::Auto);
    cfg.slots = 32;
    let net = SimNet::new(cfg);
    let s = NetSettings {
        spin: Duration::from_secs(1),
        ..NetSettings::default()
    };
    let a = Am::new(net.link(0), s).expect("endpoint 0");
    let b = Am::new(net.link(1), s).expect("endpoint 1");
    b.register_request(1, |_, p, r| {
        let _ = r.reply(p);
    });
    let sunk = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let k = sunk.clone();
    b.register_oneway(2, move |_, _| {
        k.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    let msg = [0x5Au8; 8];
    let t0 = Instant::now();
    match what.as_str() {
        "rtt" => {
            for _ in 0..n {
                let t = a.request(1, 1, &msg).expect("request");
                b.progress().expect("progress");
                let r = a.wait(t, None).expect("wait");
                assert_eq!(r.len(), msg.len());
            }
        }
        "rate" => {
            let window = 29;
            let mut sent = 0;
            while sent < n {
                for _ in 0..window.min(n - sent) {
                    a.send_oneway(1, 2, &msg).expect("send");
                    sent += 1;
                }
                b.progress().expect("progress b");
                a.progress().expect("progress a");
            }
            while sunk.load(std::sync::atomic::Ordering::Relaxed) < n as u64 {
                b.progress().expect("progress b");
                a.progress().expect("progress a");
            }
        }
        _ => {
            eprintln!("usage: am_profile rtt|rate [N]");
            std::process::exit(2);
        }
    }
    let dt = t0.elapsed();
    println!(
        "{what}: {n} in {:.3} s, {:.0} ns each; credit stalls {}",
        dt.as_secs_f64(),
        dt.as_nanos() as f64 / n as f64,
        a.stats().credit_stalls
    );
}
