//! Fuzz target: random sequences of C API calls over a few mmapped arenas (mlock backend).
//!
//! - `cargo +nightly fuzz run ffi_ops` (libFuzzer; needs cargo-fuzz), or
//! - `cargo run --release --bin ffi_ops -- --smoke N [SEED]` on stable: N random inputs from a
//!   seeded PRNG through the same driver (no coverage guidance, but the same invariants).
#![cfg_attr(fuzzing, no_main)]

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    firehose_fuzz::run(data);
});

#[cfg(not(fuzzing))]
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: ffi_ops --smoke N [SEED] | ffi_ops FILE...";
    match args.get(1).map(String::as_str) {
        Some("--smoke") => {
            let n: u64 = args.get(2).and_then(|v| v.parse().ok()).expect(usage);
            let seed: u64 = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(0x5eed);
            let ops = firehose_fuzz::smoke(n, seed);
            println!("ffi_ops smoke: {n} inputs, {ops} calls, seed {seed}: all invariants held");
        }
        Some(_) => {
            // Replay crash files / corpus entries found by libFuzzer.
            for path in &args[1..] {
                let data = std::fs::read(path).expect("readable input file");
                firehose_fuzz::run(&data);
                println!("{path}: ok");
            }
        }
        None => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
}
