//! Command-line options of am_bench, parsed with `lexopt` like the other bench binaries.

use std::ffi::OsString;

use crate::cli::num;
use lexopt::prelude::*;

/// One measurement of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// Request/reply round trip, the requester busy-polling `wait`.
    Lat,
    /// One-way messages, rate at the sender after a final acknowledgement.
    Rate,
    /// Reply latency while the responder computes (or sleeps) in long blocks.
    Attn,
}

impl Test {
    pub fn name(self) -> &'static str {
        match self {
            Test::Lat => "lat",
            Test::Rate => "rate",
            Test::Attn => "attn",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Args {
    pub tests: Vec<Test>,
    pub size: usize,
    /// Timed round trips of `lat`.
    pub iters: usize,
    /// Timed one-way messages of `rate`.
    pub msgs: usize,
    /// Untimed round trips / messages before each timed loop.
    pub warmup: usize,
    /// Timed requests per phase of `attn`.
    pub attn_samples: usize,
    /// Length of one responder compute (or sleep) block in `attn`.
    pub block_ms: u64,
    /// How rank 0 waits between `attn` requests: busy (true) or asleep.
    pub spin_gaps: bool,
    pub json: bool,
}

pub const USAGE: &str = "\
usage: mpirun -np 2 am_bench [--test lat,rate,attn] [--size 8] [--iters 2000] [--msgs 20000]
                             [--warmup 200] [--attn-samples 40] [--block-ms 100]
                             [--attn-gaps sleep|spin] [--json]
  Active messages of net::Peers (PeersConfig::from_env), rank 0 -> rank 1 (other ranks idle).
  lat:  request/reply round trip, requester busy-polling wait; RTT and RTT/2 (ib_send_lat's unit).
  rate: one-way messages; rate = messages / time until a final request's reply (sender side).
  attn: rank 1 computes (then sleeps) in --block-ms blocks, calling progress only between blocks;
        rank 0 sends requests at random times. FH_PROGRESS_THREAD applies to rank 1 only here.
        --attn-gaps: rank 0 sleeps between requests (default) or busy-waits, as in lat, so
        that its own wake-up from a sleep is not in the reply time.
  --json: one JSON object per test per line (rank 0 only prints).
";

fn tests(list: &str) -> Result<Vec<Test>, lexopt::Error> {
    list.split(',')
        .map(|t| match t.trim() {
            "lat" => Ok(Test::Lat),
            "rate" => Ok(Test::Rate),
            "attn" => Ok(Test::Attn),
            other => Err(format!("--test: {other:?} is not lat, rate or attn").into()),
        })
        .collect()
}

/// Parse the arguments (without the program name); `Err("")` means help was asked for.
pub fn parse<I: IntoIterator<Item: Into<OsString>>>(args: I) -> Result<Args, String> {
    crate::cli::parse(args, from_parser)
}

fn from_parser(mut p: lexopt::Parser) -> Result<Option<Args>, lexopt::Error> {
    let mut a = Args {
        tests: vec![Test::Lat, Test::Rate, Test::Attn],
        size: 8,
        iters: 2000,
        msgs: 20000,
        warmup: 200,
        attn_samples: 40,
        block_ms: 100,
        spin_gaps: false,
        json: false,
    };
    while let Some(arg) = p.next()? {
        match arg {
            Long("test") => a.tests = tests(&p.value()?.string()?)?,
            Long("size") => a.size = num(&mut p, "--size")?,
            Long("iters") => a.iters = num(&mut p, "--iters")?,
            Long("msgs") => a.msgs = num(&mut p, "--msgs")?,
            Long("warmup") => a.warmup = num(&mut p, "--warmup")?,
            Long("attn-samples") => a.attn_samples = num(&mut p, "--attn-samples")?,
            Long("block-ms") => a.block_ms = num(&mut p, "--block-ms")?,
            Long("attn-gaps") => {
                a.spin_gaps = match p.value()?.string()?.as_str() {
                    "spin" => true,
                    "sleep" => false,
                    other => {
                        return Err(format!("--attn-gaps: {other:?} is not sleep or spin").into())
                    }
                }
            }
            Long("json") => a.json = true,
            Short('h') | Long("help") => return Ok(None),
            _ => return Err(arg.unexpected()),
        }
    }
    if a.iters == 0 || a.msgs == 0 || a.attn_samples == 0 || a.block_ms == 0 {
        return Err("--iters, --msgs, --attn-samples and --block-ms must be > 0".into());
    }
    Ok(Some(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_lists() {
        let a = parse(Vec::<String>::new()).unwrap();
        assert_eq!(a.tests, vec![Test::Lat, Test::Rate, Test::Attn]);
        assert_eq!(a.size, 8);
        let a = parse(["--test", "rate,lat", "--iters", "5", "--json"]).unwrap();
        assert_eq!(a.tests, vec![Test::Rate, Test::Lat]);
        assert_eq!(a.iters, 5);
        assert!(a.json);
        assert!(!a.spin_gaps);
        assert!(parse(["--attn-gaps", "spin"]).unwrap().spin_gaps);
        assert!(parse(["--attn-gaps", "nap"]).is_err());
        assert!(parse(["--test", "bw"]).is_err());
        assert!(parse(["--iters", "0"]).is_err());
        assert_eq!(parse(["--help"]).unwrap_err(), "");
    }
}
