//! `FH_AM_MAX_QUEUED`: how many bytes of messages may wait for credits toward one peer.
//!
//! Why a bound: a message that finds no credit is queued until the peer gives credits back, and
//! a peer gives them back only when it handles our messages. A peer that keeps sending requests
//! (Firehose moves) but never returns a credit makes us queue its answers without end (20 000
//! injected puts-in-move: 19 971 queued replies). Past the bound the peer is declared lost
//! (`Am::give_up`: its queue is dropped, it is counted in `StatsSnapshot::queue_overflows`).
//!
//! The default, 16 MiB, is far above what an honest job queues: a Firehose reply is ~30 bytes,
//! a move at most one message (`FH_AM_MAX_SIZE`), and this rank's own sends to a peer that does
//! not progress are bounded by its firehoses and its callers' puts between two waits. `inf`
//! turns the bound off.

use crate::config::parse_size;
use crate::status::{fh_status, FhResult};

pub const VAR: &str = "FH_AM_MAX_QUEUED";
pub const DEFAULT: usize = 16 << 20;

/// The bound from the environment (`usize::MAX`: none).
pub fn from_env() -> FhResult<usize> {
    parse(std::env::var(VAR).ok().as_deref()).map_err(|v| {
        eprintln!("firehose: invalid {VAR}: {v:?} is not a byte count (e.g. 16m) or inf");
        fh_status::FH_ERR_BAD_CONFIG
    })
}

fn parse(v: Option<&str>) -> Result<usize, String> {
    match v.map(str::trim) {
        None => Ok(DEFAULT),
        Some(t) if t.eq_ignore_ascii_case("inf") => Ok(usize::MAX),
        Some(t) => parse_size(t).filter(|&n| n > 0).ok_or_else(|| t.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(parse(None), Ok(DEFAULT));
        assert_eq!(parse(Some("64k")), Ok(64 << 10));
        assert_eq!(parse(Some(" INF ")), Ok(usize::MAX));
        assert!(parse(Some("0")).is_err());
        assert!(parse(Some("lots")).is_err());
    }
}
