//! For simulation and tests: the target's pins over a simulated link (`net::sim::SimNet`), so
//! `Rma` runs with N ranks as threads of one process and no device (`Rma::with_pins`).
//!
//! A pin is a `SimNet::register_access` of the range with the rights asked for (the
//! simulator's rkey: a READ through a key pinned for writing fails, and the reverse), an unpin
//! its `deregister`. A range that is not mapped fails with `PinFailure::Unmapped` (checked with
//! `mincore`, as `ibv_reg_mr` would fail with EFAULT), and so does a pin with write rights of
//! memory this process cannot write (`/proc/self/maps`: `ibv_reg_mr` with remote or local write
//! of a `PROT_READ` or read-only file mapping fails with EFAULT too), and
//! a put that rode in a move is written as `TargetPins` writes it (a kernel copy into our own
//! memory: an unmapped target is an error, never a fault).

use std::collections::HashMap;

use crate::net::sim::SimNet;
use crate::net::Rank;
use firehose_proto::{PinFailure, RegionPins, Rights};

/// One rank's regions registered on the simulator for its peers.
pub struct SimPins {
    net: SimNet,
    rank: Rank,
    /// Memory windows (as `FH_MW` on a device): a region's own key allows nothing remotely,
    /// each holder gets a window of its own. Live windows by key: (region key, peer).
    windows: Option<HashMap<u32, (u32, Rank)>>,
    /// Unpins of a region that still had a window over it (a device refuses the
    /// deregistration; a Firehose bug if ever non-zero).
    unpins_under_windows: u64,
    /// `drop_key` of a window that is not live (a bug if ever non-zero).
    unknown_drops: u64,
    /// Live registrations by (start address, rkey): their lengths.
    live: HashMap<(u64, u32), usize>,
    bytes: u64,
    unknown_unpins: u64,
}

impl SimPins {
    /// The pins of `rank` of `net`.
    pub fn new(net: SimNet, rank: Rank) -> SimPins {
        SimPins {
            net,
            rank,
            windows: None,
            unpins_under_windows: 0,
            unknown_drops: 0,
            live: HashMap::new(),
            bytes: 0,
            unknown_unpins: 0,
        }
    }

    /// `new`, with a memory window for each holder (see the field).
    pub fn with_windows(net: SimNet, rank: Rank) -> SimPins {
        SimPins {
            windows: Some(HashMap::new()),
            ..SimPins::new(net, rank)
        }
    }

    /// Windows live now (0 without windows).
    pub fn live_windows(&self) -> usize {
        self.windows.as_ref().map_or(0, HashMap::len)
    }

    /// Window misuse seen: unpins under a live window plus drops of unknown windows.
    pub fn window_errors(&self) -> u64 {
        self.unpins_under_windows + self.unknown_drops
    }

    /// Bytes registered now.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn regions(&self) -> usize {
        self.live.len()
    }

    /// `unpin` calls for a region this table does not hold (a Firehose bug if ever non-zero).
    pub fn unknown_unpins(&self) -> u64 {
        self.unknown_unpins
    }
}

/// Whether every page of `[addr, addr + len)` is mapped (`mincore` fails with ENOMEM when one
/// is not).
fn mapped(addr: u64, len: usize) -> bool {
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as u64,
        _ => 4096,
    };
    let start = addr & !(page - 1);
    let Some(end) = addr.checked_add(len as u64) else {
        return false;
    };
    let span = (end - start) as usize;
    let mut vec = vec![0u8; span.div_ceil(page as usize)];
    // SAFETY: `vec` has one byte per page of the span; mincore only inspects the mappings.
    let r = unsafe { libc::mincore(start as *mut libc::c_void, span, vec.as_mut_ptr()) };
    r == 0
}

/// Whether every byte of `[addr, addr + len)` lies in mappings this process may write (as
/// the kernel checks for a registration with a write right). For simulation: parses
/// `/proc/self/maps`.
pub fn writable(addr: u64, len: usize) -> bool {
    let Some(end) = addr.checked_add(len as u64) else {
        return false;
    };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let mut cur = addr;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        // Sorted by address: a gap before `cur` is reached means unmapped.
        if hi <= cur {
            continue;
        }
        if lo > cur || !perms.starts_with("rw") {
            return false;
        }
        cur = hi;
        if cur >= end {
            return true;
        }
    }
    cur >= end
}

