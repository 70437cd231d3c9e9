//! Memory windows bound for one peer. A type 2 window is bound by a work request on a queue
//! pair, and then its key works on that QP's connection only: a key this rank grants to one peer
//! is refused (remote access error) when any other peer presents it. The target's pins use this
//! (`rma::target_pins`, `FH_MW`) so that a firehose's key serves the peer that asked, and dies
//! when that peer lets go of it, while the region itself stays registered.
//!
//! Ordering: the bind goes into the peer's send queue like a message, so it takes effect before
//! anything posted to that peer after it, in particular the reply that carries the key.

use super::link::VerbsLink;
use super::qp::Qp;
use super::wr_id::{self, WrKind};
use crate::net::{LinkError, Rank};
use crate::pin::verbs::{Mr, Mw, VerbsError, VerbsResult};
use crate::pin::Access;
use rdma_sys::{ibv_post_send, ibv_send_flags, ibv_send_wr, ibv_wr_opcode};

impl Qp {
    /// Post a type 2 bind of `mw` with key `rkey` over `[addr, addr + len)` of `mr`, with the
    /// remote rights `access`.
    ///
    /// # Safety
    /// `mw` and `mr` are live objects of this QP's protection domain and outlive the work
    /// request; the range lies inside `mr`; remote write rights only if `mr` has local write.
    /// A bind the device rejects completes with an error and breaks the QP.
    #[allow(clippy::too_many_arguments)]
    unsafe fn post_bind_mw(
        &self,
        wr_id: u64,
        mw: &Mw,
        rkey: u32,
        mr: &Mr,
        addr: u64,
        len: u64,
        access: Access,
        signaled: bool,
    ) -> VerbsResult<()> {
        // SAFETY: ibv_send_wr is plain data (pointers, integers, unions of those); zero is valid.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
        if signaled {
            wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        // SAFETY: writing the bind member of a zeroed plain-data union.
        unsafe {
            let b = &mut wr.bind_mw_tso_union.bind_mw;
            b.mw = mw.as_raw();
            b.rkey = rkey;
            b.bind_info.mr = mr.as_raw();
            b.bind_info.addr = addr;
            b.bind_info.length = len;
            b.bind_info.mw_access_flags = access.0;
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is alive; `wr` lives across the call (the provider copies it); the
        // objects it names are the caller's contract.
        let ret = unsafe { ibv_post_send(self.as_raw(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(VerbsError::from_ret("ibv_post_send(BIND_MW)", ret));
        }
        Ok(())
    }
}

impl VerbsLink {
    /// Bind `mw` over `[addr, addr + len)` of `mr` for `peer` alone, with the remote rights
    /// `access` (`REMOTE_READ` and/or `REMOTE_WRITE`), and return the key to give that peer.
    /// `mr` must have local write if `access` has remote write, and `MW_BIND`. Nothing is bound
    /// (and an error returned) for a range outside `mr`, an empty one, or a lost peer.
    pub(crate) fn bind_window(
        &self,
        peer: Rank,
        mw: &mut Mw,
        mr: &Mr,
        addr: u64,
        len: usize,
        access: Access,
    ) -> Result<u32, LinkError> {
        let (lo, hi) = (mr.addr() as u64, mr.addr() as u64 + mr.len() as u64);
        let inside = len > 0 && addr >= lo && addr.checked_add(len as u64).is_some_and(|e| e <= hi);
        // A bind the device refuses would break the QP (the peer would be lost): refuse here.
        if !inside || access.0 & !Access::REMOTE.0 != 0 || peer == self.rank_of() {
            return Err(LinkError::Device(format!(
                "window bind refused: [{addr:#x}, +{len}) with access {:#x} over region [{lo:#x}, {hi:#x}) for rank {peer}",
                access.0
            )));
        }
        let rkey = mw.next_rkey();
        self.post(peer, false, |p, seq, signaled| {
            let id = wr_id::encode(WrKind::Send, peer, seq as u32);
            // SAFETY: `mw` and `mr` are on this link's PD (the caller's registrations come from
            // `Peers::pd`) and the caller keeps them until the window is dropped, which is after
            // the bind executed or was flushed; the range was checked against `mr` above.
            unsafe {
                p.qp.post_bind_mw(id, mw, rkey, mr, addr, len as u64, access, signaled)
            }
        })?;
        mw.set_rkey(rkey);
        Ok(rkey)
    }
}
