//! What a `fh_cache *` points to: the cache plus what keeps it wired to the rest of the process.

use std::sync::Arc;

use crate::cache::Cache;
use crate::helper::Helper;
use crate::monitor::Subscription;

/// A registration cache. Opaque: create with `fh_cache_new`, free with `fh_cache_free` or
/// `fh_cache_finalize`. Every call on one cache may come from any thread concurrently, except
/// freeing it.
// Not `repr(C)`, so cbindgen emits only `typedef struct fh_cache fh_cache;`.
// Field order is drop order, and it matters: the monitor subscription goes first so that no hook
// can call into the cache while it unpins everything in `Cache::drop`; then the helper thread is
// stopped and joined (it holds a reference to the cache), so the cache drops here, not on it.
pub struct fh_cache {
    /// Held only to be dropped first (unsubscribes; see above).
    pub(crate) _subscription: Option<Subscription>,
    /// The helper thread (Li et al., "Scalable Memory Registration for High Performance Networks
    /// Using Helper Threads" (CF 2011)), on or off (`FH_HELPER`).
    pub(crate) helper: Helper,
    pub(crate) cache: Arc<Cache>,
    /// `FH_MONITOR_*` bits it was built with (after defaults and env), for `fh_info`.
    pub(crate) monitor_requested: u32,
    /// Human-readable backend description ("verbs (rxe0, caller PD)", "mlock").
    pub(crate) backend_detail: String,
}
