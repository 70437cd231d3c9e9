//! wake_floor as scripts/bench-am runs it (`--json`): two phases in attn's names, every sample's
//! answer seen after the responder woke (reply >= wake > 0), and bad arguments refused with
//! the bench binaries' exit codes (2: usage, 1: a CPU that cannot be used).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_wake_floor");

fn run(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run wake_floor")
}

#[test]
fn json_has_both_phases_and_consistent_times() {
    // CPU 0 twice: the test must run on a one-CPU machine too.
    let o = run(&[
        "--json",
        "--samples",
        "5",
        "--block-ms",
        "5",
        "--cpus",
        "0,0",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(v["test"], "wake");
    let phases = v["phases"].as_array().expect("phases");
    let names: Vec<_> = phases.iter().map(|p| p["busy"].as_str().unwrap()).collect();
    assert_eq!(names, ["compute", "sleep"]);
    for p in phases {
        assert_eq!(p["samples"], 5);
        let (r, w) = (&p["reply_us"], &p["wake_us"]);
        let f = |x: &serde_json::Value, k: &str| x[k].as_f64().unwrap();
        assert!(f(w, "min") > 0.0, "{p}");
        assert!(
            f(r, "min") >= f(w, "min"),
            "an answer before the wake-up: {p}"
        );
        assert!(f(r, "typical") >= f(w, "typical"), "{p}");
        assert!(
            f(r, "min") <= f(r, "typical") && f(r, "typical") <= f(r, "max"),
            "{p}"
        );
    }
}

#[test]
fn bad_arguments_are_refused() {
    for args in [&["--samples", "0"][..], &["--cpus", "1"], &["--bogus"]] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
    }
    let o = run(&["--cpus", "0,100000", "--samples", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("CPU 100000"));
}
