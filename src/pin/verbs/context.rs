//! An open device (`ibv_context`): port and GID queries, and the parent of PDs and CQs.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{
    ___ibv_query_port, ibv_close_device, ibv_context, ibv_device, ibv_device_attr,
    ibv_device_cap_flags, ibv_gid, ibv_open_device, ibv_port_attr, ibv_port_state,
    ibv_query_device, ibv_query_gid,
};

use super::error::{VerbsError, VerbsResult};

/// `IBV_LINK_LAYER_ETHERNET` (an anonymous enum in verbs.h, so rdma-sys does not export it).
const LINK_LAYER_ETHERNET: u8 = 2;

/// An open verbs context. PDs and CQs hold an `Arc` of it, so it is closed after its children.
pub struct Context {
    raw: NonNull<ibv_context>,
    name: String,
}

// SAFETY: libibverbs contexts may be used from any thread; every verb on them is thread-safe
// (providers lock internally), and `Context` has no interior state of its own besides the name.
unsafe impl Send for Context {}
// SAFETY: as above, shared references only call thread-safe verbs.
unsafe impl Sync for Context {}

impl Context {
    /// Open `dev`.
    ///
    /// # Safety
    /// `dev` must be a live device from a device list that outlives this call.
    pub(super) unsafe fn open(dev: *mut ibv_device, name: String) -> VerbsResult<Arc<Self>> {
        // SAFETY: the caller guarantees `dev` is live.
        let raw = unsafe { ibv_open_device(dev) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_open_device"))?;
        Ok(Arc::new(Context { raw, name }))
    }

    /// The raw context, for calls this module does not wrap. Valid while `self` lives.
    pub fn as_raw(&self) -> *mut ibv_context {
        self.raw.as_ptr()
    }

    /// Device name this context was opened on.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Port attributes (ports are numbered from 1).
    /// How many RDMA READs (and atomics) one QP may have outstanding: `(as initiator, as
    /// responder)` = the device's `max_qp_init_rd_atom` and `max_qp_rd_atom`.
    pub(crate) fn rd_atomic_limits(&self) -> VerbsResult<(u32, u32)> {
        // SAFETY: ibv_device_attr is plain data; all-zero is a valid value.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `attr` is a valid out-pointer.
        let ret = unsafe { ibv_query_device(self.as_raw(), &mut attr) };
        if ret != 0 {
            return Err(VerbsError::from_ret("ibv_query_device", ret));
        }
        Ok((
            attr.max_qp_init_rd_atom.max(0) as u32,
            attr.max_qp_rd_atom.max(0) as u32,
        ))
    }

    /// Whether the device binds type 2 memory windows (type 2A or 2B): keys bound through one
    /// queue pair that work on its connection only.
    pub(crate) fn has_type2_windows(&self) -> VerbsResult<bool> {
        // SAFETY: ibv_device_attr is plain data; all-zero is a valid value.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `attr` is a valid out-pointer.
        let ret = unsafe { ibv_query_device(self.as_raw(), &mut attr) };
        if ret != 0 {
            return Err(VerbsError::from_ret("ibv_query_device", ret));
        }
        let type2 = ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A.0
            | ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0;
        Ok(attr.device_cap_flags & type2 != 0 && attr.max_mw > 0)
    }

    pub(crate) fn query_port(&self, port: u8) -> VerbsResult<PortInfo> {
        // SAFETY: ibv_port_attr is plain data; all-zero is a valid value.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `attr` is a valid out-pointer of the right size
        // (`___ibv_query_port` is rdma-sys's version of the verbs.h inline that passes the size).
        let ret = unsafe { ___ibv_query_port(self.as_raw(), port, &mut attr) };
        if ret != 0 {
            return Err(VerbsError::from_ret("ibv_query_port", ret));
        }
        Ok(PortInfo {
            state: attr.state,
            active_mtu: attr.active_mtu,
            lid: attr.lid,
            link_layer: attr.link_layer,
            gid_tbl_len: attr.gid_tbl_len,
            max_msg_sz: attr.max_msg_sz,
        })
    }

    /// GID `index` of `port`.
    pub(crate) fn query_gid(&self, port: u8, index: u8) -> VerbsResult<Gid> {
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: the context is open and `gid` is a valid out-pointer.
        let ret = unsafe { ibv_query_gid(self.as_raw(), port, i32::from(index), &mut gid) };
        if ret != 0 {
            return Err(VerbsError::from_ret("ibv_query_gid", ret));
        }
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        Ok(Gid(unsafe { gid.raw }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child (PD, CQ, ...) holds an Arc of this context, so none is alive; the
        // context is closed exactly once. A failure cannot be acted on in drop.
        unsafe { ibv_close_device(self.raw.as_ptr()) };
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

/// The parts of `ibv_port_attr` a connection needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PortInfo {
    /// `ibv_port_state` value.
    pub state: u32,
    /// `ibv_mtu` value (1 = 256 ... 5 = 4096).
    pub active_mtu: u32,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// `IBV_LINK_LAYER_*` value.
    pub link_layer: u8,
    pub gid_tbl_len: i32,
    /// Longest message (SEND or RDMA) the port carries, in bytes.
    pub max_msg_sz: u32,
}

impl PortInfo {
    pub(crate) fn is_active(&self) -> bool {
        self.state == ibv_port_state::IBV_PORT_ACTIVE
    }

    /// RoCE (Soft-RoCE included): addressing needs a GRH with a GID; LIDs are unused.
    pub(crate) fn is_ethernet(&self) -> bool {
        self.link_layer == LINK_LAYER_ETHERNET
    }
}

/// A 128-bit GID, in network byte order as the device reports it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// An unpopulated GID table slot reads as all zeros.
    pub(crate) fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }

    /// The verbs union, for address vectors (`net::verbs` builds them).
    pub(crate) fn to_raw(self) -> ibv_gid {
        ibv_gid { raw: self.0 }
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        std::net::Ipv6Addr::from(self.0).fmt(f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}
