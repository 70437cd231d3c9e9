//! The device list (`ibv_get_device_list`) and opening a device by name or the first one.
//!
//! On a kernel without RDMA support `ibv_get_device_list` returns NULL with ENOSYS; that, an empty
//! list and an unknown name are all `VerbsError::NoDevice`, never a panic, so callers can skip.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_device, ibv_free_device_list, ibv_get_device_list, ibv_get_device_name};

use super::context::Context;
use super::error::{VerbsError, VerbsResult};

/// An owned `ibv_get_device_list` result. Devices borrowed from it are only valid while it lives;
/// contexts opened from them stay valid after it is freed (libibverbs documents this).
pub struct DeviceList {
    raw: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    /// Ask libibverbs for the devices. NULL (ENOSYS, no sysfs class, ...) is `NoDevice`.
    pub fn get() -> VerbsResult<Self> {
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer for the duration of the call.
        let raw = unsafe { ibv_get_device_list(&mut n) };
        match NonNull::new(raw) {
            Some(raw) => Ok(DeviceList {
                raw,
                len: usize::try_from(n).unwrap_or(0),
            }),
            None => Err(VerbsError::NoDevice(format!(
                "ibv_get_device_list: {}",
                std::io::Error::last_os_error()
            ))),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The devices in list order.
    pub fn iter(&self) -> impl Iterator<Item = Device<'_>> + '_ {
        (0..self.len).map(move |i| {
            // SAFETY: libibverbs returned an array of `len` valid device pointers (plus a NULL
            // terminator) that lives until `self` is dropped; `i < len`.
            let raw = unsafe { *self.raw.as_ptr().add(i) };
            Device {
                raw,
                _list: PhantomData,
            }
        })
    }

    /// Open the device called `name`, or the first one when `name` is `None`.
    pub fn open(&self, name: Option<&str>) -> VerbsResult<Arc<Context>> {
        let mut devices = self.iter();
        let dev = match name {
            None => devices
                .next()
                .ok_or_else(|| VerbsError::NoDevice("device list is empty".into()))?,
            Some(want) => devices.find(|d| d.name() == want).ok_or_else(|| {
                let have: Vec<String> = self.iter().map(|d| d.name()).collect();
                VerbsError::NoDevice(format!("no device named {want:?} (have {have:?})"))
            })?,
        };
        dev.open()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `ibv_get_device_list` and is freed exactly once, here.
        unsafe { ibv_free_device_list(self.raw.as_ptr()) };
    }
}

/// One device of a `DeviceList`, borrowed from it.
pub struct Device<'l> {
    raw: *mut ibv_device,
    _list: PhantomData<&'l DeviceList>,
}

impl Device<'_> {
    /// Kernel name of the device (`rxe0`, `mlx5_0`, ...).
    pub fn name(&self) -> String {
        // SAFETY: `raw` is a live device of the borrowed list; the name is a NUL-terminated
        // string owned by it, copied out before the borrow ends.
        unsafe {
            let p = ibv_get_device_name(self.raw);
            if p.is_null() {
                return String::new();
            }
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }

    /// Open a verbs context on this device.
    pub fn open(&self) -> VerbsResult<Arc<Context>> {
        // SAFETY: `raw` is a live device of the borrowed list.
        unsafe { Context::open(self.raw, self.name()) }
    }
}

/// Open the device called `name` (or the first device) in one call.
pub fn open_device(name: Option<&str>) -> VerbsResult<Arc<Context>> {
    DeviceList::get()?.open(name)
}
