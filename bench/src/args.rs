//! Command-line options, parsed with `lexopt` (`--opt value` and `--opt=value`); the usage text
//! is ours.

use std::ffi::OsString;

use lexopt::prelude::*;

/// What the user asked for.
#[derive(Debug, Clone)]
pub struct Args {
    /// Print one JSON document on stdout instead of the tables.
    pub json: bool,
    /// Short smoke run (< 20 s) for scripts.
    pub quick: bool,
    /// Pinning backend under both caches and the raw comparison: "mlock", "verbs" or "null".
    pub backend: String,
    /// Cached-region counts of the hit rows (default 1, 10^3, 10^5; `--regions` lowers them for
    /// slow backends such as Soft-RoCE under TCG, where 10^5 ibv_reg_mr take minutes).
    pub regions: Vec<usize>,
    /// Internal: measure metadata of one implementation in this (fresh) process and exit.
    pub internal_metadata: Option<(String, usize)>,
}

pub const USAGE: &str = "\
usage: firehose-bench [--json] [--quick] [--backend mlock|verbs|null] [--regions 1,1000,100000]
  --json     one JSON document with every row on stdout (tables are not printed)
  --quick    short smoke run (< 20 s)
  --backend  pinning backend under both caches and the raw rows (default mlock)
  --regions  cached-region counts of the hit rows (default 1,1000,100000)
";

/// Parse the arguments (without the program name); `Err("")` means help was asked for.
pub fn parse<I: IntoIterator<Item: Into<OsString>>>(args: I) -> Result<Args, String> {
    crate::cli::parse(args, from_parser)
}

/// `Ok(None)`: help.
fn from_parser(mut p: lexopt::Parser) -> Result<Option<Args>, lexopt::Error> {
    let mut a = Args {
        json: false,
        quick: false,
        backend: "mlock".to_string(),
        internal_metadata: None,
        regions: vec![1, 1_000, 100_000],
    };
    while let Some(arg) = p.next()? {
        match arg {
            Long("json") => a.json = true,
            Long("quick") => a.quick = true,
            Long("backend") => {
                a.backend = p.value()?.string()?;
                if !matches!(a.backend.as_str(), "mlock" | "verbs" | "null") {
                    return Err(format!("unknown backend {:?}", a.backend).into());
                }
            }
            Long("regions") => {
                let list = p.value()?.string()?;
                a.regions = list
                    .split(',')
                    .map(|x| x.trim().parse::<usize>().ok().filter(|&n| n > 0))
                    .collect::<Option<Vec<_>>>()
                    .ok_or(format!("bad --regions list {list:?} (e.g. 1,1000)"))?;
                a.regions.sort_unstable();
                a.regions.dedup();
            }
            Long("internal-metadata") => {
                let imp = p.value()?.string()?;
                let n = p.value()?.parse()?;
                a.internal_metadata = Some((imp, n));
            }
            Short('h') | Long("help") => return Ok(None),
            _ => return Err(arg.unexpected()),
        }
    }
    Ok(Some(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &[&str]) -> Result<Args, String> {
        parse(v.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_and_flags() {
        let a = p(&[]).unwrap();
        assert!(!a.json && !a.quick);
        assert_eq!(a.backend, "mlock");
        let a = p(&["--json", "--quick", "--backend", "verbs"]).unwrap();
        assert!(a.json && a.quick);
        assert_eq!(a.backend, "verbs");
        assert_eq!(p(&["--backend=null"]).unwrap().backend, "null");
        assert_eq!(a.regions, vec![1, 1_000, 100_000]);
        assert_eq!(
            p(&["--regions", "1000,1,1000"]).unwrap().regions,
            vec![1, 1000]
        );
        assert_eq!(p(&["--regions=1"]).unwrap().regions, vec![1]);
        assert_eq!(p(&["--help"]).unwrap_err(), "");
        assert_eq!(p(&["-h"]).unwrap_err(), "");
    }

    #[test]
    fn rejects_garbage() {
        assert!(p(&["--backend", "rdma"]).is_err());
        assert!(p(&["--frobnicate"]).is_err());
        assert!(p(&["extra"]).is_err());
        assert!(p(&["--backend"]).is_err());
        assert!(p(&["--json=yes"]).is_err());
        assert!(p(&["--regions", "1,x"]).is_err());
        assert!(p(&["--regions", "0"]).is_err());
        let a = p(&["--internal-metadata", "ucx", "100"]).unwrap();
        assert_eq!(a.internal_metadata, Some(("ucx".to_string(), 100)));
        assert!(p(&["--internal-metadata", "ucx", "many"]).is_err());
    }
}
