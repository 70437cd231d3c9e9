//! Link options of `libfirehose_preload.so`.
//!
//! - Its own SONAME (without one, the library's `libfirehose.so.0` could reach it, cargo#9562).
//! - `-z nodelete`: libc's unmap entries are patched to jump into the shim's copy of the library, so
//!   a dlclose() must never unmap it (the library's build script asks for it too, transitively).
//! - Exports: only what the shim interposes on purpose (`exports.list`: the ibv_* hooks, the libc
//!   unmap family, `fh_preload_stats`). The library's `fh_*` C ABI is linked in as an rlib and rustc
//!   would export it from this cdylib as well; an application that links libfirehose.so and
//!   preloads the shim would then have its `fh_*` calls bound to the shim's copy (preloaded objects
//!   come first in symbol lookup), with two sets of the library's globals. A linker version script
//!   cannot say this: rustc already passes its own anonymous one (`global:` every `#[no_mangle]` of
//!   the crate graph, `local: *`), and GNU ld and gold refuse a second ("anonymous version tag
//!   cannot be combined with other version tags"). `--exclude-libs=ALL` does it instead: symbols
//!   that come from archives (every rlib: firehose, std, libc crate) are not exported, even when a
//!   version script lists them; the shim's own code is linked from object files and keeps its
//!   exports. (This relies on the shim crate not being merged with its dependencies by LTO.)
//!   `scripts/check-readme` checks the result against `exports.list`.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libfirehose_preload.so");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--exclude-libs=ALL");
}
