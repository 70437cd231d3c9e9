//! Reliable-connected queue pair: creation, the RESET -> INIT -> RTR -> RTS transitions, and
//! posting RDMA WRITE / RDMA READ / SEND / RECV work requests.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{
    ibv_create_qp, ibv_destroy_qp, ibv_modify_qp, ibv_post_recv, ibv_post_send, ibv_qp,
    ibv_qp_attr, ibv_qp_attr_mask as mask, ibv_qp_cap, ibv_qp_init_attr, ibv_qp_state, ibv_qp_type,
    ibv_query_qp, ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wr_opcode,
};

use super::cq::Cq;
use super::path::{Endpoint, Path};
use crate::pin::verbs::{Pd, VerbsError, VerbsResult};
use crate::pin::Access;

/// Queue sizes asked for at creation (and, from `Qp::caps`, what the device actually granted:
/// providers round up, and `max_inline_data` may come back larger or be refused outright).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    /// Largest send whose payload the QP copies at post time (`IBV_SEND_INLINE`).
    pub max_inline_data: u32,
    /// Every send work request completes with a CQ entry (`sq_sig_all`); when false, only those
    /// posted with `SendFlags::signaled` do.
    pub signal_all: bool,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            signal_all: true,
        }
    }
}

/// Per-post send flags (only meaningful with `QpCaps::signal_all == false` for `signaled`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags {
    /// Generate a completion for this work request.
    pub signaled: bool,
    /// Copy the payload into the work request at post time: no lkey needed, and the buffer may be
    /// reused as soon as the post returns. Only up to `Qp::caps().max_inline_data` bytes.
    pub inline: bool,
}

impl SendFlags {
    /// One completion, payload read from registered memory by the device.
    pub const SIGNALED: SendFlags = SendFlags {
        signaled: true,
        inline: false,
    };

    /// The `ibv_send_wr::send_flags` bits.
    fn bits(self) -> u32 {
        let mut f = 0;
        if self.signaled {
            f |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if self.inline {
            f |= ibv_send_flags::IBV_SEND_INLINE.0;
        }
        f
    }
}

/// RC transport timing (see IB spec 9.7.6): how long to wait for an ACK before retransmitting,
/// how often to retransmit before failing the QP, and the receiver-not-ready policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpTiming {
    /// Local ACK timeout exponent: 4.096 us * 2^timeout per attempt (0 = wait forever).
    pub ack_timeout: u8,
    /// Retransmissions after a timeout before the send completes with RETRY_EXC_ERR (0..=7).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (0..=6; 7 = retry forever).
    pub rnr_retry: u8,
    /// RNR NAK delay this QP asks senders to wait (IB encoding: 12 = 0.64 ms, 18 = 5.12 ms).
    pub min_rnr_timer: u8,
    /// RDMA READs this QP may have outstanding as initiator (`max_rd_atomic`): at most the
    /// peer's responder depth, or the peer fails the QP.
    pub rd_atomic: u8,
    /// RDMA READs this QP serves at once as responder (`max_dest_rd_atomic`).
    pub dest_rd_atomic: u8,
}

impl Default for QpTiming {
    /// Generous values for tests and benchmarks: Soft-RoCE under TCG is slow.
    fn default() -> Self {
        QpTiming {
            ack_timeout: ACK_TIMEOUT,
            retry_cnt: RETRY_CNT,
            rnr_retry: RNR_RETRY,
            min_rnr_timer: MIN_RNR_TIMER,
            rd_atomic: RD_ATOMIC,
            dest_rd_atomic: RD_ATOMIC,
        }
    }
}

/// One scatter/gather element: registered local memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// Transport timing knobs. Defaults are generous because Soft-RoCE under TCG is slow.
const ACK_TIMEOUT: u8 = 14; // 4.096 us * 2^14 ~ 67 ms per retry
const RETRY_CNT: u8 = 7;
const RNR_RETRY: u8 = 7; // 7 = retry forever on receiver-not-ready
const MIN_RNR_TIMER: u8 = 12; // 0.64 ms
/// Outstanding RDMA READs by default; rxe and every HCA support at least 1.
pub(super) const RD_ATOMIC: u8 = 1;
const HOP_LIMIT: u8 = 64;
/// Most work requests `post_chain` posts in one call.
pub(super) const MAX_CHAIN: usize = 16;

/// One work request of a chain (`Qp::post_chain`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChainWr {
    pub wr_id: u64,
    pub op: WrOp,
    pub local: Sge,
    pub flags: SendFlags,
}

/// What a chained work request does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WrOp {
    /// SEND `local` to the peer's next posted receive.
    Send,
    /// RDMA WRITE `local` to `remote_addr` (covered by `rkey`).
    Write { remote_addr: u64, rkey: u32 },
    /// RDMA READ from `remote_addr` (covered by `rkey`) into `local`.
    Read { remote_addr: u64, rkey: u32 },
}

