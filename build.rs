//! Build script: SONAME and `-z nodelete` for the cdylib, and the C header generated with cbindgen
//! into OUT_DIR.
//!
//! The header goes to `$OUT_DIR/firehose.h`, never into the source tree, so a normal build does
//! not dirty the checkout; `scripts/check-header` compares it with the checked-in
//! `include/firehose.h` (and `--update` copies it over).

use std::path::PathBuf;

fn main() {
    // A cdylib gets no SONAME by default; C programs would then record an absolute path.
    // `rustc-link-arg`, not `rustc-cdylib-link-arg`: cargo hands a dependency's cdylib link args
    // to the cdylib of every crate that depends on it (cargo#9562), which gave
    // libfirehose_preload.so this SONAME. `rustc-link-arg` stays in this package; its executables
    // (tests, examples) get a DT_SONAME too, which nothing looks at (none dlopens libfirehose.so.0).
    println!("cargo:rustc-link-arg=-Wl,-soname,libfirehose.so.0");
    // The monitor patches libc's entry points to jump into this library, so its code must never be
    // unmapped: dlclose() keeps a NODELETE object loaded. Deliberately `rustc-cdylib-link-arg`, so
    // it also reaches every cdylib that embeds this crate (the preload shim, a user's cdylib): each
    // of them patches libc to jump into itself. (ld drops the flag from executables.)
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");

    // `fh_register` passes its caller's return address to the helper thread's predictor through
    // a naked function (stable since Rust 1.88; written for x86_64 and aarch64); elsewhere it is
    // a plain function that reports no call site.
    println!("cargo:rustc-check-cfg=cfg(fh_naked)");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if rustc_minor().is_some_and(|m| m >= 88) && matches!(arch.as_str(), "x86_64" | "aarch64") {
        println!("cargo:rustc-cfg=fh_naked");
    }

    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("firehose.h");
    for input in ["cbindgen.toml", "src/ffi"] {
        println!("cargo:rerun-if-changed={input}");
    }
    let config =
        cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml is valid");
    // Parse only the ABI's own sources, so that public items elsewhere in the crate can never leak
    // into the header.
    match cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/ffi/mod.rs"))
        .generate()
    {
        Ok(bindings) => {
            bindings.write_to_file(&out);
        }
        // A header failure must not stop the Rust build (e.g. while a module is half-written);
        // scripts/check-header fails loudly instead when the header is missing.
        Err(e) => {
            let _ = std::fs::remove_file(&out);
            println!("cargo:warning=cbindgen failed, no header generated: {e}");
        }
    }
}

/// The minor version of the compiler cargo uses (`rustc 1.MINOR.x ...`).
fn rustc_minor() -> Option<u32> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.split_whitespace().nth(1)?;
    let mut parts = version.split('.');
    (parts.next()? == "1").then_some(())?;
    parts.next()?.parse().ok()
}
