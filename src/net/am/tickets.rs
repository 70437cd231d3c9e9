//! Outstanding requests: token -> (peer, result once the reply arrived or the request failed).
//! A reply is accepted only from the peer the request went to and only while its token is
//! outstanding; anything else is a stale or forged token. Waiters sleep on `done` briefly between
//! progress calls and are woken by any completion.

use crate::net::Rank;
use crate::status::fh_status;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

pub type Outcome = Result<Vec<u8>, fh_status>;

struct Entry {
    peer: Rank,
    outcome: Option<Outcome>,
}

#[derive(Default)]
struct Table {
    map: HashMap<u32, Entry>,
    next: u32,
}

#[derive(Default)]
pub struct Tickets {
    table: Mutex<Table>,
    done: Condvar,
}

impl Tickets {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new outstanding request to `peer`; its token is never 0 and never one in use, so a
    /// reply to a finished request (stale) cannot complete a newer one until 2^32 requests later.
    pub fn open(&self, peer: Rank) -> u32 {
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
    pub fn complete(&self, token: u32, from: Rank, payload: &[u8]) -> bool {
        let mut t = self.lock();
        match t.map.get_mut(&token) {
            Some(e) if e.peer == from && e.outcome.is_none() => {
                e.outcome = Some(Ok(payload.to_vec()));
                drop(t);
                self.done.notify_all();
                true
            }
            _ => false,
        }
    }

    /// Fails every outstanding request to `peer` (`None`: to everyone).
    pub fn fail_peer(&self, peer: Option<Rank>, why: fh_status) {
        let mut t = self.lock();
        for e in t.map.values_mut() {
            if !matches!(peer, Some(p) if p != e.peer) && e.outcome.is_none() {
                e.outcome = Some(Err(why));
            }
        }
        drop(t);
        self.done.notify_all();
    }

    /// The outcome if settled (the token is then spent); `Some(Err(UNKNOWN_HANDLE))` for a token
    /// that is not outstanding.
    pub fn take(&self, token: u32) -> Option<Outcome> {
        let mut t = self.lock();
        match t.map.get(&token) {
            None => Some(Err(fh_status::FH_ERR_UNKNOWN_HANDLE)),
            Some(e) if e.outcome.is_some() => t.map.remove(&token).and_then(|e| e.outcome),
            Some(_) => None,
        }
    }

    /// Forgets a request (timed out, or cancelled): a reply that still comes is stale.
    pub fn forget(&self, token: u32) {
        self.lock().map.remove(&token);
    }

    /// Sleeps until some request completes or `d` passes, unless `token` is settled already.
    pub fn sleep(&self, token: u32, d: Duration) {
        let t = self.lock();
        if let Some(Entry { outcome: None, .. }) = t.map.get(&token) {
            let _ = self.done.wait_timeout(t, d);
        }
    }

    pub fn outstanding(&self) -> usize {
        self.lock().map.len()
    }
}
