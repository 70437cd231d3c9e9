//! Command-line options (hand-parsed: the bench has no CLI dependency).

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

pub fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        json: false,
        quick: false,
        backend: "mlock".to_string(),
        internal_metadata: None,
        regions: vec![1, 1_000, 100_000],
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => args.json = true,
            "--quick" => args.quick = true,
            "--backend" => {
                args.backend = it.next().ok_or("--backend needs a value")?;
            }
            s if s.starts_with("--backend=") => args.backend = s["--backend=".len()..].to_string(),
            "--regions" => {
                let list = it.next().ok_or("--regions needs a list like 1,1000")?;
                args.regions = list
                    .split(',')
                    .map(|x| x.trim().parse::<usize>().ok().filter(|&n| n > 0))
                    .collect::<Option<Vec<_>>>()
                    .ok_or(format!("bad --regions list {list:?}"))?;
                args.regions.sort_unstable();
                args.regions.dedup();
            }
            "--internal-metadata" => {
                let imp = it.next().ok_or("--internal-metadata needs IMPL N")?;
                let n = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .ok_or("--internal-metadata needs IMPL N")?;
                args.internal_metadata = Some((imp, n));
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    match args.backend.as_str() {
        "mlock" | "verbs" | "null" => Ok(args),
        b => Err(format!("unknown backend {b:?}")),
    }
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
    }

    #[test]
    fn rejects_garbage() {
        assert!(p(&["--backend", "rdma"]).is_err());
        assert!(p(&["--frobnicate"]).is_err());
        assert!(p(&["--backend"]).is_err());
        assert!(p(&["--regions", "1,x"]).is_err());
        assert!(p(&["--regions", "0"]).is_err());
        let a = p(&["--internal-metadata", "ucx", "100"]).unwrap();
        assert_eq!(a.internal_metadata, Some(("ucx".to_string(), 100)));
    }
}
