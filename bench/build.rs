//! Builds the tiny C adapters over UCX's registration cache and libfabric's MR cache against the
//! installed headers, so struct layouts (`ucs_rcache_params_t`...) always match the libraries we link.
fn main() {
    println!("cargo:rerun-if-changed=csrc/ucx_shim.c");
    println!("cargo:rerun-if-changed=csrc/ofi_shim.c");
    cc::Build::new()
        .file("csrc/ucx_shim.c")
        .file("csrc/ofi_shim.c")
        .flag_if_supported("-Wall")
        .flag_if_supported("-Wextra")
        .opt_level(2)
        .compile("fhb_ucx_shim");
    println!("cargo:rustc-link-lib=dylib=ucs");
    println!("cargo:rustc-link-lib=dylib=ucm");
    // libfabric's MR cache (verbs provider), compared inside the Soft-RoCE VM.
    println!("cargo:rustc-link-lib=dylib=fabric");
}
