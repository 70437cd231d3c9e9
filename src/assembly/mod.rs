//! One assembly of a pin-down cache, for the C API (`fh_cache_new`, and the local cache of an
//! `fh_init` context) and for the LD_PRELOAD shim (a cache per protection domain and rights
//! class): the backend wrapped so a caller can tell a miss from a hit on its own thread
//! (`helper::pin_flag`), the limits, userfaultfd watching of registered ranges, the fork mode, the
//! subscription to memory events, and the helper thread. What to build comes from the caller's
//! settings, read once (`config::Config`); nothing here reads the environment.
//!
//! A layer of its own, below `ffi` and beside `rma` (which builds no cache). Owns: nothing that
//! outlives the call: it returns the parts it assembled.
//! May call: `cache`, `monitor` (subscribe; the userfaultfd watcher), `helper`, `pin`, `config`
//! (the helper's settings type), `rt`.

use std::fmt;
use std::sync::Arc;

use crate::cache::{Cache, Limits, RangeWatcher};
use crate::config::HelperSettings;
use crate::helper::{self, Helper, HelperConfig, Placement};
use crate::monitor::{self, MemoryListener, Subscription, UffdWatcher};
use crate::pin::fork_mode::ForkMode;
use crate::pin::Pinner;
use crate::rt::race_once::RaceOnce;

/// What a cache is made of.
pub struct Parts {
    /// The real backend (verbs, mlock, ...).
    pub pinner: Arc<dyn Pinner>,
    pub limits: Limits,
    /// Watch every registered range with userfaultfd (the monitor opened it).
    pub uffd_watch: bool,
    /// What the cache does around a `fork` (resolved: `fork_mode::resolve`).
    pub fork: ForkMode,
    /// Subscribe to memory events. Only a test double deaf to them goes without (the shim's
    /// `FH_TEST_NO_INVALIDATE`).
    pub events: bool,
    /// The helper thread, if asked for.
    pub helper: Option<HelperConfig>,
}

/// An assembled cache. Field order is drop order: events stop reaching the cache, then the
/// helper is stopped and joined, then the cache goes.
pub struct Assembled {
    pub subscription: Option<Subscription>,
    pub helper: Helper,
    pub cache: Arc<Cache>,
}

/// The helper's configuration from the settings (`None`: `FH_HELPER=0`).
pub fn helper_config(h: &HelperSettings) -> Option<HelperConfig> {
    h.enabled.then(|| HelperConfig {
        placement: h.cpu.map_or(Placement::Auto, Placement::Cpu),
        min_bytes: h.min_bytes,
        clock: h.clock,
        ..HelperConfig::default()
    })
}

/// Why a cache could not be assembled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AssembleError {
    /// No room to subscribe one more listener to memory events (`monitor::MAX_LISTENERS`).
    TooManyCaches,
}

impl fmt::Display for AssembleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AssembleError::TooManyCaches => {
                f.write_str("too many caches: no room to subscribe one more to memory events")
            }
        }
    }
}

impl std::error::Error for AssembleError {}

/// The backend's own listener (`Pinner::memory_listener`: the mlock backend's count of locked
/// pages), subscribed once per process and never dropped: the count it feeds is the process's,
/// and outlives every cache. Without a slot the backend goes without (the mlock count then keeps
/// a pin whose memory went away counted until that pin is undone, as before the feed), and the
/// next cache assembled tries again.
fn subscribe_backend(l: Arc<dyn MemoryListener>) {
    // Not `OnceLock`: a thread forked while another was making it would wait for it for good.
    static SUBSCRIBED: RaceOnce<Subscription> = RaceOnce::new();
    if SUBSCRIBED.get().is_some() {
        return;
    }
    let s = monitor::subscribe(l);
    if s.is_active() {
        // Two caches assembled at once may both subscribe: the loser's drops (unsubscribes).
        SUBSCRIBED.get_or_init(|| s);
    }
}

/// Build the cache. `AssembleError::TooManyCaches` when it cannot be subscribed to memory events (a
/// cache nobody invalidates would serve stale registrations; it pinned nothing yet, so dropping
/// it releases nothing).
pub fn assemble(p: Parts) -> Result<Assembled, AssembleError> {
    let backend_listener = p.pinner.memory_listener();
    // Always flagged: the helper's front and the shim both tell a miss from a hit this way.
    let pinner = helper::wrap_backend(p.pinner);
    let watcher: Option<Arc<dyn RangeWatcher>> = if p.uffd_watch {
        Some(Arc::new(UffdWatcher))
    } else {
        None
    };
    let cache = Cache::new(pinner, p.limits, watcher);
    cache.set_fork_mode(p.fork);
    let subscription = if p.events {
        let s = monitor::subscribe(cache.clone() as Arc<dyn MemoryListener>);
        if !s.is_active() {
            return Err(AssembleError::TooManyCaches);
        }
        // After the cache's own: the cache never fails for the backend's sake.
        if let Some(l) = backend_listener {
            subscribe_backend(l);
        }
        Some(s)
    } else {
        None
    };
    let helper = match p.helper {
        Some(cfg) => Helper::start(&cache, cfg),
        None => Helper::off("not asked for (FH_HELPER=0)"),
    };
    Ok(Assembled {
        subscription,
        helper,
        cache,
    })
}
