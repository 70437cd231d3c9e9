//! The next definitions of the libc unmap-family functions we export, for our hooks to call.
//!
//! These hooks can run before any constructor (another library's constructor unmapping memory)
//! and from inside the dynamic loader, where calling `dlsym` is not safe. So resolution happens
//! once, in our constructor ([`resolve`]); until then each hook issues the raw system call itself.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) type MunmapFn = unsafe extern "C" fn(*mut c_void, usize) -> c_int;
pub(crate) type MremapFn =
    unsafe extern "C" fn(*mut c_void, usize, usize, c_int, ...) -> *mut c_void;
pub(crate) type MadviseFn = unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int;
pub(crate) type MmapFn =
    unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void;
pub(crate) type ShmdtFn = unsafe extern "C" fn(*const c_void) -> c_int;

static MUNMAP: AtomicUsize = AtomicUsize::new(0);
static MREMAP: AtomicUsize = AtomicUsize::new(0);
static MADVISE: AtomicUsize = AtomicUsize::new(0);
static MMAP: AtomicUsize = AtomicUsize::new(0);
static SHMDT: AtomicUsize = AtomicUsize::new(0);

fn next(name: &CStr) -> usize {
    // SAFETY: called from our constructor (not from inside the loader); `name` is NUL-terminated.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) as usize }
}

/// Resolve every target with `dlsym(RTLD_NEXT)`. Called once from the constructor.
pub(crate) fn resolve() {
    MUNMAP.store(next(c"munmap"), Ordering::Release);
    MREMAP.store(next(c"mremap"), Ordering::Release);
    MADVISE.store(next(c"madvise"), Ordering::Release);
    MMAP.store(next(c"mmap"), Ordering::Release);
    SHMDT.store(next(c"shmdt"), Ordering::Release);
}

macro_rules! loaded {
    ($slot:ident, $ty:ty) => {{
        let p = $slot.load(Ordering::Acquire);
        if p == 0 {
            None
        } else {
            // SAFETY: a non-zero slot holds what dlsym(RTLD_NEXT) returned for this libc function,
            // whose C signature `$ty` mirrors.
            Some(unsafe { std::mem::transmute::<usize, $ty>(p) })
        }
    }};
}

pub(crate) fn munmap() -> Option<MunmapFn> {
    loaded!(MUNMAP, MunmapFn)
}
pub(crate) fn mremap() -> Option<MremapFn> {
    loaded!(MREMAP, MremapFn)
}
pub(crate) fn madvise() -> Option<MadviseFn> {
    loaded!(MADVISE, MadviseFn)
}
pub(crate) fn mmap() -> Option<MmapFn> {
    loaded!(MMAP, MmapFn)
}
pub(crate) fn shmdt() -> Option<ShmdtFn> {
    loaded!(SHMDT, ShmdtFn)
}