impl RegionPins for SimPins {
    fn pin(&mut self, addr: u64, len: usize, rights: Rights) -> Result<u32, PinFailure> {
        if len == 0 || !mapped(addr, len) {
            return Err(PinFailure::Unmapped);
        }
        if rights.covers(Rights::WRITE) && !writable(addr, len) {
            return Err(PinFailure::Unmapped);
        }
        let rw = match self.windows {
            // The region's own key allows nothing remotely: its windows carry the rights.
            Some(_) => crate::pin::Access(0),
            None => super::target_pins::access_of(rights),
        };
        // SAFETY: the range is mapped now; as with a verbs MR of a peer-pinned region, keeping
        // it mapped while peers hold firehoses on it is the application's contract (remote
        // invalidation, which enforces it on real links, is off in the simulation).
        let rkey = unsafe { self.net.register_access(self.rank, addr, len, rw) };
        self.live.insert((addr, rkey), len);
        self.bytes += len as u64;
        Ok(rkey)
    }

    fn unpin(&mut self, addr: u64, len: usize, rkey: u32) {
        match self.live.remove(&(addr, rkey)) {
            Some(l) => {
                debug_assert_eq!(l, len);
                if let Some(w) = &self.windows {
                    if w.values().any(|&(region, _)| region == rkey) {
                        self.unpins_under_windows += 1;
                    }
                }
                self.net.deregister(rkey);
                self.bytes -= l as u64;
            }
            None => self.unknown_unpins += 1,
        }
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), PinFailure> {
        super::target_pins::write_own_memory(addr, data)
    }

    fn key_for(
        &mut self,
        peer: Rank,
        addr: u64,
        len: usize,
        rights: Rights,
        rkey: u32,
    ) -> Result<u32, PinFailure> {
        let Some(w) = &mut self.windows else {
            return Ok(rkey);
        };
        if !self.live.contains_key(&(addr, rkey)) {
            return Err(PinFailure::Other);
        }
        let remote = super::target_pins::remote_access_of(rights);
        // SAFETY: inside a live registration of ours (checked above), which stays until unpin,
        // and every window over it is dropped before that (`window_errors` counts otherwise).
        let key = unsafe { self.net.bind_window(self.rank, peer, addr, len, remote) };
        w.insert(key, (rkey, peer));
        Ok(key)
    }

    fn drop_key(&mut self, peer: Rank, rkey: u32, key: u32) {
        let Some(w) = &mut self.windows else {
            return;
        };
        match w.remove(&key) {
            Some((region, p)) if region == rkey && p == peer => {
                self.net.deregister(key);
            }
            _ => self.unknown_drops += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::sim::{Delivery, SimConfig};

    #[test]
    fn pins_mapped_ranges_and_refuses_unmapped_ones() {
        let net = SimNet::new(SimConfig::new(2, 1, Delivery::Auto));
        let mut p = SimPins::new(net, 1);
        let buf = vec![0u8; 3 * 4096];
        let rkey = p
            .pin(buf.as_ptr() as u64, buf.len(), Rights::BOTH)
            .expect("mapped");
        assert_eq!((p.bytes(), p.regions()), (buf.len() as u64, 1));
        p.unpin(buf.as_ptr() as u64, buf.len(), rkey);
        assert_eq!((p.bytes(), p.regions()), (0, 0));
        p.unpin(buf.as_ptr() as u64, buf.len(), rkey);
        assert_eq!(p.unknown_unpins(), 1);
        // The first page is never mapped.
        assert_eq!(p.pin(0, 4096, Rights::READ), Err(PinFailure::Unmapped));
        assert_eq!(p.write(8, b"x"), Err(PinFailure::Unmapped));
    }

    #[test]
    fn read_only_memory_pins_for_reading_only() {
        let net = SimNet::new(SimConfig::new(2, 1, Delivery::Auto));
        let mut p = SimPins::new(net, 1);
        // SAFETY: a fresh private mapping, unmapped at the end.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(m, libc::MAP_FAILED);
        let a = m as u64;
        assert!(!writable(a, 8192));
        assert_eq!(p.pin(a, 8192, Rights::WRITE), Err(PinFailure::Unmapped));
        assert_eq!(p.pin(a, 8192, Rights::BOTH), Err(PinFailure::Unmapped));
        let k = p.pin(a, 8192, Rights::READ).expect("read-only pin");
        p.unpin(a, 8192, k);
        // A put riding in a move cannot write there either.
        assert_eq!(p.write(a, b"x"), Err(PinFailure::Unmapped));
        let buf = vec![0u8; 3 * 4096];
        assert!(writable(buf.as_ptr() as u64, buf.len()));
        // SAFETY: mapped above.
        unsafe { libc::munmap(m, 8192) };
    }
}