impl ChainWr {
    /// A placeholder entry (a SEND of nothing) for filling fixed-size arrays.
    pub(crate) const EMPTY: ChainWr = ChainWr {
        wr_id: 0,
        op: WrOp::Send,
        local: Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        },
        flags: SendFlags {
            signaled: false,
            inline: false,
        },
    };
}

/// An owned RC `ibv_qp`. Holds its PD and both CQs, which therefore outlive it.
pub struct Qp {
    raw: NonNull<ibv_qp>,
    caps: QpCaps,
    _pd: Arc<Pd>,
    _send_cq: Arc<Cq>,
    _recv_cq: Arc<Cq>,
}

// SAFETY: posting and modifying are thread-safe in libibverbs providers (they lock the queues);
// the struct has no Rust-side mutable state.
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}

impl Qp {
    /// Create an RC QP on `pd` with `caps` (by default every send work request is signalled).
    pub fn create_rc(
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        caps: QpCaps,
    ) -> VerbsResult<Self> {
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.as_raw(),
            recv_cq: recv_cq.as_raw(),
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: caps.max_send_sge,
                max_recv_sge: caps.max_recv_sge,
                max_inline_data: caps.max_inline_data,
            },
            qp_type: ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: i32::from(caps.signal_all),
        };
        // SAFETY: PD and CQs are alive (Arcs held); `init` is a valid, fully initialised struct.
        let raw = unsafe { ibv_create_qp(pd.as_raw(), &mut init) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_create_qp"))?;
        // ibv_create_qp writes back the capacities it actually granted.
        let got = QpCaps {
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: init.cap.max_recv_wr,
            max_send_sge: init.cap.max_send_sge,
            max_recv_sge: init.cap.max_recv_sge,
            max_inline_data: init.cap.max_inline_data,
            signal_all: caps.signal_all,
        };
        Ok(Qp {
            raw,
            caps: got,
            _pd: Arc::clone(pd),
            _send_cq: Arc::clone(send_cq),
            _recv_cq: Arc::clone(recv_cq),
        })
    }

    pub fn as_raw(&self) -> *mut ibv_qp {
        self.raw.as_ptr()
    }

    /// What the device granted at creation (at least what was asked).
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: `raw` is a live QP until drop; qp_num is immutable after creation.
        unsafe { (*self.raw.as_ptr()).qp_num }
    }

    /// What a peer needs to connect to this QP through `path`, sending from `psn`.
    pub fn endpoint(&self, path: &Path, psn: u32) -> Endpoint {
        Endpoint {
            qpn: self.qpn(),
            psn: psn & 0xff_ffff,
            lid: path.lid,
            gid: path.gid,
        }
    }

    /// Current state as reported by the device (`ibv_qp_state` value).
    pub fn state(&self) -> VerbsResult<u32> {
        // SAFETY: plain-data structs; all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is alive and both out-pointers are valid.
        let ret = unsafe {
            ibv_query_qp(
                self.as_raw(),
                &mut attr,
                mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        };
        if ret != 0 {
            return Err(VerbsError::from_ret("ibv_query_qp", ret));
        }
        Ok(attr.qp_state)
    }

    fn modify(&self, attr: &mut ibv_qp_attr, m: mask, op: &'static str) -> VerbsResult<()> {
        // SAFETY: the QP is alive and `attr` is fully initialised for the fields in `m`.
        let ret = unsafe { ibv_modify_qp(self.as_raw(), attr, m.0 as i32) };
        if ret != 0 {
            return Err(VerbsError::from_ret(op, ret));
        }
        Ok(())
    }

    /// RESET -> INIT on `port`, allowing the remote side the rights in `remote_access`.
    pub(crate) fn to_init(&self, port: u8, remote_access: Access) -> VerbsResult<()> {
        // SAFETY: plain-data struct; all-zero is valid and means "unset".
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = remote_access.0;
        let m = mask::IBV_QP_STATE | mask::IBV_QP_PKEY_INDEX | mask::IBV_QP_PORT;
        self.modify(&mut a, m | mask::IBV_QP_ACCESS_FLAGS, "ibv_modify_qp(INIT)")
    }

    /// INIT -> RTR with `timing.min_rnr_timer` (the only timing field the responder side uses).
    pub(crate) fn to_rtr_with(
        &self,
        path: &Path,
        remote: &Endpoint,
        timing: QpTiming,
    ) -> VerbsResult<()> {
        // SAFETY: plain-data struct; all-zero is valid and means "unset".
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = path.mtu;
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = timing.dest_rd_atomic.max(1);
        a.min_rnr_timer = timing.min_rnr_timer;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.sl = 0;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = path.port;
        if let Some(index) = path.gid_index {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = remote.gid.to_raw();
            a.ah_attr.grh.sgid_index = index;
            a.ah_attr.grh.hop_limit = HOP_LIMIT;
            a.ah_attr.grh.flow_label = 0;
            a.ah_attr.grh.traffic_class = 0;
        }
        let m = mask::IBV_QP_STATE
            | mask::IBV_QP_AV
            | mask::IBV_QP_PATH_MTU
            | mask::IBV_QP_DEST_QPN
            | mask::IBV_QP_RQ_PSN
            | mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut a, m, "ibv_modify_qp(RTR)")
    }

    /// RTR -> RTS: start sending from `psn` with `timing`.
    pub(crate) fn to_rts_with(&self, psn: u32, timing: QpTiming) -> VerbsResult<()> {
        // SAFETY: plain-data struct; all-zero is valid and means "unset".
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.timeout = timing.ack_timeout;
        a.retry_cnt = timing.retry_cnt;
        a.rnr_retry = timing.rnr_retry;
        a.sq_psn = psn & 0xff_ffff;
        a.max_rd_atomic = timing.rd_atomic.max(1);
        let m = mask::IBV_QP_STATE
            | mask::IBV_QP_TIMEOUT
            | mask::IBV_QP_RETRY_CNT
            | mask::IBV_QP_RNR_RETRY
            | mask::IBV_QP_SQ_PSN
            | mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, m, "ibv_modify_qp(RTS)")
    }

    /// All three transitions: connect this QP (sending from `local_psn`) to `remote`.
    pub fn connect(
        &self,
        path: &Path,
        local_psn: u32,
        remote_access: Access,
        remote: &Endpoint,
    ) -> VerbsResult<()> {
        self.connect_with(path, local_psn, remote_access, remote, QpTiming::default())
    }

    /// `connect` with explicit transport timing.
    pub(crate) fn connect_with(
        &self,
        path: &Path,
        local_psn: u32,
        remote_access: Access,
        remote: &Endpoint,
        timing: QpTiming,
    ) -> VerbsResult<()> {
        self.to_init(path.port, remote_access)?;
        self.to_rtr_with(path, remote, timing)?;
        self.to_rts_with(local_psn, timing)
    }

    /// Post one send-queue work request with a single SGE.
    ///
    /// # Safety
    /// See the `post_*` wrappers.
    #[inline]
    unsafe fn post_send_wr(
        &self,
        wr_id: u64,
        opcode: u32,
        local: Sge,
        remote: Option<(u64, u32)>,
        flags: SendFlags,
    ) -> VerbsResult<()> {
        let mut sge = ibv_sge {
            addr: local.addr,
            length: local.len,
            lkey: local.lkey,
        };
        // SAFETY: ibv_send_wr is plain data (pointers, integers, unions of those); zero is valid.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.next = std::ptr::null_mut();
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = opcode;
        wr.send_flags = flags.bits();
        if let Some((remote_addr, rkey)) = remote {
            wr.wr.rdma.remote_addr = remote_addr;
            wr.wr.rdma.rkey = rkey;
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is alive; `wr` and `sge` live across the call (the provider copies them
        // into the send queue before returning, and with INLINE copies the payload too); buffer
        // validity is the caller's contract.
        let ret = unsafe { ibv_post_send(self.as_raw(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(VerbsError::from_ret("ibv_post_send", ret));
        }
        Ok(())
    }

    /// SEND `local` to the peer's next posted receive, with `flags`.
    ///
    /// # Safety
    /// Without `flags.inline`: `local` must be registered memory that stays valid and unmodified
    /// until this or a later signalled work request of this QP completes. With `flags.inline`:
    /// `local.len <= caps().max_inline_data` and `local` readable for the call (lkey unused).
    #[inline]
    pub unsafe fn post_send(&self, wr_id: u64, local: Sge, flags: SendFlags) -> VerbsResult<()> {
        // SAFETY: forwarded contract.
        unsafe { self.post_send_wr(wr_id, ibv_wr_opcode::IBV_WR_SEND, local, None, flags) }
    }

    /// Several work requests as one chain: one `ibv_post_send`, so one doorbell (with Soft-RoCE
    /// one system call) for all of them. At most `MAX_CHAIN` entries (the rest are ignored). On
    /// error, `Err((posted, e))`: the first `posted` went to the send queue (in order), the rest
    /// did not.
    ///
    /// # Safety
    /// Each entry as `post_send`, `post_rdma_write` or `post_rdma_read` for its kind.
    pub(crate) unsafe fn post_chain(&self, wrs_in: &[ChainWr]) -> Result<(), (usize, VerbsError)> {
        let n = wrs_in.len().min(MAX_CHAIN);
        if n == 0 {
            return Ok(());
        }
        // SAFETY: plain data (integers, pointers, unions of those); zero is valid for both.
        let mut sges: [ibv_sge; MAX_CHAIN] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut wrs: [ibv_send_wr; MAX_CHAIN] = unsafe { std::mem::zeroed() };
        for (i, c) in wrs_in[..n].iter().enumerate() {
            sges[i] = ibv_sge {
                addr: c.local.addr,
                length: c.local.len,
                lkey: c.local.lkey,
            };
            let wr = &mut wrs[i];
            wr.wr_id = c.wr_id;
            wr.num_sge = 1;
            wr.send_flags = c.flags.bits();
            let (opcode, remote) = match c.op {
                WrOp::Send => (ibv_wr_opcode::IBV_WR_SEND, None),
                WrOp::Write { remote_addr, rkey } => {
                    (ibv_wr_opcode::IBV_WR_RDMA_WRITE, Some((remote_addr, rkey)))
                }
                WrOp::Read { remote_addr, rkey } => {
                    (ibv_wr_opcode::IBV_WR_RDMA_READ, Some((remote_addr, rkey)))
                }
            };
            wr.opcode = opcode;
            if let Some((remote_addr, rkey)) = remote {
                wr.wr.rdma.remote_addr = remote_addr;
                wr.wr.rdma.rkey = rkey;
            }
        }
        let base = wrs.as_mut_ptr();
        for i in 0..n {
            // SAFETY: i < n <= MAX_CHAIN: inside both arrays, which do not move until the call
            // below has returned.
            unsafe {
                (*base.add(i)).sg_list = sges.as_mut_ptr().add(i);
                (*base.add(i)).next = if i + 1 < n {
                    base.add(i + 1)
                } else {
                    std::ptr::null_mut()
                };
            }
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is alive; the chain and its SGEs live across the call (the provider
        // copies them, and inline payloads, into the send queue before returning); buffer
        // validity is the caller's contract.
        let ret = unsafe { ibv_post_send(self.as_raw(), base, &mut bad) };
        if ret != 0 {
            // `bad` points at the first request not posted; everything before it was.
            let posted = if bad.is_null() {
                0
            } else {
                // SAFETY: the provider sets `bad` to an element of the chain we passed.
                (unsafe { bad.offset_from(base) }).clamp(0, n as isize) as usize
            };
            return Err((posted, VerbsError::from_ret("ibv_post_send", ret)));
        }
        Ok(())
    }

    /// RDMA WRITE `local` to `remote_addr` (covered by `rkey`), with `flags`.
    ///
    /// # Safety
    /// As `post_send` for `local`, plus: `[remote_addr, +len)` must be memory the peer allows
    /// us to write and does not otherwise rely on.
    pub unsafe fn post_rdma_write(
        &self,
        wr_id: u64,
        local: Sge,
        remote_addr: u64,
        rkey: u32,
        flags: SendFlags,
    ) -> VerbsResult<()> {
        // SAFETY: forwarded contract.
        unsafe {
            self.post_send_wr(
                wr_id,
                ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                local,
                Some((remote_addr, rkey)),
                flags,
            )
        }
    }

    /// RDMA READ from `remote_addr` (covered by `rkey`) into `local`, with `flags` (`inline` is
    /// meaningless for a READ and must be false).
    ///
    /// # Safety
    /// As `post_send` for `local`, except that the device writes it: nobody else may read or write
    /// it until the completion; the remote range must stay valid for reading.
    pub unsafe fn post_rdma_read(
        &self,
        wr_id: u64,
        local: Sge,
        remote_addr: u64,
        rkey: u32,
        flags: SendFlags,
    ) -> VerbsResult<()> {
        debug_assert!(!flags.inline);
        // SAFETY: forwarded contract.
        unsafe {
            self.post_send_wr(
                wr_id,
                ibv_wr_opcode::IBV_WR_RDMA_READ,
                local,
                Some((remote_addr, rkey)),
                flags,
            )
        }
    }

    /// Post a receive buffer.
    ///
    /// # Safety
    /// `local` must be registered memory that stays valid and is not accessed by anyone else
    /// until the receive completion is polled (the device writes it).
    #[inline]
    pub unsafe fn post_recv(&self, wr_id: u64, local: Sge) -> VerbsResult<()> {
        let mut sge = ibv_sge {
            addr: local.addr,
            length: local.len,
            lkey: local.lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the QP is alive; `wr`/`sge` outlive the call; buffer validity is the caller's.
        let ret = unsafe { ibv_post_recv(self.as_raw(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(VerbsError::from_ret("ibv_post_recv", ret));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed exactly once; PD/CQs are still alive
        // because this struct holds Arcs of them.
        unsafe { ibv_destroy_qp(self.raw.as_ptr()) };
    }
}
