//! What peers may reach here: the exposure policy every pin a peer asks for and every
//! put that rides in a move is checked against before anything is pinned or written.
//!
//! `FH_EXPOSE=all` (the default; Firehose's model: any address of the process) or `declared`:
//! only the ranges the application exposed (`fh_expose(ctx, addr, len, access)`, withdrawn with
//! `fh_unexpose`) with the rights asked for (a byte's rights are the union of the exposures that
//! cover it; a pin covers whole buckets, so an exposure that does not start and end on bucket
//! boundaries serves RDMA only in its inner buckets, and small puts up to its bytes). In both
//! modes the library's own registered memory (the link's receive and send rings and probe words,
//! `Link::own_buffers`) is never a target. Refused: `RemoteError::Denied` in the reply, so the
//! initiator's op fails with `FH_ERR_REMOTE_DENIED` and nothing changed at the target.
//!
//! `Exposed` wraps the target's `RegionPins` with the check (and is what `Rma` hands the
//! algorithm). Shared by the wrapper (under the engine lock) and `fh_expose` callers: an
//! `RwLock`, read once per pin or small put on a miss, never on a hit.

use std::sync::{Arc, RwLock};

use firehose_proto::{PinFailure, RegionPins, Rights};

/// `FH_EXPOSE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExposeMode {
    /// Any mapped address (but the library's own buffers).
    All = 0,
    /// Only what the application exposed.
    Declared = 1,
}

impl ExposeMode {
    /// From the environment; unset is `All`. Err: the message for a bad value.
    pub fn from_env() -> Result<ExposeMode, String> {
        match std::env::var("FH_EXPOSE") {
            Err(_) => Ok(ExposeMode::All),
            Ok(v) => Self::parse(&v),
        }
    }

