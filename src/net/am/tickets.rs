//! Outstanding requests: token -> (peer, result once the reply arrived or the request failed).
//! A reply is accepted only from the peer the request went to and only while its token is
//! outstanding; anything else is a stale or forged token. Waiters sleep on `done` briefly between
//! progress calls and are woken by any completion.
//!
//! Cheap for a spinning waiter: `settled` counts every outcome ever set, so `wait` takes the lock
//! only after it moved; and `done` is notified only if someone sleeps on it (a notify is a futex
//! system call even with no waiter, microseconds under emulation).

use crate::net::NetError;
use crate::net::Rank;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

pub(super) type Outcome = Result<Vec<u8>, NetError>;

struct Entry {
    peer: Rank,
    outcome: Option<Outcome>,
}

#[derive(Default)]
struct Table {
    map: FxHashMap<u32, Entry>,
    next: u32,
}

#[derive(Default)]
pub(super) struct Tickets {
    table: Mutex<Table>,
    done: Condvar,
    /// Outcomes set so far (bumped after the outcome is in the table).
    settled: AtomicU64,
    /// Threads in `sleep` (changed under the table lock, so a completer that sets an outcome
    /// under it and reads this after sees every sleeper that could have missed the outcome).
    sleepers: AtomicU32,
    /// Condvar notifications sent (only when someone slept): tests check that a spinning
    /// waiter costs none and a sleeping one gets one.
    notifies: AtomicU64,
}

impl Tickets {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many outcomes were ever set: a waiter whose ticket was not settled at one value need
    /// not look again until it changes.
    pub(super) fn settled(&self) -> u64 {
        self.settled.load(Ordering::Acquire)
    }

    /// After setting outcomes (the lock released): publish them, wake sleepers if any.
    fn announce(&self) {
        self.settled.fetch_add(1, Ordering::AcqRel);
        if self.sleepers.load(Ordering::Acquire) > 0 {
            self.notifies.fetch_add(1, Ordering::Relaxed);
            self.done.notify_all();
        }
    }

    /// A new outstanding request to `peer`; its token is never 0 and never one in use, so a
    /// reply to a finished request (stale) cannot complete a newer one until 2^32 requests later.
    pub(super) fn open(&self, peer: Rank) -> u32 {
        let mut t = self.lock();
        loop {
            t.next = t.next.wrapping_add(1);
            let tok = t.next;
            if tok != 0 && !t.map.contains_key(&tok) {
                t.map.insert(
                    tok,
                    Entry {
                        peer,
                        outcome: None,
                    },
                );
                return tok;
            }
        }
    }

    /// Settles a token with a reply from `from`; false if no such request is waiting for `from`.
    pub(super) fn complete(&self, token: u32, from: Rank, payload: &[u8]) -> bool {
        let mut t = self.lock();
        match t.map.get_mut(&token) {
            Some(e) if e.peer == from && e.outcome.is_none() => {
                e.outcome = Some(Ok(payload.to_vec()));
                drop(t);
                self.announce();
                true
            }
            _ => false,
        }
    }

    /// Fails every outstanding request to `peer` (`None`: to everyone).
    pub(super) fn fail_peer(&self, peer: Option<Rank>, why: NetError) {
        let mut t = self.lock();
        for e in t.map.values_mut() {
            if !matches!(peer, Some(p) if p != e.peer) && e.outcome.is_none() {
                e.outcome = Some(Err(why));
            }
        }
        drop(t);
        self.announce();
    }

    /// The outcome if settled (the token is then spent); `Some(Err(UNKNOWN_HANDLE))` for a token
    /// that is not outstanding.
    pub(super) fn take(&self, token: u32) -> Option<Outcome> {
        let mut t = self.lock();
        match t.map.get(&token) {
            None => Some(Err(NetError::UnknownHandle)),
            Some(e) if e.outcome.is_some() => t.map.remove(&token).and_then(|e| e.outcome),
            Some(_) => None,
        }
    }

