//! fh_plot as scripts/bench-fh and scripts/bench-helper run it: PNGs of the expected size from
//! good input; one line on stderr and exit 1 (never a panic) from bad input. The tests that
//! draw skip, saying "SKIP: no font", on a machine without DejaVu Sans (fonts-dejavu-core).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_fh_plot");

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fh_plot-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fh_plot(args: &[&Path]) -> Output {
    Command::new(BIN).args(args).output().expect("run fh_plot")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Whether the run failed only for want of a font (then the test skips).
fn no_font(o: &Output) -> bool {
    if !o.status.success() && stderr(o).starts_with("fh_plot: no font") {
        println!("SKIP: no font ({})", stderr(o).trim());
        return true;
    }
    false
}

/// A failed run as the scripts expect it: exit 1, one line on stderr naming the problem.
fn assert_fails(o: &Output, want: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(!e.contains("panicked"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e:?}");
    assert!(
        e.starts_with("fh_plot: ") && e.contains(want),
        "{e:?} lacks {want:?}"
    );
}

/// A PNG file's width and height, from its IHDR chunk (the first, right after the signature).
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(b.len() > 33, "{}: {} bytes", path.display(), b.len());
    assert_eq!(
        &b[..8],
        b"\x89PNG\r\n\x1a\n",
        "{}: no PNG signature",
        path.display()
    );
    assert_eq!(
        &b[8..16],
        b"\0\0\0\x0dIHDR",
        "{}: no IHDR first",
        path.display()
    );
    let be = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    (be(16), be(20))
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bench-fh-small.json")
}

#[test]
fn fh_draws_figs_3_to_5_at_880_by_550() {
    let d = scratch("fh");
    let out = d.join("made/by/fh_plot"); // made if missing
    let o = fh_plot(&["fh".as_ref(), &fixture(), &out]);
    if no_font(&o) {
        return;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    for f in ["fig3.png", "fig4.png", "fig5.png"] {
        assert_eq!(png_size(&out.join(f)), (880, 550), "{f}");
        let said = String::from_utf8_lossy(&o.stdout);
        assert!(
            said.contains(&format!("wrote {}", out.join(f).display())),
            "{said}"
        );
    }
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn fh_skips_a_figure_whose_sweep_is_missing() {
    let d = scratch("fh-peak");
    let json = d.join("peak.json");
    std::fs::write(
        &json,
        r#"{"sweeps": {"peak": [{"series": "firehose", "bytes": 8, "bw_peak_mb_s": 0.2},
                                {"series": "firehose", "bytes": 4096, "bw_peak_mb_s": 30}]}}"#,
    )
    .unwrap();
    let o = fh_plot(&["fh".as_ref(), &json, &d]);
    if no_font(&o) {
        return;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(png_size(&d.join("fig5.png")), (880, 550));
    assert!(!d.join("fig3.png").exists() && !d.join("fig4.png").exists());
    std::fs::remove_dir_all(d).unwrap();
}

/// helper_bench --series files: `ms,bytes` steps.
fn write_series(dir: &Path, prog: &str) {
    for mode in ["nocache", "lazy", "helper"] {
        for suffix in ["", "-model"] {
            let mut s = String::from("ms,bytes\n");
            for i in 0..20 {
                let bytes = if mode == "nocache" {
                    (i % 2) << 18
                } else {
                    (i % 4) << 20
                };
                s += &format!("{:.4},{bytes}\n", i as f64 * 1.5);
            }
            std::fs::write(dir.join(format!("{prog}-{mode}{suffix}.csv")), s).unwrap();
        }
    }
}

#[test]
fn helper_draws_a_row_per_program() {
    let d = scratch("helper");
    let series = d.join("series");
    std::fs::create_dir_all(&series).unwrap();
    write_series(&series, "fig1");
    write_series(&series, "mg");
    let png = d.join("pinned.png");
    let o = fh_plot(&["helper".as_ref(), &series, &png]);
    if no_font(&o) {
        return;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    // 13 x 3.2 inches per row at 110 dpi, two rows.
    assert_eq!(png_size(&png), (1430, 704));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn bad_json_is_one_line_and_exit_1() {
    let d = scratch("bad-json");
    let cases = [
        ("truncated.json", "{\"sweeps\": {\"lat\": [", "not JSON"),
        ("list.json", "[]", "not a JSON object"),
        (
            "empty.json",
            "{\"sweeps\": {\"config\": {\"m\": 1}}}",
            "no rows",
        ),
        (
            "nonumber.json",
            r#"{"sweeps": {"lat": [{"series": "firehose", "working_set": 4096}]}}"#,
            "sweeps.lat[0] (firehose) has no number \"t_typical_us\"",
        ),
    ];
    for (name, text, want) in cases {
        let json = d.join(name);
        std::fs::write(&json, text).unwrap();
        let o = fh_plot(&["fh".as_ref(), &json, &d]);
        assert_fails(&o, want);
        assert!(o.stdout.is_empty(), "{name}");
    }
    assert_fails(
        &fh_plot(&["fh".as_ref(), &d.join("absent.json"), &d]),
        "absent.json",
    );
    assert!(std::fs::read_dir(&d)
        .unwrap()
        .all(|e| !e.unwrap().path().ends_with("fig3.png")));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn missing_or_bad_series_is_one_line_and_exit_1() {
    let d = scratch("bad-series");
    let png = d.join("pinned.png");
    assert_fails(&fh_plot(&["helper".as_ref(), &d, &png]), "no series in");
    assert_fails(
        &fh_plot(&["helper".as_ref(), &d.join("absent"), &png]),
        "not a directory",
    );
    std::fs::write(d.join("cg-lazy.csv"), "ms,bytes\n0,0\n1.5,many\n").unwrap();
    assert_fails(&fh_plot(&["helper".as_ref(), &d, &png]), "cg-lazy.csv:3:");
    assert!(!png.exists());
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_missing_font_is_one_line_and_exit_1() {
    let d = scratch("font");
    let o = Command::new(BIN)
        .args(["fh".as_ref(), fixture().as_path(), d.as_path()])
        .env("FH_PLOT_FONT", d.join("absent.ttf"))
        .output()
        .unwrap();
    assert_fails(&o, "no font: FH_PLOT_FONT=");
    // A file that is no font.
    let o = Command::new(BIN)
        .args(["fh".as_ref(), fixture().as_path(), d.as_path()])
        .env("FH_PLOT_FONT", fixture())
        .output()
        .unwrap();
    assert_fails(&o, "not a TrueType/OpenType font");
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn usage() {
    let o = Command::new(BIN).arg("--help").output().unwrap();
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("fh_plot fh BENCH-FH.JSON OUTDIR"));
    for args in [
        &[][..],
        &["fh", "x.json"],
        &["plot", "a", "b"],
        &["helper", "dir", "out.jpg"],
    ] {
        let o = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).starts_with("fh_plot: "), "{args:?}");
        assert!(!stderr(&o).contains("panicked"));
    }
}
