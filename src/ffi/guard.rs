//! The one panic boundary of the C ABI.
//!
//! Unwinding out of an `extern "C"` function aborts the process (or is undefined behaviour on older
//! compilers), and a C caller cannot do anything with a Rust panic anyway. So every export runs its
//! body through `ffi_guard!`, which turns a caught panic into `FH_ERR_PANIC` (or a caller-chosen
//! fallback value for exports that do not return a status).

/// Runs `$body` under `catch_unwind`.
///
/// - `ffi_guard! { body }`: `body` evaluates to `fh_status`; a panic becomes `FH_ERR_PANIC`.
/// - `ffi_guard!(fallback = expr; { body })`: for exports returning something else (a pointer,
///   `()`); a panic yields `expr`.
/// - `ffi_guard!(inside => { body })` (also after `fallback = expr;`): the body names the guard
///   (`inside: &Inside`), to hand it to calls that would otherwise enter again (`Rma::start_in`,
///   `Rma::wait_in`: a thread-local lookup each).
///
/// The body runs marked as inside the library (`crate::rt::inside`): a memory hook that fires while
/// it holds the library's locks must not wait for the library's helper threads.
///
/// `AssertUnwindSafe` is right here: after a panic we never touch the state the closure saw again
/// in this call, and the cache's own invariants are protected by its locks (poisoning is handled
/// inside the cache).
macro_rules! ffi_guard {
    (fallback = $fallback:expr; $inside:ident => $body:block) => {{
        let guard = $crate::rt::inside::enter();
        let $inside = &guard;
        match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| $body)) {
            Ok(value) => value,
            Err(_) => $fallback,
        }
    }};
    (fallback = $fallback:expr; $body:block) => {
        $crate::ffi::guard::ffi_guard!(fallback = $fallback; _inside => $body)
    };
    ($inside:ident => $body:block) => {
        $crate::ffi::guard::ffi_guard!(
            fallback = $crate::ffi::status::fh_status::FH_ERR_PANIC; $inside => $body
        )
    };
    ($body:block) => {
        $crate::ffi::guard::ffi_guard!(
            fallback = $crate::ffi::status::fh_status::FH_ERR_PANIC; $body
        )
    };
}

pub(crate) use ffi_guard;

/// Turns a layer's `Result<(), E>` into the status a C caller sees (`super::errors`).
#[inline]
pub(crate) fn status_of<E: Into<crate::ffi::status::fh_status>>(
    r: Result<(), E>,
) -> crate::ffi::status::fh_status {
    match r {
        Ok(()) => crate::ffi::status::fh_status::FH_OK,
        Err(e) => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use crate::ffi::status::fh_status;

    fn panics() -> fh_status {
        ffi_guard! {{
            let v: Vec<u8> = Vec::new();
            // Index out of bounds on purpose: the guard must turn it into a status.
            if v[usize::MAX / 2] == 0 { fh_status::FH_OK } else { fh_status::FH_ERR_NULL }
        }}
    }

    #[test]
    fn panic_becomes_status() {
        // (The panic message is printed by the default hook; swapping the process-wide hook here
        // would race with other tests.)
        assert_eq!(panics(), fh_status::FH_ERR_PANIC);
    }

    #[test]
    fn fallback_value_on_panic() {
        let got: usize = ffi_guard!(fallback = 42; { panic!("expected panic (test)") });
        assert_eq!(got, 42);
        let ok: usize = ffi_guard!(fallback = 42; { 7 });
        assert_eq!(ok, 7);
    }
}
