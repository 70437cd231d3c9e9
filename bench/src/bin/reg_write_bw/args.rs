//! Command-line options of reg_write_bw (hand-parsed, like the rest of firehose-bench).

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

fn num(flag: &str, v: Option<String>) -> Result<usize, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a number"))
}

/// Parse the arguments; `Err("")` means help was asked for.
pub fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
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
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--size" => a.size = num("--size", it.next())?,
            "--iters" => a.iters = num("--iters", it.next())?,
            "--warmup" => a.warmup = num("--warmup", it.next())?,
            "--buffers" => a.buffers = num("--buffers", it.next())?,
            "--port" => {
                let p = num("--port", it.next())?;
                a.port = u8::try_from(p).map_err(|_| format!("--port {p} out of range"))?;
            }
            "--device" => a.device = Some(it.next().ok_or("--device needs a value")?),
            "--json" => a.json = true,
            "--clock" => {
                a.clock = match it.next().as_deref() {
                    Some("tsc") if cfg!(target_arch = "x86_64") => crate::clock::Kind::Tsc,
                    Some("monotonic") => crate::clock::Kind::Monotonic,
                    other => {
                        return Err(format!("--clock must be tsc or monotonic, not {other:?}"))
                    }
                }
            }
            "--mode" => {
                a.mode = match it.next().as_deref() {
                    Some("per-iter") => Mode::PerIter,
                    Some("once") => Mode::Once,
                    other => return Err(format!("--mode must be per-iter or once, not {other:?}")),
                }
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.warmup == usize::MAX {
        a.warmup = a.buffers;
    }
    // The stamp (see main.rs) takes 8 bytes; a WRITE is at most 2^31 bytes on every device.
    if a.size < 8 || a.size > (1 << 30) {
        return Err(format!("--size {} out of range [8, 2^30]", a.size));
    }
    if a.iters == 0 || a.buffers == 0 || a.buffers > 1024 {
        return Err("--iters must be > 0 and --buffers in [1, 1024]".into());
    }
    Ok(a)
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
        assert_eq!(p("--help").unwrap_err(), "");
    }
}
