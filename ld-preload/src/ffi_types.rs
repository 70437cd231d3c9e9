//! The few libibverbs types the shim touches, declared by hand so the shim needs no link-time
//! dependency on libibverbs (every process inherits LD_PRELOAD; most never use verbs).
//!
//! `struct ibv_mr` and the leading field of `struct ibv_pd` are part of the stable libibverbs ABI
//! (IBVERBS_1.1 onwards); the rest of `ibv_pd` / `ibv_context` stays opaque.

use std::ffi::{c_int, c_uint, c_void};

/// `struct ibv_mr` (verbs.h).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct IbvMr {
    pub context: *mut c_void,
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_pd` (verbs.h): `context` then `handle`.
#[repr(C)]
pub(crate) struct IbvPd {
    pub context: *mut c_void,
    pub handle: u32,
}

pub(crate) type RegMrFn = unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, c_int) -> *mut IbvMr;
pub(crate) type RegMrIovaFn =
    unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, u64, c_int) -> *mut IbvMr;
pub(crate) type RegMrIova2Fn =
    unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, u64, c_uint) -> *mut IbvMr;
pub(crate) type DeregMrFn = unsafe extern "C" fn(*mut IbvMr) -> c_int;
pub(crate) type ReregMrFn =
    unsafe extern "C" fn(*mut IbvMr, c_int, *mut IbvPd, *mut c_void, usize, c_int) -> c_int;
pub(crate) type DeallocPdFn = unsafe extern "C" fn(*mut IbvPd) -> c_int;
pub(crate) type AllocPdFn = unsafe extern "C" fn(*mut c_void) -> *mut IbvPd;
/// `ibv_close_device(struct ibv_context *)`: the context stays opaque here.
pub(crate) type CloseDeviceFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `enum ibv_rereg_mr_flags`.
pub(crate) const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1;
pub(crate) const IBV_REREG_MR_CHANGE_PD: c_int = 2;
pub(crate) const IBV_REREG_MR_CHANGE_ACCESS: c_int = 4;
pub(crate) const IBV_REREG_MR_FLAGS_SUPPORTED: c_int = 7;
/// `enum ibv_rereg_mr_err_code`: old MR still valid, invalid input.
pub(crate) const IBV_REREG_MR_ERR_INPUT: c_int = -1;
/// `enum ibv_rereg_mr_err_code`: the MR should not be used any more.
pub(crate) const IBV_REREG_MR_ERR_CMD: c_int = -4;
