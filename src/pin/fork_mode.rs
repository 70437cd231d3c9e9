//! What a `fork` does to registrations a cache keeps, and what the cache does about it
//! (`FH_FORK_MODE`).
//!
//! A cache keeps registrations after the application released them. On a kernel that does not
//! copy DMA-pinned pages at fork (before Linux 5.13; libibverbs tells), that goes wrong in two ways:
//!
//! - With libibverbs' fork protection (`ibv_fork_init`, `RDMAV_FORK_SAFE`), every registered range
//!   carries `MADV_DONTFORK`, so a child of `fork` has no pages there. Without a cache the
//!   application's `ibv_dereg_mr` gives the pages back to children; an idle cached registration
//!   keeps them out, and a child that reads a buffer its parent had released faults. So the
//!   caches deregister their idle registrations before each fork ([`ForkMode::Release`]).
//!   libfabric's EFA provider flushes its MR cache from an atfork handler for the same reason.
//! - Without fork protection, the parent's pinned pages are shared copy-on-write with the child,
//!   and the parent's next write to one moves the parent to a copy: the registration still points
//!   at the page the child now owns. For registrations the application holds across the fork
//!   that is its own affair (libibverbs documents it); a cache must not make it worse by handing
//!   such a registration out again later. So besides releasing the idle ones before the fork, the
//!   parent retires every cached registration after it ([`ForkMode::Retire`]): held ones stay
//!   valid for their holders and are deregistered at their release, the next request pins anew.
//!
//! With a kernel that copies pinned pages at fork (libibverbs: `IBV_FORK_UNNEEDED`), and for the
//! mlock backend (nothing is shared with a NIC), a fork changes nothing ([`ForkMode::Keep`]).
//! The child's side is the same in every mode: an inherited cache is quarantined
//! (`Cache::quarantine`).

/// What a cache does around a `fork` in the parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ForkMode {
    /// Nothing.
    Keep = 0,
    /// Deregister every idle registration before the fork.
    Release = 1,
    /// `Release`, and after the fork retire every cached registration (held ones at release).
    Retire = 2,
}

impl ForkMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ForkMode::Keep => "keep",
            ForkMode::Release => "release",
            ForkMode::Retire => "retire",
        }
    }

    pub fn from_u8(v: u8) -> ForkMode {
        match v {
            1 => ForkMode::Release,
            2 => ForkMode::Retire,
            _ => ForkMode::Keep,
        }
    }
}

/// `FH_FORK_MODE`: `auto` (the default) or a fixed mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkSetting {
    /// Keep for the mlock backend; for verbs, what libibverbs reports (see `from_status`).
    Auto,
    Fixed(ForkMode),
}

/// `auto`, `keep`, `release` or `retire` (any case); anything else is `None`.
pub fn parse(v: &str) -> Option<ForkSetting> {
    Some(match v.trim().to_ascii_lowercase().as_str() {
        "auto" => ForkSetting::Auto,
        "keep" => ForkSetting::Fixed(ForkMode::Keep),
        "release" => ForkSetting::Fixed(ForkMode::Release),
        "retire" => ForkSetting::Fixed(ForkMode::Retire),
        _ => return None,
    })
}

/// The mode for a cache over a verbs backend (`verbs`) or another one. Asks libibverbs at most
/// once per call; call it when the cache is made, not inside a fork handler.
pub fn resolve(setting: ForkSetting, verbs: bool) -> ForkMode {
    match setting {
        ForkSetting::Fixed(m) => m,
        ForkSetting::Auto if !verbs => ForkMode::Keep,
        ForkSetting::Auto => from_status(libibverbs_fork_status()),
    }
}

/// `ibv_is_fork_initialized()`'s answer: `IBV_FORK_UNNEEDED` (2) -> Keep, `IBV_FORK_ENABLED` (1)
/// -> Release, `IBV_FORK_DISABLED` (0) -> Retire. A libibverbs without that function (an old
/// rdma-core) cannot say whether the kernel copies pinned pages: Retire, the mode that is
/// right on either kind of kernel.
pub(crate) fn from_status(status: Option<i32>) -> ForkMode {
    match status {
        Some(2) => ForkMode::Keep,
        Some(1) => ForkMode::Release,
        _ => ForkMode::Retire,
    }
}

/// `ibv_is_fork_initialized()` of the libibverbs this process uses, if it has one. Looked up by
/// name (the function is newer than some libibverbs the library must still load with), through
/// libibverbs' own handle: UCX loads it `RTLD_LOCAL`, out of reach of a global lookup.
fn libibverbs_fork_status() -> Option<i32> {
    // SAFETY: NUL-terminated name; RTLD_NOLOAD only returns an object already loaded and runs no
    // constructors. The handle is never closed (as `verbs/direct.rs`).
    let h = unsafe {
        libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
        )
    };
    let h = if h.is_null() { libc::RTLD_DEFAULT } else { h };
    // SAFETY: a handle from dlopen (or RTLD_DEFAULT) and a NUL-terminated name.
    let f = unsafe { libc::dlsym(h, c"ibv_is_fork_initialized".as_ptr()) };
    if f.is_null() {
        return None;
    }
    // SAFETY: libibverbs' `enum ibv_fork_status ibv_is_fork_initialized(void)`.
    let f: extern "C" fn() -> i32 = unsafe { std::mem::transmute(f) };
    Some(f())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_bad_ones_are_refused() {
        assert_eq!(parse("auto"), Some(ForkSetting::Auto));
        assert_eq!(
            parse(" Release "),
            Some(ForkSetting::Fixed(ForkMode::Release))
        );
        assert_eq!(parse("retire"), Some(ForkSetting::Fixed(ForkMode::Retire)));
        assert_eq!(parse("keep"), Some(ForkSetting::Fixed(ForkMode::Keep)));
        for bad in ["", "1", "flush", "keepx"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn auto_follows_libibverbs_and_is_keep_without_verbs() {
        assert_eq!(from_status(Some(2)), ForkMode::Keep);
        assert_eq!(from_status(Some(1)), ForkMode::Release);
        assert_eq!(from_status(Some(0)), ForkMode::Retire);
        assert_eq!(from_status(None), ForkMode::Retire);
        assert_eq!(resolve(ForkSetting::Auto, false), ForkMode::Keep);
        let fixed = ForkSetting::Fixed(ForkMode::Release);
        assert_eq!(resolve(fixed, false), ForkMode::Release);
        assert_eq!(resolve(fixed, true), ForkMode::Release);
    }

    #[test]
    fn modes_round_trip_through_their_byte() {
        for m in [ForkMode::Keep, ForkMode::Release, ForkMode::Retire] {
            assert_eq!(ForkMode::from_u8(m as u8), m);
        }
    }
}
