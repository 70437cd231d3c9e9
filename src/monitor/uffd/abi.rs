//! The userfaultfd kernel ABI: opening the fd, the API handshake, (un)registering ranges, the
//! "events in flight" probe and the event message. Numbers, structs and bits come from
//! linux-raw-sys's bindings of <linux/userfaultfd.h> (`general`, `ioctl`), not written by hand.
//! No state here.

use libc::{c_int, c_long, c_ulong};
use linux_raw_sys::general::{
    uffd_msg, uffdio_api, uffdio_range, uffdio_register, uffdio_zeropage, UFFDIO_REGISTER_MODE_WP,
    UFFD_API, UFFD_EVENT_REMAP, UFFD_EVENT_REMOVE, UFFD_EVENT_UNMAP, UFFD_FEATURE_EVENT_REMAP,
    UFFD_FEATURE_EVENT_REMOVE, UFFD_FEATURE_EVENT_UNMAP, UFFD_FEATURE_WP_HUGETLBFS_SHMEM,
    UFFD_USER_MODE_ONLY,
};
use linux_raw_sys::ioctl::{UFFDIO_API, UFFDIO_REGISTER, UFFDIO_UNREGISTER, UFFDIO_ZEROPAGE};

/// The event features we ask for (UNMAP is required, see [`open_fd`]).
const WANTED: u64 = (UFFD_FEATURE_EVENT_REMAP
    | UFFD_FEATURE_EVENT_REMOVE
    | UFFD_FEATURE_EVENT_UNMAP
    | UFFD_FEATURE_WP_HUGETLBFS_SHMEM) as u64;

pub(super) const EVENT_REMAP: u8 = UFFD_EVENT_REMAP as u8;
pub(super) const EVENT_REMOVE: u8 = UFFD_EVENT_REMOVE as u8;
pub(super) const EVENT_UNMAP: u8 = UFFD_EVENT_UNMAP as u8;

/// `struct uffd_msg`: the event byte, padding, then a 24-byte union.
pub(super) type Msg = uffd_msg;
const _: () = assert!(std::mem::size_of::<Msg>() == 32);

/// `n` empty messages to read into.
pub(super) fn msgs<const N: usize>() -> [Msg; N] {
    // SAFETY: `uffd_msg` is integers and a union of integers: all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}

/// An event and the three words of its argument: UNMAP and REMOVE `start, end, -`, REMAP
/// `from, to, len`.
pub(super) fn words(m: &Msg) -> (u8, u64, u64, u64) {
    // SAFETY: every member of the union is plain integers; `remap`'s three words cover the
    // first three of every event's argument (`remove`'s start and end are its first two).
    let r = unsafe { m.arg.remap };
    (m.event, r.from, r.to, r.len)
}

pub(super) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn raw_uffd() -> Result<c_int, i32> {
    let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as c_long;
    // SAFETY: userfaultfd takes only flags.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd >= 0 {
        return Ok(fd as c_int);
    }
    let e = errno();
    if e != libc::EPERM {
        return Err(e);
    }
    // Unprivileged with vm.unprivileged_userfaultfd=0: user-mode-only faults are still allowed,
    // and we never handle faults anyway.
    // SAFETY: as above.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_userfaultfd,
            flags | c_long::from(UFFD_USER_MODE_ONLY),
        )
    };
    if fd >= 0 {
        Ok(fd as c_int)
    } else {
        Err(errno())
    }
}

fn api(fd: c_int, features: u64) -> Result<u64, i32> {
    let mut a = uffdio_api {
        api: u64::from(UFFD_API),
        features,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes the struct we pass.
    if unsafe { libc::ioctl(fd, c_ulong::from(UFFDIO_API), &mut a as *mut uffdio_api) } != 0 {
        return Err(errno());
    }
    Ok(a.features)
}

/// Open a userfaultfd with the event features we want (the handshake can be done once per fd,
/// so probe on a first fd, then enable on a second).
pub(super) fn open_fd() -> Result<(c_int, u64), i32> {
    let probe = raw_uffd()?;
    let supported = api(probe, 0);
    // SAFETY: closing the fd we just opened.
    unsafe { libc::close(probe) };
    let want = WANTED & supported?;
    if want & u64::from(UFFD_FEATURE_EVENT_UNMAP) == 0 {
        return Err(libc::ENOTSUP);
    }
    let fd = raw_uffd()?;
    match api(fd, want) {
        Ok(_) => Ok((fd, want)),
        Err(e) => {
            // SAFETY: as above.
            unsafe { libc::close(fd) };
            Err(e)
        }
    }
}

pub(super) fn register(fd: c_int, start: usize, end: usize) -> Result<(), i32> {
    let mut r = uffdio_register {
        range: uffdio_range {
            start: start as u64,
            len: (end - start) as u64,
        },
        mode: u64::from(UFFDIO_REGISTER_MODE_WP),
        ioctls: 0,
    };
    // SAFETY: UFFDIO_REGISTER reads/writes the struct we pass; it changes VMA flags only.
    if unsafe {
        libc::ioctl(
            fd,
            c_ulong::from(UFFDIO_REGISTER),
            &mut r as *mut uffdio_register,
        )
    } == 0
    {
        Ok(())
    } else {
        Err(errno())
    }
}

pub(super) fn unregister(fd: c_int, start: usize, end: usize) -> Result<(), i32> {
    let mut r = uffdio_range {
        start: start as u64,
        len: (end - start) as u64,
    };
    // SAFETY: UFFDIO_UNREGISTER reads the struct we pass; it changes VMA flags only.
    if unsafe {
        libc::ioctl(
            fd,
            c_ulong::from(UFFDIO_UNREGISTER),
            &mut r as *mut uffdio_range,
        )
    } == 0
    {
        Ok(())
    } else {
        Err(errno())
    }
}

/// An event of ours is between its unmap and the release of the thread that unmapped.
pub(super) fn events_in_flight(fd: c_int) -> bool {
    let mut z = uffdio_zeropage {
        range: uffdio_range { start: 0, len: 0 },
        mode: 0,
        zeropage: 0,
    };
    // SAFETY: the kernel checks "events in flight" (EAGAIN) first, then rejects the empty range
    // (EINVAL): nothing is ever mapped or changed.
    let r = unsafe {
        libc::ioctl(
            fd,
            c_ulong::from(UFFDIO_ZEROPAGE),
            &mut z as *mut uffdio_zeropage,
        )
    };
    r != 0 && errno() == libc::EAGAIN
}
