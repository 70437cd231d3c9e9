//! The settings every rank must share, compared once at `fh_init` (`Rma::new`) so that a job
//! whose ranks disagree fails there, on every rank, naming the variable and both values, instead
//! of later in puts that a target refuses (`RemoteError::Refused`) or in overrun receive slots.
//!
//! What must agree, and why: `FH_BUCKET_SIZE`, `FH_MAXREGION` (a target checks every pin against
//! its own buckets and regions), `FH_M` (a target checks every move against the quota its own
//! M gives the sender), `FH_ADAPTIVE` (a target that does not lend refuses QUOTA_WANT), the
//! page size (the default bucket), `FH_AM_MAX_SIZE` (a move or reply sized for the sender's
//! buffers may not fit the receiver's), `FH_AM_RECV_DEPTH` (the credits a rank starts with are
//! the slots its peer posts), `FH_EXPOSE` (a rank in `declared` mode refuses what a peer in
//! `all` mode takes for granted). A rank whose own settings are invalid takes part too (marked
//! invalid, so the others fail at once rather than after the bound).
//!
//! How: one one-way active message (`AGREE_AM`) from every rank to every other with its list
//! (name, value pairs: a rank of another version shows up as a name one side lacks), then a wait
//! for every peer's, bounded by `FH_AM_TIMEOUT_MS`. Before the progress thread starts (the
//! handler is registered first, so nothing of it is lost).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::net::{Peers, Rank};
use crate::rma::RmaError;

/// The active-message id of the settings exchange.
pub(crate) const AGREE_AM: u16 = 0xFE01;

/// One setting that must be equal on every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreed {
    pub var: String,
    pub value: u64,
}

impl Agreed {
    pub fn new(var: &str, value: u64) -> Agreed {
        Agreed {
            var: var.to_owned(),
            value,
        }
    }
}

fn encode(list: &[Agreed]) -> Vec<u8> {
    let mut v = Vec::new();
    for a in list {
        v.push(a.var.len().min(255) as u8);
        v.extend_from_slice(&a.var.as_bytes()[..a.var.len().min(255)]);
        v.extend_from_slice(&a.value.to_le_bytes());
    }
    v
}

fn decode(mut b: &[u8]) -> Option<Vec<Agreed>> {
    let mut out = Vec::new();
    while let Some((&n, rest)) = b.split_first() {
        let n = n as usize;
        if rest.len() < n + 8 {
            return None;
        }
        let var = String::from_utf8(rest[..n].to_vec()).ok()?;
        let value = u64::from_le_bytes(rest[n..n + 8].try_into().ok()?);
        out.push(Agreed { var, value });
        b = &rest[n + 8..];
    }
    Some(out)
}

/// The first difference between this rank's list and each peer's, as the message `fh_init`
/// prints: "FH_M differs: rank 0 has 1048576, rank 2 has 524288". `None`: all agree.
pub fn compare(me: Rank, mine: &[Agreed], theirs: &[(Rank, Vec<Agreed>)]) -> Option<String> {
    for (peer, list) in theirs {
        for a in mine {
            match list.iter().find(|b| b.var == a.var) {
                Some(b) if b.value == a.value => {}
                Some(b) => {
                    return Some(format!(
                        "{} differs: rank {me} has {}, rank {peer} has {}",
                        a.var, a.value, b.value
                    ))
                }
                None => {
                    return Some(format!(
                        "rank {peer} does not check {} (another version)",
                        a.var
                    ))
                }
            }
        }
        if let Some(b) = list.iter().find(|b| !mine.iter().any(|a| a.var == b.var)) {
            return Some(format!(
                "rank {me} does not check {} (another version)",
                b.var
            ));
        }
    }
    None
}

