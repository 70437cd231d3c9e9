//! `FirehoseConfig`: the algorithm's parameters, defaults and the `FH_*` variables that set them.
//!
//! | variable         | meaning                                           | default                      |
//! |------------------|---------------------------------------------------|------------------------------|
//! | `FH_BUCKET_SIZE` | bucket (bookkeeping unit), power of two >= 512    | the page size                |
//! | `FH_M`           | M: bytes all peers together may keep pinned here  | 48 MiB                       |
//! | `FH_MAXVICTIM`   | MAXVICTIM: unreferenced pinned bytes kept for reuse | 16 MiB                     |
//! | `FH_MAXREGION`   | largest region one pin covers (region mode)       | 128 KiB (GASNet's cap)       |
//! | `FH_ADAPTIVE`    | `1`/`on`: lend idle peers' share to busy ones     | off                          |
//! | `FH_SMALL_PUT_PINS` | `auto`: a small put that misses while a peer's firehoses are evicted unused rides in its move without pinning; `always`: every such move pins (the paper) | `auto` |
//!
//! Sizes take `k`/`m`/`g` suffixes ([`parse_size`]). Defaults: GASNet splits a
//! pinnable budget 75 % M / 25 % MAXVICTIM; we take a 64 MiB budget (48 + 16 MiB), which fits
//! comfortably in RAM of any node and well inside what root (CAP_IPC_LOCK, the usual case under
//! a launcher) may lock, and leaves the pin-down cache of the local side its own budget. A job
//! with a non-root 8 MiB RLIMIT_MEMLOCK must lower both (the driver checks, not this core).
//!
//! Every rank must use the same values: a target checks moves against its own bucket size,
//! region size and per-peer quota, and refuses what does not fit (`RemoteError::Refused`).
//! `fh_init` compares them across ranks (`net::agree`) and fails on every rank if they differ.

use crate::Rank;

/// Largest AM payload of the net layer (4 KiB message minus its 16-byte header).
pub const DEFAULT_MAX_MSG: usize = 4096 - 16;
/// A put at most this long rides inside the move request of a miss (GASNet: ~3 KiB).
pub const DEFAULT_SMALL_PUT_MAX: usize = 3072;
pub const DEFAULT_M: usize = 48 << 20;
pub const DEFAULT_MAX_VICTIM: usize = 16 << 20;
pub const DEFAULT_MAX_REGION: usize = 128 << 10;

/// The algorithm's parameters. Build with `new` or `from_env`, then `validate` (done by
/// `Firehose::new`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirehoseConfig {
    pub rank: Rank,
    pub size: u32,
    /// Bytes per bucket; a power of two.
    pub bucket_size: usize,
    /// M: bytes this rank keeps pinned for all peers' firehoses together (the live bound).
    pub m_bytes: usize,
    /// MAXVICTIM: bytes of unreferenced pinned regions kept for reuse.
    pub max_victim_bytes: usize,
    /// Region mode: a pin covers up to this many buckets (aligned, a power of two); 1 = page mode.
    /// Lowered automatically (see `region_buckets`) when a peer's share is smaller.
    pub max_region_buckets: u32,
    /// A put payload up to this many bytes rides inside the move request of a miss.
    pub small_put_max: usize,
    /// Largest message `poll_transmit` may produce (the AM layer's max payload).
    pub max_msg: usize,
    /// Lend idle peers' firehose share to busy peers (off by default).
    pub adaptive: bool,
    /// A small put that misses carries pins for its buckets in its move only while pinning pays
    /// (`initiator::thrash`); false: always (the paper's behaviour).
    pub small_put_pins_auto: bool,
}

/// A bad setting: the variable (or field) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FhConfigError {
    pub var: &'static str,
    pub msg: String,
}

impl std::fmt::Display for FhConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "firehose: invalid {}: {}", self.var, self.msg)
    }
}

