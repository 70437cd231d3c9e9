//! Thread-local depth guard: only the outermost verbs call of a thread goes through the cache.
//!
//! Inside libibverbs `ibv_reg_mr` jumps to `ibv_reg_mr_iova2` through the PLT, so one application
//! call can enter our hooks twice; and anything the shim itself triggers while handling a call must
//! reach the real function. The counter is const-initialised and has no destructor, so touching it
//! never allocates and never registers a TLS destructor (safe in any thread, at any time).

use std::cell::Cell;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Held while a hook handles an application call; dropping it leaves the shim.
pub(crate) struct Outermost {
    _private: (),
}

impl Outermost {
    /// `Some` for an application call, `None` when this thread is already inside a hook
    /// (the caller must then pass straight through to the real function).
    pub(crate) fn enter() -> Option<Outermost> {
        DEPTH.with(|d| {
            if d.get() == 0 {
                d.set(1);
                Some(Outermost { _private: () })
            } else {
                None
            }
        })
    }
}

impl Drop for Outermost {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(0));
    }
}

/// True while this thread is inside a hook.
#[cfg(test)]
fn inside() -> bool {
    DEPTH.with(|d| d.get() != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_enter_is_refused_until_the_outer_guard_drops() {
        assert!(!inside());
        let outer = Outermost::enter().expect("first entry is the outermost");
        assert!(inside());
        assert!(
            Outermost::enter().is_none(),
            "nested entry must pass through"
        );
        assert!(
            inside(),
            "a refused nested entry must not clear the outer one"
        );
        drop(outer);
        assert!(!inside());
        assert!(Outermost::enter().is_some());
    }

    #[test]
    fn depth_is_per_thread() {
        let _outer = Outermost::enter().unwrap();
        let other = std::thread::spawn(|| Outermost::enter().is_some())
            .join()
            .unwrap();
        assert!(
            other,
            "another thread's call is an application call of its own"
        );
    }
}
