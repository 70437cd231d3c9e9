//! A count of callers inside some section, raised for as long as a guard lives: lowered on drop,
//! so a caller that unwinds (a listener or backend that panics) is counted out too. The listener
//! registry's in-flight calls and the helper's unpins in progress use it; both are waited on
//! (unsubscribe, a fork's release), so a count left raised would wait forever.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

pub(crate) struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    /// Count the caller in (SeqCst: a waiter that reads zero afterwards saw the whole section).
    #[inline(always)]
    pub(crate) fn enter(count: &'a AtomicUsize) -> Counted<'a> {
        count.fetch_add(1, SeqCst);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}
