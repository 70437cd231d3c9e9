//! Builds the tiny C adapter over UCX's registration cache against the installed UCX headers,
//! so the `ucs_rcache_params_t` layout always matches the libucs we link.
fn main() {
    println!("cargo:rerun-if-changed=csrc/ucx_shim.c");
    cc::Build::new()
        .file("csrc/ucx_shim.c")
        .flag_if_supported("-Wall")
        .flag_if_supported("-Wextra")
        .opt_level(2)
        .compile("fhb_ucx_shim");
    println!("cargo:rustc-link-lib=dylib=ucs");
    println!("cargo:rustc-link-lib=dylib=ucm");
}
