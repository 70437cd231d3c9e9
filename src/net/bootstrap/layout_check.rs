//! Test helper: compile a small C program that prints `name value` lines (sizes, offsets,
//! constants from a real C header), run it, and compare with what the Rust declarations say.
//! Used for the hand-written PMIx types and for `fh_bootstrap_ops` in `include/firehose.h`.

use std::process::Command;

/// Compiles `src` with `cc` plus `extra` arguments into a temporary executable, runs it and
/// parses its `name value` lines.
pub(crate) fn compile_and_run(src: &str, extra: &[String]) -> Result<Vec<(String, usize)>, String> {
    // Unique per test process and source, so parallel tests never share a binary.
    let stem = std::path::Path::new(src)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("layout");
    let exe = std::env::temp_dir().join(format!("fh-{stem}-{}", std::process::id()));
    let cc = Command::new("cc")
        .arg("-std=gnu11")
        .arg("-Wall")
        .arg("-Werror")
        .arg(src)
        .args(extra)
        .arg("-o")
        .arg(&exe)
        .output()
        .map_err(|e| format!("cannot run cc: {e}"))?;
    if !cc.status.success() {
        return Err(format!(
            "cc {src} failed:\n{}",
            String::from_utf8_lossy(&cc.stderr)
        ));
    }
    let run = Command::new(&exe).output();
    let _ = std::fs::remove_file(&exe);
    let run = run.map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    if !run.status.success() {
        return Err(format!("{} exited with {}", exe.display(), run.status));
    }
    String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|l| {
            let (name, value) = l
                .rsplit_once(' ')
                .ok_or_else(|| format!("bad line {l:?}"))?;
            let value = value
                .parse()
                .map_err(|e| format!("bad value in {l:?}: {e}"))?;
            Ok((name.to_string(), value))
        })
        .collect()
}

/// Panics with every difference listed (not just the first), and if either side names something
/// the other does not.
pub(crate) fn compare(ours: &[(&str, usize)], theirs: &[(String, usize)]) {
    let mut bad = Vec::new();
    for (name, v) in ours {
        match theirs.iter().find(|(n, _)| n == name) {
            Some((_, c)) if c == v => {}
            Some((_, c)) => bad.push(format!("{name}: Rust {v}, C header {c}")),
            None => bad.push(format!("{name}: not printed by the C check")),
        }
    }
    for (name, _) in theirs {
        if !ours.iter().any(|(n, _)| n == name) {
            bad.push(format!("{name}: printed by C, not checked by Rust"));
        }
    }
    assert!(bad.is_empty(), "layout mismatches:\n  {}", bad.join("\n  "));
}