/// `123`, `64k`, `512M`, `4g`, `1t` (binary multiples), `inf`/`unlimited` -> usize::MAX.
pub fn parse_size(v: &str) -> Option<usize> {
    let v = v.trim().to_ascii_lowercase();
    if v == "inf" || v == "unlimited" {
        return Some(usize::MAX);
    }
    let (digits, shift) = match v.strip_suffix(['k', 'm', 'g', 't']) {
        Some(d) => (d, 10 * (1 + "kmgt".find(v.chars().last()?)?)),
        None => (v.as_str(), 0),
    };
    let digits = digits.strip_suffix('i').unwrap_or(digits); // tolerate "ki" typed as "kib"-ish
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: usize = digits.parse().ok()?;
    n.checked_mul(1usize.checked_shl(shift as u32)?)
}

fn err(var: &'static str, msg: impl Into<String>) -> FhConfigError {
    FhConfigError {
        var,
        msg: msg.into(),
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 && (p as usize).is_power_of_two() {
        p as usize
    } else {
        4096
    }
}

impl FirehoseConfig {
    /// Defaults for `rank` of a job of `size`.
    pub fn new(rank: Rank, size: u32) -> Self {
        let bucket_size = page_size();
        FirehoseConfig {
            rank,
            size,
            bucket_size,
            m_bytes: DEFAULT_M,
            max_victim_bytes: DEFAULT_MAX_VICTIM,
            max_region_buckets: (DEFAULT_MAX_REGION / bucket_size).max(1) as u32,
            small_put_max: DEFAULT_SMALL_PUT_MAX,
            max_msg: DEFAULT_MAX_MSG,
            adaptive: false,
            small_put_pins_auto: true,
        }
    }

    /// Defaults overridden by the process environment, validated.
    pub fn from_env(rank: Rank, size: u32) -> Result<Self, FhConfigError> {
        Self::from_lookup(rank, size, |k| std::env::var(k).ok())
    }

    /// Defaults overridden by whatever `get` returns for each `FH_*` name, validated.
    pub fn from_lookup(
        rank: Rank,
        size: u32,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, FhConfigError> {
        let mut c = Self::new(rank, size);
        let size_of = |var: &'static str| -> Result<Option<usize>, FhConfigError> {
            match get(var) {
                None => Ok(None),
                Some(v) => parse_size(&v)
                    .filter(|&n| n != usize::MAX)
                    .map(Some)
                    .ok_or_else(|| err(var, format!("{v:?} is not a byte count (e.g. 4k, 64m)"))),
            }
        };
        if let Some(b) = size_of("FH_BUCKET_SIZE")? {
            c.bucket_size = b;
        }
        if let Some(m) = size_of("FH_M")? {
            c.m_bytes = m;
        }
        if let Some(v) = size_of("FH_MAXVICTIM")? {
            c.max_victim_bytes = v;
        }
        let b = c.bucket_size;
        if !b.is_power_of_two() || !(512..=(1 << 30)).contains(&b) {
            return Err(err(
                "FH_BUCKET_SIZE",
                format!("{b} is not a power of two in 512..=1g"),
            ));
        }
        let region = size_of("FH_MAXREGION")?.unwrap_or(DEFAULT_MAX_REGION.max(b));
        if region < c.bucket_size || region % c.bucket_size != 0 {
            return Err(err(
                "FH_MAXREGION",
                format!(
                    "{region} is not a multiple of the bucket size {}",
                    c.bucket_size
                ),
            ));
        }
        c.max_region_buckets = u32::try_from(region / c.bucket_size)
            .map_err(|_| err("FH_MAXREGION", "too many buckets per region"))?;
        if let Some(v) = get("FH_ADAPTIVE") {
            c.adaptive = match v.trim().to_ascii_lowercase().as_str() {
                "1" | "on" | "yes" | "true" => true,
                "0" | "off" | "no" | "false" => false,
                _ => return Err(err("FH_ADAPTIVE", format!("{v:?} is not 0/1/on/off"))),
            };
        }
        if let Some(v) = get("FH_SMALL_PUT_PINS") {
            c.small_put_pins_auto = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => true,
                "always" => false,
                _ => {
                    return Err(err(
                        "FH_SMALL_PUT_PINS",
                        format!("{v:?} is not auto/always"),
                    ))
                }
            };
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks every field. Errors name the variable that sets the field.
    pub fn validate(&self) -> Result<(), FhConfigError> {
        if self.size == 0 || self.rank >= self.size {
            return Err(err(
                "rank",
                format!("rank {} of size {}", self.rank, self.size),
            ));
        }
        let b = self.bucket_size;
        if !b.is_power_of_two() || !(512..=(1 << 30)).contains(&b) {
            return Err(err(
                "FH_BUCKET_SIZE",
                format!("{b} is not a power of two in 512..=1g"),
            ));
        }
        if !self.max_region_buckets.is_power_of_two() {
            return Err(err(
                "FH_MAXREGION",
                "must be a power-of-two number of buckets",
            ));
        }
        if self.m_bytes % b != 0 || self.max_victim_bytes % b != 0 {
            return Err(err(
                "FH_M",
                "FH_M and FH_MAXVICTIM must be multiples of the bucket size",
            ));
        }
        if self.m_bytes.checked_add(self.max_victim_bytes).is_none() {
            return Err(err("FH_M", "FH_M + FH_MAXVICTIM overflows"));
        }
        // Two buckets per peer at least, so that an op crossing one bucket boundary fits.
        if self.size > 1 && self.firehoses_per_peer() < 2 {
            return Err(err(
                "FH_M",
                format!(
                    "{} bytes leave fewer than 2 buckets of {b} per peer for {} peers",
                    self.m_bytes,
                    self.size - 1
                ),
            ));
        }
        // Wire room: a move with one pin and a small put, and a reply with one pin, must fit.
        let need = crate::wire::MOVE_FIXED
            + crate::wire::PIN_LEN
            + crate::wire::PUT_FIXED
            + self.small_put_max;
        if self.max_msg < need.max(crate::wire::REPLY_FIXED + 4 * crate::wire::GRANT_LEN) {
            return Err(err(
                "max_msg",
                format!(
                    "{} bytes cannot carry a move with a {}-byte put",
                    self.max_msg, self.small_put_max
                ),
            ));
        }
        if self.max_msg > u16::MAX as usize * 8 {
            return Err(err("max_msg", "larger than the wire's counts allow"));
        }
        Ok(())
    }

    /// The settings every rank must share, as (variable, value): a target checks moves against
    /// its own (`rma::agree` compares them across ranks at `fh_init`).
    pub fn must_agree(&self) -> [(&'static str, u64); 4] {
        [
            ("FH_BUCKET_SIZE", self.bucket_size as u64),
            ("FH_M", self.m_bytes as u64),
            (
                "FH_MAXREGION",
                u64::from(self.max_region_buckets) * self.bucket_size as u64,
            ),
            ("FH_ADAPTIVE", u64::from(self.adaptive)),
        ]
    }

    /// F: buckets each peer may hold pinned here at once, M / (bucket × (size − 1)).
    pub fn firehoses_per_peer(&self) -> u64 {
        if self.size <= 1 {
            return 0;
        }
        (self.m_bytes / self.bucket_size) as u64 / (self.size as u64 - 1)
    }

    /// Buckets per region actually used: `max_region_buckets`, halved until two regions fit in a
    /// peer's share F (a large job with a small M falls back toward page mode, never errors).
    pub fn region_buckets(&self) -> u32 {
        let f = self.firehoses_per_peer().max(2);
        let mut r = self.max_region_buckets.max(1);
        while r > 1 && (r as u64) * 2 > f {
            r /= 2;
        }
        r
    }

    /// Longest op `acquire` accepts: every op must fit in a peer's share with its region
    /// rounding, (F / R − 1) regions. The driver splits longer transfers.
    pub fn max_op_len(&self) -> usize {
        let r = self.region_buckets() as u64;
        let regions = self.firehoses_per_peer() / r;
        (regions.saturating_sub(1) * r) as usize * self.bucket_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn wire_bounds_fit_max_msg() {
        use crate::wire::{
            encode, handles_per_msg, pins_per_move, Msg, PinReq, RemoteError, Rights,
        };
        let max = DEFAULT_MAX_MSG;
        let n = pins_per_move(max);
        let pins = vec![
            PinReq {
                start: 0,
                nb: 1,
                need_off: 0,
                need_n: 1,
                rights: Rights::WRITE,
            };
            n
        ];
        let m = Msg::Move {
            req: 1,
            releases: vec![],
            pins,
            put: None,
        };
        assert!(encode(&m).len() <= max);
        let grants = vec![Err(RemoteError::Unmapped); n];
        assert!(
            encode(&Msg::Reply {
                req: 1,
                grants,
                put: Some(Ok(()))
            })
            .len()
                <= max
        );
        let hs = vec![0; handles_per_msg(max)];
        assert!(encode(&Msg::Revoke(hs)).len() <= max);
    }

    fn with(size: u32, vars: &[(&str, &str)]) -> Result<FirehoseConfig, FhConfigError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        FirehoseConfig::from_lookup(0, size, |k| m.get(k).cloned())
    }

    #[test]
    fn defaults_follow_gasnet_split_and_derive_f() {
        let c = with(4, &[]).unwrap();
        assert_eq!(c.m_bytes, 3 * c.max_victim_bytes, "75 % / 25 %");
        assert!(!c.adaptive);
        assert_eq!(
            c.max_region_buckets as usize * c.bucket_size,
            DEFAULT_MAX_REGION
        );
        assert_eq!(
            c.firehoses_per_peer(),
            (c.m_bytes / c.bucket_size / 3) as u64
        );
        assert!(c.max_op_len() >= DEFAULT_MAX_REGION);
    }

    #[test]
    fn overrides_with_suffixes() {
        let c = with(
            3,
            &[
                ("FH_BUCKET_SIZE", "8k"),
                ("FH_M", "16m"),
                ("FH_MAXVICTIM", "0"),
                ("FH_MAXREGION", "64k"),
                ("FH_ADAPTIVE", "on"),
            ],
        )
        .unwrap();
        assert_eq!(c.bucket_size, 8192);
        assert_eq!(c.m_bytes, 16 << 20);
        assert_eq!(c.max_victim_bytes, 0);
        assert_eq!(c.max_region_buckets, 8);
        assert!(c.adaptive);
        assert_eq!(c.firehoses_per_peer(), 1024);
        assert!(c.small_put_pins_auto);
        assert!(
            !with(2, &[("FH_SMALL_PUT_PINS", "always")])
                .unwrap()
                .small_put_pins_auto
        );
    }

    #[test]
    fn region_shrinks_for_large_jobs_instead_of_failing() {
        // 1000 ranks share 48 MiB: 12 pages per peer, so regions fall to 4 pages.
        let c = with(1000, &[]).unwrap();
        assert_eq!(c.firehoses_per_peer(), 12);
        assert_eq!(c.region_buckets(), 4);
        assert_eq!(c.max_op_len(), 8 * 4096);
    }

    #[test]
    fn errors_name_the_variable() {
        for (size, var, val) in [
            (2, "FH_BUCKET_SIZE", "3000"),
            (2, "FH_BUCKET_SIZE", "256"),
            (2, "FH_BUCKET_SIZE", "lots"),
            (2, "FH_M", "1000"),
            (2, "FH_M", "4k"),
            (100, "FH_M", "256k"),
            (2, "FH_M", "inf"),
            (2, "FH_MAXREGION", "6000"),
            (2, "FH_MAXREGION", "96k"),
            (2, "FH_ADAPTIVE", "maybe"),
            (2, "FH_SMALL_PUT_PINS", "never"),
        ] {
            let e = with(size, &[(var, val)]).unwrap_err();
            assert_eq!(e.var, var, "{var}={val}: {e}");
            assert!(e.to_string().contains(var));
        }
        let mut c = FirehoseConfig::new(2, 2);
        assert_eq!(c.validate().unwrap_err().var, "rank");
        c.rank = 0;
        c.max_msg = 100;
        assert_eq!(c.validate().unwrap_err().var, "max_msg");
    }
}
