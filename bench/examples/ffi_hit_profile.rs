//! The C API's hit alone: `fh_register` + `fh_deregister` of one cached 4 KiB range through the
//! exported functions (panic boundary, "inside the library" marking, handle table), mlock
//! backend, no monitor. For instruction counts, as `hit_profile` is for the Rust API:
//!
//! ```text
//! cargo build --release -p firehose-bench --example ffi_hit_profile
//! valgrind --tool=callgrind target/release/examples/ffi_hit_profile 200000   # and 400000
//! ```
//!
//! Per-op counts: run N and 2N and divide the difference by N. This is a statically linked Rust
//! program: its thread-locals are cheap (local-exec); a C program using `libfirehose.so` pays a
//! `__tls_get_addr` call for each.
use firehose::ffi::*;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let buf = vec![0u8; 8192];
    let page = ((buf.as_ptr() as usize) + 4095) & !4095;
    // SAFETY: the C API used as documented: a config initialised by fh_config_init, a cache
    // freed at the end, `page` inside our live buffer, `mr` written by each successful register.
    unsafe {
        let mut cfg = std::mem::zeroed::<fh_config>();
        assert_eq!(fh_config_init(&mut cfg) as i32, 0);
        cfg.backend = 2; // FH_BACKEND_MLOCK
        cfg.monitor = 0; // no hooks: only the hit path
        let mut cache = std::ptr::null_mut();
        assert_eq!(fh_cache_new(&cfg, &mut cache) as i32, 0);
        let mut mr = std::mem::zeroed::<fh_mr>();
        for _ in 0..n {
            assert_eq!(
                fh_register(cache, page as *const _, 4096, 1, &mut mr) as i32,
                0
            );
            assert_eq!(fh_deregister(cache, mr.handle) as i32, 0);
        }
        fh_cache_free(cache);
    }
}