/// Sends `mine` to every peer and waits (bounded by `FH_AM_TIMEOUT_MS`) for theirs.
/// Collective: every rank of `peers` calls it once. `Err(message)` names the first setting that
/// differs (or why the exchange failed); every rank of a job that disagrees gets one.
pub fn exchange(peers: &Peers, mine: &[Agreed]) -> Result<(), String> {
    let (me, size) = (peers.rank(), peers.size());
    if size <= 1 {
        return Ok(());
    }
    let got: Arc<Mutex<Vec<Option<Vec<u8>>>>> = Arc::new(Mutex::new(vec![None; size as usize]));
    let g = got.clone();
    let am = peers.am();
    am.register_oneway(AGREE_AM, move |from, data| {
        let mut g = g.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = g.get_mut(from as usize) {
            slot.get_or_insert_with(|| data.to_vec());
        }
    });
    let msg = encode(mine);
    for p in (0..size).filter(|&p| p != me) {
        am.send_oneway(p, AGREE_AM, &msg)
            .map_err(|e| format!("sending settings to rank {p}: {e:?}"))?;
    }
    let deadline = peers.settings().timeout.map(|t| Instant::now() + t);
    loop {
        let missing = {
            let g = got.lock().unwrap_or_else(|e| e.into_inner());
            (0..size)
                .filter(|&p| p != me && g[p as usize].is_none())
                .count()
        };
        if missing == 0 && !linger_for_tests(me) {
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(format!(
                "{missing} ranks did not send their settings in time"
            ));
        }
        if am.progress().map_err(|e| format!("{e:?}"))? == 0 {
            std::thread::yield_now();
        }
    }
    // Late duplicates (none from an honest peer) go nowhere.
    am.register_oneway(AGREE_AM, |_, _| {});
    let got = std::mem::take(&mut *got.lock().unwrap_or_else(|e| e.into_inner()));
    let theirs = got
        .into_iter()
        .enumerate()
        .filter_map(|(p, b)| Some((p as Rank, b?)))
        .map(|(p, b)| {
            decode(&b)
                .map(|l| (p, l))
                .ok_or(format!("rank {p} sent garbage settings"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    compare(me, mine, &theirs).map_or(Ok(()), Err)
}

/// Test switch: rank `rank` keeps polling in `exchange` for `d` after it has every peer's
/// settings (as when a third rank's message is slow to come), delivering whatever else arrives
/// meanwhile. One rank at a time; `Duration::ZERO` turns it off.
#[cfg(any(test, feature = "test-support"))]
pub fn set_exchange_linger_for_tests(rank: Rank, d: std::time::Duration) {
    let ms = d.as_millis().min(u128::from(u32::MAX)) as u64;
    LINGER.store(
        (u64::from(rank) << 32) | ms,
        std::sync::atomic::Ordering::SeqCst,
    );
}

/// (rank << 32) | milliseconds of `set_exchange_linger_for_tests`; 0: off.
#[cfg(any(test, feature = "test-support"))]
static LINGER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether `me` should keep polling (the test switch above), measured from its first call.
fn linger_for_tests(me: Rank) -> bool {
    #[cfg(any(test, feature = "test-support"))]
    {
        thread_local! {
            static SINCE: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
        }
        let v = LINGER.load(std::sync::atomic::Ordering::SeqCst);
        if v & 0xFFFF_FFFF == 0 || (v >> 32) as Rank != me {
            return false;
        }
        let since = SINCE.with(|s| {
            let t = s.get().unwrap_or_else(Instant::now);
            s.set(Some(t));
            t
        });
        if since.elapsed() < std::time::Duration::from_millis(v & 0xFFFF_FFFF) {
            return true;
        }
        SINCE.with(|s| s.set(None));
        false
    }
    #[cfg(not(any(test, feature = "test-support")))]
    {
        let _ = me;
        false
    }
}

/// `exchange`, reported as `fh_init` does: the message on stderr, `RmaError::BadConfig`.
pub(crate) fn exchange_or_fail(peers: &Peers, mine: &[Agreed]) -> Result<(), RmaError> {
    exchange(peers, mine).map_err(|m| {
        crate::fh_error!(
            "firehose: rank {}: settings differ across ranks: {m}",
            peers.rank()
        );
        RmaError::BadConfig
    })
}

/// The peer layer's settings that must agree, and the page size.
pub fn net_settings(peers: &Peers) -> Vec<Agreed> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    vec![
        Agreed::new("page size", page),
        Agreed::new("FH_AM_MAX_SIZE", peers.settings().max_size as u64),
        Agreed::new("FH_AM_RECV_DEPTH", u64::from(peers.settings().recv_depth)),
    ]
}

/// `FH_EXPOSE` (`super::expose`).
pub fn exposure(mode: super::expose::ExposeMode) -> Agreed {
    Agreed::new("FH_EXPOSE", mode as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_differences_named() {
        let a = vec![Agreed::new("FH_M", 1 << 20), Agreed::new("page size", 4096)];
        assert_eq!(decode(&encode(&a)).unwrap(), a);
        assert!(decode(&encode(&a)[..5]).is_none());
        assert_eq!(compare(0, &a, &[(1, a.clone())]), None);
        let mut b = a.clone();
        b[0].value = 1 << 19;
        assert_eq!(
            compare(0, &a, &[(1, a.clone()), (2, b)]).unwrap(),
            "FH_M differs: rank 0 has 1048576, rank 2 has 524288"
        );
        let c = vec![a[0].clone()];
        assert!(compare(0, &a, &[(1, c)])
            .unwrap()
            .contains("rank 1 does not check page size"));
    }
}