    /// Forgets a request (timed out, or cancelled): a reply that still comes is stale.
    pub(super) fn forget(&self, token: u32) {
        self.lock().map.remove(&token);
    }

    /// Sleeps until some request completes or `d` passes, unless `token` is settled already.
    pub(super) fn sleep(&self, token: u32, d: Duration) {
        let t = self.lock();
        if let Some(Entry { outcome: None, .. }) = t.map.get(&token) {
            self.sleepers.fetch_add(1, Ordering::AcqRel);
            let (_t, _) = self
                .done
                .wait_timeout(t, d)
                .unwrap_or_else(|e| e.into_inner());
            self.sleepers.fetch_sub(1, Ordering::AcqRel);
        }
    }

    pub(super) fn outstanding(&self) -> usize {
        self.lock().map.len()
    }

    /// Condvar notifications sent so far.
    #[cfg(test)]
    pub(super) fn notifies(&self) -> u64 {
        self.notifies.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    /// A sleeper is woken by the completion, not by its timeout: with the notification skipped
    /// (or the sleeper not counted) the sleep below lasts its full 20 s.
    #[test]
    fn a_sleeping_waiter_is_woken_at_once() {
        let t = Arc::new(Tickets::default());
        let tok = t.open(1);
        let t2 = t.clone();
        let sleeper = std::thread::spawn(move || {
            let t0 = Instant::now();
            t2.sleep(tok, Duration::from_secs(20));
            t0.elapsed()
        });
        // Until the sleeper is in the condvar (counted under the lock, then waiting).
        while t.sleepers.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        assert!(t.complete(tok, 1, b"r"));
        let slept = sleeper.join().unwrap();
        assert!(slept < Duration::from_secs(5), "slept {slept:?}: not woken");
        assert_eq!(t.notifies(), 1);
        assert_eq!(t.take(tok), Some(Ok(b"r".to_vec())));
    }

    /// Completions that nobody sleeps for send no notification (the optimisation: a notify is
    /// a futex system call), whether the waiter spins or is not there at all.
    #[test]
    fn no_notification_without_a_sleeper() {
        let t = Tickets::default();
        for i in 0..100u32 {
            let tok = t.open(i % 3);
            assert!(t.complete(tok, i % 3, &[]));
            assert!(t.take(tok).unwrap().is_ok());
        }
        t.fail_peer(None, NetError::Finalized);
        // A sleep on a settled ticket returns at once and is never counted.
        let tok = t.open(0);
        assert!(t.complete(tok, 0, &[]));
        let t0 = Instant::now();
        t.sleep(tok, Duration::from_secs(20));
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(t.notifies(), 0);
    }

    /// Races of sleep against complete (16 pairs of threads, each round a fresh ticket): no
    /// wake-up is lost. A completer that read `sleepers` before setting the outcome, or a sleeper
    /// counted outside the table lock, leaves a sleeper here for its whole 20 s.
    #[test]
    fn no_lost_wakeup_under_races() {
        let t = Arc::new(Tickets::default());
        let threads: Vec<_> = (0..16u32)
            .map(|peer| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for round in 0..200u32 {
                        let tok = t.open(peer);
                        let t2 = t.clone();
                        let completer = std::thread::spawn(move || {
                            for _ in 0..(round % 7) * 10 {
                                std::hint::spin_loop();
                            }
                            assert!(t2.complete(tok, peer, &round.to_le_bytes()));
                        });
                        let t0 = Instant::now();
                        loop {
                            if let Some(out) = t.take(tok) {
                                assert_eq!(out.unwrap(), round.to_le_bytes());
                                break;
                            }
                            t.sleep(tok, Duration::from_secs(20));
                            let waited = t0.elapsed();
                            assert!(waited < Duration::from_secs(5), "lost wake-up: {waited:?}");
                        }
                        completer.join().unwrap();
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(t.outstanding(), 0);
    }
}
