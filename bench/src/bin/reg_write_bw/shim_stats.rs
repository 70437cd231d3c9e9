//! The shim's counters, when libfirehose_preload.so is loaded: looked up with dlsym so this
//! program stays a plain verbs application (it neither links nor needs the shim).

/// Leading fields of `struct fh_preload_stats` (ld-preload/include/firehose_preload.h). The
/// struct is append-only and the call copies at most `size` bytes, so a prefix is safe to ask for.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct ShimStats {
    pub struct_size: u32,
    pub flags: u32,
    pub app_reg_calls: u64,
    pub nested_calls: u64,
    pub passthrough_reg: u64,
    pub passthrough_dereg: u64,
    pub wrappers_live: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub invalidations: u64,
}

type StatsFn = unsafe extern "C" fn(*mut ShimStats, usize) -> i32;

/// A snapshot of the shim's counters, or None when the shim is not loaded.
pub fn snapshot() -> Option<ShimStats> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads the symbol tables.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"fh_preload_stats".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    // SAFETY: the header declares `int fh_preload_stats(struct fh_preload_stats *, size_t)`.
    let f: StatsFn = unsafe { std::mem::transmute::<*mut libc::c_void, StatsFn>(sym) };
    let mut s = ShimStats::default();
    // SAFETY: `s` is writable for size_of::<ShimStats>() bytes, which is what we pass.
    let rc = unsafe { f(&mut s, std::mem::size_of::<ShimStats>()) };
    (rc == 0).then_some(s)
}
