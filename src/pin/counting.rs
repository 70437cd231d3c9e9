//! `CountingPinner`: a test double that records every pin/unpin, keeps the live set, and can be
//! told to fail (NoMemory beyond a byte budget, like RLIMIT_MEMLOCK; or Failed always).
//!
//! Every pin gets a fresh serial used as token, lkey and rkey, so tests can map a returned
//! registration back to the exact pin that produced it. An unpin of a token that is not live (a
//! double unpin, or a made-up one) is counted in `bad_unpins()`, which tests assert is zero.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{Access, PinError, Pinned, Pinner};

/// One live (or past) pin as the double saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinRecord {
    pub serial: u32,
    pub addr: usize,
    pub len: usize,
    pub access: Access,
}

#[derive(Default)]
struct State {
    next: u32,
    live: BTreeMap<u32, PinRecord>,
    history: BTreeMap<u32, PinRecord>,
    live_bytes: usize,
    pins: u64,
    unpins: u64,
    bad_unpins: u64,
    attempts: u64,
    budget: Option<usize>,
    fail_all: bool,
}

#[derive(Default)]
pub struct CountingPinner {
    st: Mutex<State>,
}

impl CountingPinner {
    pub fn new() -> Self {
        Self::default()
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fail with `NoMemory` when a pin would bring live bytes above `bytes` (`None`: unlimited).
    pub fn set_budget(&self, bytes: Option<usize>) {
        self.st().budget = bytes;
    }

    /// Fail every pin with `Failed(EFAULT)` while set.
    pub fn set_fail_all(&self, on: bool) {
        self.st().fail_all = on;
    }

    pub fn pins(&self) -> u64 {
        self.st().pins
    }
    pub fn unpins(&self) -> u64 {
        self.st().unpins
    }
    /// Unpins of tokens that were not live. Must stay 0.
    pub fn bad_unpins(&self) -> u64 {
        self.st().bad_unpins
    }
    /// Calls to `pin`, successful or not.
    pub fn attempts(&self) -> u64 {
        self.st().attempts
    }
    pub fn live_count(&self) -> usize {
        self.st().live.len()
    }
    pub fn live_bytes(&self) -> usize {
        self.st().live_bytes
    }
    pub fn live(&self) -> Vec<PinRecord> {
        self.st().live.values().copied().collect()
    }
    /// The pin (live or not) that produced key `serial`.
    pub fn record(&self, serial: u32) -> Option<PinRecord> {
        self.st().history.get(&serial).copied()
    }
}

impl Pinner for CountingPinner {
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError> {
        let mut s = self.st();
        s.attempts += 1;
        if s.fail_all {
            return Err(PinError::Failed(libc::EFAULT));
        }
        if s.budget.is_some_and(|b| s.live_bytes + len > b) {
            return Err(PinError::NoMemory(libc::ENOMEM));
        }
        s.next += 1;
        let serial = s.next;
        let rec = PinRecord {
            serial,
            addr,
            len,
            access,
        };
        s.live.insert(serial, rec);
        s.history.insert(serial, rec);
        s.live_bytes += len;
        s.pins += 1;
        Ok(Pinned {
            token: serial as usize,
            lkey: serial,
            rkey: serial,
        })
    }

    fn unpin(&self, pinned: Pinned, addr: usize, len: usize) {
        let mut s = self.st();
        match s.live.remove(&(pinned.token as u32)) {
            Some(r) if r.addr == addr && r.len == len => {
                s.live_bytes -= len;
                s.unpins += 1;
            }
            Some(r) => {
                // Wrong range for this token: keep it live and flag the error.
                s.live.insert(r.serial, r);
                s.bad_unpins += 1;
            }
            None => s.bad_unpins += 1,
        }
    }

    fn name(&self) -> &'static str {
        "counting"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_budget_and_bad_unpins() {
        let c = CountingPinner::new();
        c.set_budget(Some(8192));
        let a = c.pin(4096, 4096, Access::LOCAL_WRITE).unwrap();
        let b = c.pin(8192, 4096, Access::REMOTE_READ).unwrap();
        assert_ne!(a.lkey, b.lkey);
        assert_eq!(
            c.pin(0x10000, 4096, Access(0)),
            Err(PinError::NoMemory(libc::ENOMEM))
        );
        assert_eq!(c.live_bytes(), 8192);
        c.unpin(a, 4096, 4096);
        assert_eq!(c.bad_unpins(), 0);
        c.unpin(a, 4096, 4096);
        assert_eq!(c.bad_unpins(), 1, "double unpin is recorded");
        c.unpin(b, 4096, 8192);
        assert_eq!(c.bad_unpins(), 2, "wrong length is recorded");
        assert_eq!(c.live_count(), 1);
        c.set_fail_all(true);
        assert!(matches!(
            c.pin(0, 4096, Access(0)),
            Err(PinError::Failed(_))
        ));
        assert_eq!(c.record(b.lkey).unwrap().addr, 8192);
    }
}
