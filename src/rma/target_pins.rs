//! The target side's pins: the regions peers asked Firehose to pin here, as verbs memory
//! regions with the remote rights asked for (`access_of`: a get's region is registered for
//! remote read only, so read-only memory can be pinned and its key cannot write). Firehose
//! decides what to pin and when to unpin; this only carries it out and remembers which `Mr`
//! belongs to which grant.
//!
//! With remote invalidation on, it also keeps the table the memory hook checks
//! (`revoke::PinnedRanges`: an entry goes in *before* the registration and out *after* the
//! deregistration, see there why) and has userfaultfd watch each pinned range while it is pinned
//! (from before the pin; a no-op unless the monitor opened userfaultfd), so raw `munmap` system calls and heap
//! trimming of peer-pinned memory are seen too.
//!
//! With memory windows (`FH_MW`, `super::windows`), a region is registered for window binding
//! only (its own key grants no remote access) and each holder gets a type 2 window bound through
//! its own queue pair: the key works on that peer's connection alone, and it is deallocated (dead
//! at once, the region staying registered) when that peer lets go of the region, so no key stays
//! live while its region waits in the victim FIFO. Read-only memory cannot carry windows (binding
//! needs write access to the pages): such a region gets a read-only key of its own, as without
//! windows.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::revoke::PinnedRanges;
use super::self_copy;
use super::windows::{WindowCounters, Windows};
use crate::net::Rank;
use crate::pin::verbs::{Mr, Pd, VerbsError};
use crate::pin::Access;
use firehose_proto::{PinFailure, RegionPins, Rights};

/// The verbs rights of a region pinned with `rights`: remote read for a get, remote write for a
/// put (with local write, which verbs requires alongside it). Nothing else: a region pinned for
/// gets needs no write right, so read-only memory (`PROT_READ`, a read-only file mapping) can
/// be registered, and its key cannot be used to write.
pub(crate) fn access_of(rights: Rights) -> Access {
    let mut a = Access(0);
    if rights.covers(Rights::READ) {
        a = a.union(Access::REMOTE_READ);
    }
    if rights.covers(Rights::WRITE) {
        a = a.union(Access(Access::REMOTE_WRITE.0 | Access::LOCAL_WRITE.0));
    }
    a
}

/// The remote rights alone of `rights` (a window's: local write stays with the region).
pub(crate) fn remote_access_of(rights: Rights) -> Access {
    Access(access_of(rights).0 & Access::REMOTE.0)
}

/// Verbs registrations made for peers, by (start address, region key): the rkey, or with
/// windows the lkey (a region for windows has no remote key of its own).
pub(crate) struct TargetPins {
    pd: Arc<Pd>,
    mrs: HashMap<(u64, u32), Mr>,
    /// Memory windows per holder (`None`: every holder gets the region's rkey).
    windows: Option<Windows>,
    /// With windows: the regions (by lkey) registered without window binding (read-only
    /// memory), whose holders get the region's own read-only key.
    plain: HashSet<u32>,
    /// Bytes registered now (for stats and the bound check in tests).
    bytes: u64,
    /// `unpin` calls for a region this table does not hold (a Firehose bug if ever non-zero).
    unknown_unpins: u64,
    /// What the memory hook checks (`None`: remote invalidation off).
    tracked: Option<Arc<PinnedRanges>>,
}

impl TargetPins {
    pub(crate) fn new(pd: Arc<Pd>, tracked: Option<Arc<PinnedRanges>>) -> Self {
        TargetPins {
            pd,
            mrs: HashMap::new(),
            windows: None,
            plain: HashSet::new(),
            bytes: 0,
            unknown_unpins: 0,
            tracked,
        }
    }

    /// Each holder gets a memory window of its own (see the module doc).
    pub(crate) fn with_windows(mut self, windows: Windows) -> Self {
        self.windows = Some(windows);
        self
    }

    /// The windows' counters, when windows are on.
    pub(crate) fn window_counters(&self) -> Option<Arc<WindowCounters>> {
        self.windows.as_ref().map(Windows::counters)
    }
}

fn failure(e: &VerbsError) -> PinFailure {
    match e {
        VerbsError::Call { errno, .. } if *errno == libc::EFAULT => PinFailure::Unmapped,
        VerbsError::Call { errno, .. } if *errno == libc::ENOMEM || *errno == libc::EAGAIN => {
            PinFailure::NoMemory
        }
        _ => PinFailure::Other,
    }
}

