//! Command-line options of reg_write_bw, parsed with `lexopt` like firehose-bench's.

use std::ffi::OsString;

use crate::cli::num;
use lexopt::prelude::*;

/// How the source buffers are registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `ibv_reg_mr` before and `ibv_dereg_mr` after every RDMA WRITE (what a cache speeds up).
    PerIter,
    /// Every source buffer registered once before the loop (the upper bound on message rate).
    Once,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::PerIter => "per-iter",
            Mode::Once => "once",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Args {
    pub size: usize,
    pub iters: usize,
    /// Untimed iterations first (default: one pass over the buffers, so a cache's first misses
    /// are not in the steady-state numbers; they are reported separately in the shim counters).
    pub warmup: usize,
    pub buffers: usize,
    pub mode: Mode,
    pub json: bool,
    /// Device name: --device, else FH_DEVICE, else FH_RDMA_DEV, else the first device.
    pub device: Option<String>,
    pub port: u8,
    pub clock: crate::clock::Kind,
}

pub const USAGE: &str = "\
usage: reg_write_bw [--size 65536] [--iters 1000] [--warmup B] [--buffers 4]
                    [--mode per-iter|once] [--json] [--device NAME] [--port 1]
                    [--clock tsc|monotonic]
  Loopback RC QP pair; each iteration RDMA WRITEs one of --buffers source buffers (cycling).
  per-iter: ibv_reg_mr + ibv_dereg_mr of the source around every WRITE (timed separately);
  once: sources registered before the loop. Device: --device, FH_DEVICE, FH_RDMA_DEV, or first.
  --clock: interval clock (default tsc on x86-64, calibrated against CLOCK_MONOTONIC).
  FH_GID_INDEX picks the RoCE GID (default 1 if populated, else 0).
";

/// Parse the arguments (without the program name); `Err("")` means help was asked for.
pub fn parse<I: IntoIterator<Item: Into<OsString>>>(args: I) -> Result<Args, String> {
    crate::cli::parse(args, from_parser)
}

/// `Ok(None)`: help.
fn from_parser(mut p: lexopt::Parser) -> Result<Option<Args>, lexopt::Error> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let mut a = Args {
        size: 65536,
        iters: 1000,
        warmup: usize::MAX,
        buffers: 4,
        mode: Mode::PerIter,
        json: false,
        device: env("FH_DEVICE").or_else(|| env("FH_RDMA_DEV")),
        port: 1,
        clock: crate::clock::Kind::default_for_target(),
    };
    while let Some(arg) = p.next()? {
        match arg {
            Long("size") => a.size = num(&mut p, "--size")?,
            Long("iters") => a.iters = num(&mut p, "--iters")?,
            Long("warmup") => a.warmup = num(&mut p, "--warmup")?,
            Long("buffers") => a.buffers = num(&mut p, "--buffers")?,
            Long("port") => a.port = num(&mut p, "--port")?,
            Long("device") => a.device = Some(p.value()?.string()?),
            Long("json") => a.json = true,
            Long("clock") => {
                a.clock = match p.value()?.string()?.as_str() {
                    "tsc" if cfg!(target_arch = "x86_64") => crate::clock::Kind::Tsc,
                    "monotonic" => crate::clock::Kind::Monotonic,
                    other => {
                        return Err(
                            format!("--clock must be tsc or monotonic, not {other:?}").into()
                        )
                    }
                }
            }
            Long("mode") => {
                a.mode = match p.value()?.string()?.as_str() {
                    "per-iter" => Mode::PerIter,
                    "once" => Mode::Once,
                    other => {
                        return Err(format!("--mode must be per-iter or once, not {other:?}").into())
                    }
                }
            }
            Short('h') | Long("help") => return Ok(None),
            _ => return Err(arg.unexpected()),
        }
    }
    if a.warmup == usize::MAX {
        a.warmup = a.buffers;
    }
    // The stamp (see main.rs) takes 8 bytes; a WRITE is at most 2^31 bytes on every device.
    if a.size < 8 || a.size > (1 << 30) {
        return Err(format!("--size {} out of range [8, 2^30]", a.size).into());
    }
    if a.iters == 0 || a.buffers == 0 || a.buffers > 1024 {
        return Err("--iters must be > 0 and --buffers in [1, 1024]".into());
    }
    Ok(Some(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Args, String> {
        parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn defaults_and_overrides() {
        let a = p("").unwrap();
        assert_eq!(
            (a.size, a.buffers, a.warmup, a.mode),
            (65536, 4, 4, Mode::PerIter)
        );
        let a = p("--size 4096 --iters 7 --buffers 2 --mode once --json").unwrap();
        assert_eq!((a.size, a.iters, a.buffers, a.warmup), (4096, 7, 2, 2));
        assert!(a.json && a.mode == Mode::Once);
        assert_eq!(p("--warmup 0").unwrap().warmup, 0);
    }

    #[test]
    fn rejects_bad_values() {
        assert!(p("--mode sometimes").is_err());
        assert!(p("--clock sundial").is_err());
        assert_eq!(
            p("--clock monotonic").unwrap().clock,
            crate::clock::Kind::Monotonic
        );
        assert!(p("--size 4").is_err());
        assert!(p("--buffers 0").is_err());
        assert!(p("--iters x").is_err());
        assert!(p("--port 256").is_err());
        assert!(p("--size").is_err());
        assert!(p("--bogus").is_err());
        assert_eq!(p("--size=4096").unwrap().size, 4096);
        assert_eq!(p("--help").unwrap_err(), "");
    }
}