    pub fn parse(v: &str) -> Result<ExposeMode, String> {
        match v.trim() {
            "all" | "" => Ok(ExposeMode::All),
            "declared" => Ok(ExposeMode::Declared),
            _ => Err(format!("FH_EXPOSE={v}: expected all or declared")),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// (start, end, rights) of every `expose` not yet withdrawn, in call order.
    declared: Vec<(u64, u64, Rights)>,
    /// (start, end) of the library's own memory.
    library: Vec<(u64, u64)>,
}

/// The policy of one context.
#[derive(Debug)]
pub struct Exposure {
    mode: ExposeMode,
    st: RwLock<State>,
}

/// `[a, a + len)` as (start, end), or `None` if empty or past the address space.
fn span(a: u64, len: usize) -> Option<(u64, u64)> {
    let end = a.checked_add(len as u64)?;
    (len > 0).then_some((a, end))
}

impl Exposure {
    pub fn new(mode: ExposeMode) -> Arc<Exposure> {
        Arc::new(Exposure {
            mode,
            st: RwLock::new(State::default()),
        })
    }

    pub fn mode(&self) -> ExposeMode {
        self.mode
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.st.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.st.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks `[addr, addr + len)` as the library's own: never a target, in any mode.
    pub(crate) fn add_library(&self, addr: u64, len: usize) {
        if let Some(s) = span(addr, len) {
            self.write().library.push(s);
        }
    }

    /// The library's own ranges (for tests and the VM scripts' targets).
    pub fn library(&self) -> Vec<(u64, usize)> {
        let st = self.read();
        st.library
            .iter()
            .map(|&(a, e)| (a, (e - a) as usize))
            .collect()
    }

    /// Exposes `[addr, addr + len)` to peers with `rights` (recorded in both modes; only
    /// `Declared` consults it). False: empty, overflowing, or no rights.
    pub fn expose(&self, addr: u64, len: usize, rights: Rights) -> bool {
        match span(addr, len) {
            Some((a, e)) if rights.is_valid() => {
                self.write().declared.push((a, e, rights));
                true
            }
            _ => false,
        }
    }

    /// Withdraws the latest exposure of exactly `[addr, addr + len)`. False if there is none.
    pub fn unexpose(&self, addr: u64, len: usize) -> bool {
        let Some((a, e)) = span(addr, len) else {
            return false;
        };
        let mut st = self.write();
        match st.declared.iter().rposition(|d| d.0 == a && d.1 == e) {
            Some(i) => {
                st.declared.remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether peers may reach every byte of `[addr, addr + len)` with `rights`.
    pub fn allows(&self, addr: u64, len: usize, rights: Rights) -> bool {
        let Some((a, e)) = span(addr, len) else {
            return false;
        };
        let st = self.read();
        if st.library.iter().any(|&(la, le)| la < e && a < le) {
            return false;
        }
        if self.mode == ExposeMode::All {
            return true;
        }
        // Covered by the union of the exposures that have the rights.
        let mut cover: Vec<(u64, u64)> = (st.declared.iter())
            .filter(|d| d.2.covers(rights) && d.0 < e && a < d.1)
            .map(|d| (d.0, d.1))
            .collect();
        cover.sort_unstable();
        let mut cur = a;
        for (s, t) in cover {
            if s > cur {
                return false;
            }
            cur = cur.max(t);
            if cur >= e {
                return true;
            }
        }
        false
    }
}

/// The target's pins behind the exposure check.
pub struct Exposed {
    pub inner: Box<dyn RegionPins + Send>,
    pub policy: Arc<Exposure>,
}

impl RegionPins for Exposed {
    fn pin(&mut self, addr: u64, len: usize, rights: Rights) -> Result<u32, PinFailure> {
        if !self.policy.allows(addr, len, rights) {
            return Err(PinFailure::Denied);
        }
        self.inner.pin(addr, len, rights)
    }
    fn unpin(&mut self, addr: u64, len: usize, rkey: u32) {
        self.inner.unpin(addr, len, rkey)
    }
    /// A put riding in a move: written only where a put may write.
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), PinFailure> {
        if !self.policy.allows(addr, data.len(), Rights::WRITE) {
            return Err(PinFailure::Denied);
        }
        self.inner.write(addr, data)
    }
    fn key_for(
        &mut self,
        peer: crate::net::Rank,
        addr: u64,
        len: usize,
        rights: Rights,
        rkey: u32,
    ) -> Result<u32, PinFailure> {
        self.inner.key_for(peer, addr, len, rights, rkey)
    }
    fn drop_key(&mut self, peer: crate::net::Rank, rkey: u32, key: u32) {
        self.inner.drop_key(peer, rkey, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!(ExposeMode::parse("all"), Ok(ExposeMode::All));
        assert_eq!(ExposeMode::parse("declared"), Ok(ExposeMode::Declared));
        assert!(ExposeMode::parse("some").is_err());
    }

    #[test]
    fn declared_ranges_and_rights() {
        let x = Exposure::new(ExposeMode::Declared);
        assert!(!x.allows(0x1000, 8, Rights::READ), "nothing exposed");
        assert!(x.expose(0x1000, 0x2000, Rights::READ));
        assert!(x.expose(0x3000, 0x1000, Rights::BOTH));
        assert!(x.allows(0x1000, 0x3000, Rights::READ), "union of two");
        assert!(
            !x.allows(0x1000, 0x3000, Rights::WRITE),
            "write only in the second"
        );
        assert!(x.allows(0x3000, 0x1000, Rights::WRITE));
        assert!(!x.allows(0x3fff, 2, Rights::READ), "one byte past");
        assert!(!x.allows(0xfff, 2, Rights::READ), "one byte before");
        assert!(!x.unexpose(0x1000, 0x1000), "not an exposure");
        assert!(x.unexpose(0x1000, 0x2000));
        assert!(!x.allows(0x1000, 8, Rights::READ));
        assert!(!x.expose(0x1000, 0, Rights::READ));
        assert!(!x.expose(0x1000, 8, Rights::NONE));
        assert!(!x.expose(u64::MAX, 8, Rights::READ));
    }

    #[test]
    fn library_memory_is_never_a_target() {
        for mode in [ExposeMode::All, ExposeMode::Declared] {
            let x = Exposure::new(mode);
            x.add_library(0x10000, 0x1000);
            x.expose(0, 0x100000, Rights::BOTH);
            assert!(x.allows(0x8000, 0x8000, Rights::BOTH), "{mode:?}");
            assert!(!x.allows(0x8000, 0x8001, Rights::READ), "{mode:?}");
            assert!(!x.allows(0x10fff, 1, Rights::WRITE), "{mode:?}");
            assert!(x.allows(0x11000, 1, Rights::WRITE), "{mode:?}");
        }
    }
}