impl RegionPins for TargetPins {
    fn pin(&mut self, addr: u64, len: usize, rights: Rights) -> Result<u32, PinFailure> {
        // Tracked and watched from before the pin: an unmap by a raw system call that landed
        // between the pin and a later watch would never be reported, and the peer's puts would
        // go on landing in pages nobody maps any more.
        if let Some(t) = &self.tracked {
            t.insert(addr, len);
            crate::monitor::uffd_watch(addr as usize, len);
        }
        // `plain`: registered without window binding, its own key carries the rights.
        let mut plain = self.windows.is_none();
        let registered = match &self.windows {
            None => Mr::register(&self.pd, addr as usize, len, access_of(rights)),
            Some(_) => {
                // Remote rights come from the windows; the region itself only allows binding.
                let mut a = Access::MW_BIND;
                if rights.covers(Rights::WRITE) {
                    a = a.union(Access::LOCAL_WRITE);
                }
                match Mr::register(&self.pd, addr as usize, len, a) {
                    // Read-only memory: binding needs write access to the pages (EFAULT).
                    Err(VerbsError::Call { errno, .. })
                        if errno == libc::EFAULT && rights == Rights::READ =>
                    {
                        plain = true;
                        Mr::register(&self.pd, addr as usize, len, access_of(rights))
                    }
                    r => r,
                }
            }
        };
        let mr = match registered {
            Ok(mr) => mr,
            Err(e) => {
                if let Some(t) = &self.tracked {
                    crate::monitor::uffd_unwatch(addr as usize, len);
                    t.remove(addr, len);
                }
                return Err(failure(&e));
            }
        };
        // With windows a region is named by its lkey: one for windows has no remote key (0 on
        // some devices), and lkeys are unique among live regions.
        let rkey = match &self.windows {
            Some(_) => {
                if plain {
                    self.plain.insert(mr.lkey());
                }
                mr.lkey()
            }
            None => mr.rkey(),
        };
        self.bytes += len as u64;
        // A (start, rkey) pair is unique while the region lives: the device never hands out a
        // live rkey twice.
        self.mrs.insert((addr, rkey), mr);
        Ok(rkey)
    }

    fn unpin(&mut self, addr: u64, len: usize, rkey: u32) {
        match self.mrs.remove(&(addr, rkey)) {
            Some(mr) => {
                self.plain.remove(&rkey);
                drop(mr); // deregisters it
                self.bytes -= len as u64;
                if let Some(t) = &self.tracked {
                    crate::monitor::uffd_unwatch(addr as usize, len);
                    t.remove(addr, len);
                }
            }
            None => self.unknown_unpins += 1,
        }
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), PinFailure> {
        write_own_memory(addr, data)
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
        let Some(mr) = self.mrs.get(&(addr, rkey)) else {
            return Err(PinFailure::Other);
        };
        if self.plain.contains(&rkey) {
            // Read-only memory, no windows over it: the region's own read-only key.
            return Ok(mr.rkey());
        }
        let remote = remote_access_of(rights);
        w.bind(peer, mr, addr, len, remote)
    }

    fn drop_key(&mut self, peer: Rank, rkey: u32, key: u32) {
        // The region's own key (read-only memory) is not a window: nothing to drop.
        if let Some(w) = &mut self.windows {
            if !self.plain.contains(&rkey) {
                w.unbind(peer, key);
            }
        }
    }
}

/// A put that rode in a move, written by its target into its own memory: copied by the kernel,
/// so an unmapped target range is an error for the initiator and never a fault in this process.
/// (Every `RegionPins` of a target in this process writes this way.)
pub(crate) fn write_own_memory(addr: u64, data: &[u8]) -> Result<(), PinFailure> {
    // SAFETY: `data` is a live slice, only read (a put reads the local side).
    let r = unsafe {
        self_copy::copy(
            self_copy::Dir::Put,
            data.as_ptr().cast_mut(),
            addr,
            data.len(),
        )
    };
    r.map_err(|s| match s {
        super::RmaError::NoMemory => PinFailure::NoMemory,
        super::RmaError::RemoteFault => PinFailure::Unmapped,
        _ => PinFailure::Other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rights_map_to_the_least_verbs_access() {
        assert_eq!(access_of(Rights::READ), Access::REMOTE_READ);
        assert_eq!(
            access_of(Rights::WRITE),
            Access(Access::REMOTE_WRITE.0 | Access::LOCAL_WRITE.0)
        );
        assert_eq!(
            access_of(Rights::BOTH),
            Access(Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0 | Access::LOCAL_WRITE.0)
        );
    }
}
