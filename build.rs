fn main() {
    // A cdylib gets no SONAME by default; C programs would then record an absolute path.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libfirehose.so.0");
}
