//! Command-line options of fh_bench, parsed with `lexopt` like the other bench binaries.

use std::ffi::OsString;

use crate::cli::num;
use lexopt::prelude::*;

/// One part of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// Fig. 3: 8-byte put latency over the random remote working set.
    Lat,
    /// Fig. 4: 64 KiB put bandwidth over the same sweep.
    Bw,
    /// Fig. 5: put bandwidth by message size, working set = one message.
    Peak,
    /// Table 3: bitonic sort of a distributed array over puts, every rank.
    App,
    /// fh_put / fh_get with the library's defaults against the floor: 8-byte put and get
    /// latency on hits, 64 KiB put and get bandwidth (scripts/bench-rma-compare).
    Rma,
}

impl Test {
    pub fn name(self) -> &'static str {
        match self {
            Test::Lat => "lat",
            Test::Bw => "bw",
            Test::Peak => "peak",
            Test::App => "app",
            Test::Rma => "rma",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Args {
    pub tests: Vec<Test>,
    /// Working sets of the sweeps (bytes); empty: derived from M and MAXVICTIM.
    pub sweep: Vec<usize>,
    /// Timed puts per point of `lat` (firehose, floor, rendezvous no-unpin).
    pub iters: usize,
    /// Timed puts per point of `lat` for rendezvous with-unpin (a registration each).
    pub unpin_iters: usize,
    /// Untimed puts before each timed loop (at least enough to touch the working set).
    pub warmup: usize,
    /// Timed puts per point of `bw`.
    pub bw_msgs: usize,
    /// Bytes per put of `bw`.
    pub bw_size: usize,
    /// Puts in flight at once in `bw`, `peak` and `app`.
    pub window: usize,
    /// Sizes of `peak`.
    pub sizes: Vec<usize>,
    /// Bytes moved per point of `peak` (the count is clamped to 20..=2000 puts).
    pub peak_bytes: usize,
    /// `app`: keys (u64) per rank, repetitions, bytes per put.
    pub app_keys: usize,
    pub app_reps: usize,
    pub app_chunk: usize,
    /// Timed batches per latency point (typical = median of the batch means).
    pub batches: usize,
    /// Only these transports (names as in the tables); empty: all four (`rma`: floor and
    /// firehose).
    pub series: Vec<String>,
    /// `rma`: only these of its four points (`RMA_POINTS`); empty: all (a profile of one).
    pub rma_points: Vec<String>,
    pub json: bool,
    /// Also write the JSON document to this file (the tables still go to stdout).
    pub json_out: Option<std::path::PathBuf>,
}

pub const USAGE: &str = "\
usage: mpirun -np 2 fh_bench [--test lat,bw,peak] [--sweep 128k,256k,...] [--iters 2000]
                             [--unpin-iters 500] [--warmup 500] [--bw-msgs 256] [--bw-size 64k]
                             [--window 16] [--sizes 8,64,...,1m] [--peak-bytes 4m] [--batches 5]
                             [--series floor,firehose,...] [--quick] [--json] [--json-out FILE]
       mpirun -np 4 fh_bench --test app [--app-keys 262144] [--app-reps 3] [--app-chunk 64k]
       mpirun -np 2 fh_bench --test rma [--iters 2000] [--warmup 500] [--bw-msgs 256] [--window 16]
                                        [--series floor,firehose] [--rma-points put-lat,...,get-bw]
  Firehose puts (rma::Rma) side by side with Rendezvous no-unpin, Rendezvous with-unpin and the
  registered-once floor, all on the same net::Peers endpoint (rank 0 -> rank 1; Bell & Bonachea
  2003, Figs. 3-5 and Table 3). FH_M and FH_MAXVICTIM set the sweep (default: 0.25x..4x of M).
  lat:  8-byte blocking puts to random 8-byte slots of the first W bytes of rank 1's buffer.
  bw:   --bw-size puts to random aligned slots of W bytes, --window in flight.
  peak: puts of each --sizes size to the same remote bytes, --window in flight.
  app:  bitonic sort of --app-keys u64 keys per rank (power-of-two ranks), blocks exchanged by
        puts of --app-chunk bytes; every rank's result verified.
  rma:  Firehose puts and gets (fh_put / fh_get's engine) and the floor's RDMA WRITE / READ over
        256 KiB of rank 1's buffer: 8-byte blocking put and get latency (hits: the bytes warmed
        first), --bw-size put and get bandwidth with --window in flight. Nothing is tuned: run it
        with the library's defaults (no FH_M, FH_PROGRESS_THREAD or FH_AM_SPIN_US set).
        --rma-points (put-lat, put-bw, get-lat, get-bw) and --series keep a part of it, for a
        profile of one point and one way.
  --json: one JSON document (rank 0 prints); --json-out FILE: the tables on stdout and the
  document in FILE.
";

/// The points of `rma`, in the order they run.
pub const RMA_POINTS: [&str; 4] = ["put-lat", "put-bw", "get-lat", "get-bw"];

fn tests(list: &str) -> Result<Vec<Test>, lexopt::Error> {
    list.split(',')
        .map(|t| match t.trim() {
            "lat" => Ok(Test::Lat),
            "bw" => Ok(Test::Bw),
            "peak" => Ok(Test::Peak),
            "app" => Ok(Test::App),
            "rma" => Ok(Test::Rma),
            other => Err(format!("--test: {other:?} is not lat, bw, peak, app or rma").into()),
        })
        .collect()
}

fn sizes(flag: &str, list: &str) -> Result<Vec<usize>, lexopt::Error> {
    list.split(',')
        .map(|s| {
            firehose::internals::config::parse_size(s.trim())
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("{flag}: {s:?} is not a size > 0").into())
        })
        .collect()
}

fn size(p: &mut lexopt::Parser, flag: &str) -> Result<usize, lexopt::Error> {
    let v = p.value()?.string()?;
    firehose::internals::config::parse_size(v.trim())
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{flag}: {v:?} is not a size > 0").into())
}

/// Parse the arguments (without the program name); `Err("")` means help was asked for.
pub fn parse<I: IntoIterator<Item: Into<OsString>>>(args: I) -> Result<Args, String> {
    crate::cli::parse(args, from_parser)
}

fn from_parser(mut p: lexopt::Parser) -> Result<Option<Args>, lexopt::Error> {
    let mut a = Args {
        tests: vec![Test::Lat, Test::Bw, Test::Peak],
        sweep: Vec::new(),
        iters: 2000,
        unpin_iters: 500,
        warmup: 500,
        bw_msgs: 256,
        bw_size: 64 << 10,
        window: 16,
        sizes: vec![8, 64, 512, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20],
        peak_bytes: 4 << 20,
        app_keys: 1 << 18,
        app_reps: 3,
        app_chunk: 64 << 10,
        batches: 5,
        series: Vec::new(),
        rma_points: Vec::new(),
        json: false,
        json_out: None,
    };
    while let Some(arg) = p.next()? {
        match arg {
            Long("test") => a.tests = tests(&p.value()?.string()?)?,
            Long("sweep") => a.sweep = sizes("--sweep", &p.value()?.string()?)?,
            Long("iters") => a.iters = num(&mut p, "--iters")?,
            Long("unpin-iters") => a.unpin_iters = num(&mut p, "--unpin-iters")?,
            Long("warmup") => a.warmup = num(&mut p, "--warmup")?,
            Long("bw-msgs") => a.bw_msgs = num(&mut p, "--bw-msgs")?,
            Long("bw-size") => a.bw_size = size(&mut p, "--bw-size")?,
            Long("window") => a.window = num(&mut p, "--window")?,
            Long("sizes") => a.sizes = sizes("--sizes", &p.value()?.string()?)?,
            Long("peak-bytes") => a.peak_bytes = size(&mut p, "--peak-bytes")?,
            Long("app-keys") => a.app_keys = num(&mut p, "--app-keys")?,
            Long("app-reps") => a.app_reps = num(&mut p, "--app-reps")?,
            Long("app-chunk") => a.app_chunk = size(&mut p, "--app-chunk")?,
            Long("batches") => a.batches = num(&mut p, "--batches")?,
            Long("quick") => {
                // Still >= 1000 timed hits per point: one miss shows as 0.1 %.
                a.iters = 1000;
                a.unpin_iters = 150;
                a.warmup = 300;
                a.bw_msgs = 128;
                a.peak_bytes = 2 << 20;
                a.app_keys = 1 << 15;
                a.app_reps = 2;
                a.batches = 3;
            }
            Long("series") => {
                let v = p.value()?.string()?;
                for x in v.split(',') {
                    if !["floor", "firehose", "rdv_nounpin", "rdv_unpin"].contains(&x) {
                        return Err(format!(
                            "--series: {x:?} is not floor, firehose, rdv_nounpin or rdv_unpin"
                        )
                        .into());
                    }
                    a.series.push(x.to_string());
                }
            }
            Long("rma-points") => {
                for x in p.value()?.string()?.split(',') {
                    if !RMA_POINTS.contains(&x) {
                        return Err(
                            format!("--rma-points: {x:?} is not one of {RMA_POINTS:?}").into()
                        );
                    }
                    a.rma_points.push(x.to_string());
                }
            }
            Long("json") => a.json = true,
            Long("json-out") => a.json_out = Some(p.value()?.into()),
            Short('h') | Long("help") => return Ok(None),
            _ => return Err(arg.unexpected()),
        }
    }
    if a.iters == 0
        || a.unpin_iters == 0
        || a.bw_msgs == 0
        || a.window == 0
        || a.batches == 0
        || a.app_reps == 0
        || a.app_keys == 0
    {
        return Err(
            "counts (--iters, --unpin-iters, --bw-msgs, --window, --batches, --app-*) must be > 0"
                .into(),
        );
    }
    if !a.bw_size.is_multiple_of(8) || !a.app_chunk.is_multiple_of(8) {
        return Err("--bw-size and --app-chunk must be multiples of 8".into());
    }
    Ok(Some(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_lists() {
        let a = parse(Vec::<String>::new()).unwrap();
        assert_eq!(a.tests, vec![Test::Lat, Test::Bw, Test::Peak]);
        assert_eq!(a.bw_size, 65536);
        let a = parse(["--test", "app,lat", "--sweep", "64k,1m", "--json"]).unwrap();
        assert_eq!(a.tests, vec![Test::App, Test::Lat]);
        assert_eq!(parse(["--test", "rma"]).unwrap().tests, vec![Test::Rma]);
        assert_eq!(a.sweep, vec![65536, 1 << 20]);
        assert!(a.json);
        assert!(parse(["--test", "fig9"]).is_err());
        let a = parse(["--test", "rma", "--rma-points", "get-lat,put-bw"]).unwrap();
        assert_eq!(a.rma_points, ["get-lat", "put-bw"]);
        assert!(parse(["--rma-points", "get"]).is_err());
        assert!(parse(["--sweep", "0"]).is_err());
        assert!(parse(["--window", "0"]).is_err());
        assert!(parse(["--bw-size", "12"]).is_err());
        assert_eq!(parse(["--help"]).unwrap_err(), "");
    }
}
