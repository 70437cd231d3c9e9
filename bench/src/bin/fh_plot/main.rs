//! fh_plot: the benchmark figures as PNGs, drawn with plotters' charts (text through its ab_glyph
//! feature, from a TrueType font found on the system: no fontconfig, freetype or Python).
//!
//! - `fh_plot fh BENCH-FH.JSON OUTDIR`: figs. 3, 4 and 5 of scripts/bench-fh.
//! - `fh_plot helper SERIES_DIR OUT.png`: pinned bytes over time of scripts/bench-helper.
//!
//! Bad input (a missing file, malformed JSON or CSV, no series) or no font: one line on stderr,
//! exit 1. Usage errors: exit 2.

#[path = "../../cli.rs"]
mod cli;

mod chart;
mod fh;
mod font;
mod helper_series;

use std::ffi::OsString;
use std::path::PathBuf;

const USAGE: &str = "\
usage: fh_plot fh BENCH-FH.JSON OUTDIR      figs. 3-5 (fig3.png, fig4.png, fig5.png) of scripts/bench-fh
       fh_plot helper SERIES_DIR OUT.png    pinned bytes over time of scripts/bench-helper
                                            (the CSV files of helper_bench --series SERIES_DIR)
  Text is drawn with DejaVu Sans (Debian: fonts-dejavu-core); FH_PLOT_FONT=FILE.ttf picks another font.
";

enum Cmd {
    Fh { json: PathBuf, out: PathBuf },
    Helper { dir: PathBuf, out: PathBuf },
}

fn parse() -> Result<Cmd, String> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_env();
    cli::finish((|| {
        let mut words: Vec<OsString> = Vec::new();
        while let Some(arg) = p.next()? {
            match arg {
                Short('h') | Long("help") => return Ok(None),
                Value(v) => words.push(v),
                _ => return Err(arg.unexpected()),
            }
        }
        let mut words = words.into_iter();
        let cmd = words.next().map(|w| w.string()).transpose()?;
        let (a, b) = match (words.next(), words.next(), words.next()) {
            (Some(a), Some(b), None) => (PathBuf::from(a), PathBuf::from(b)),
            _ => return Err("expected a command and two paths".into()),
        };
        match cmd.as_deref() {
            Some("fh") => Ok(Some(Cmd::Fh { json: a, out: b })),
            Some("helper") => {
                let png = b.extension().is_some_and(|e| e.eq_ignore_ascii_case("png"));
                if !png {
                    return Err(format!("{}: the output must be a .png file", b.display()).into());
                }
                Ok(Some(Cmd::Helper { dir: a, out: b }))
            }
            Some(c) => Err(format!("unknown command {c:?} (fh or helper)").into()),
            None => Err("expected a command (fh or helper)".into()),
        }
    })())
}

fn main() {
    let cmd = cli::or_exit(parse(), "fh_plot", USAGE);
    let done = match cmd {
        Cmd::Fh { json, out } => fh::run(&json, &out),
        Cmd::Helper { dir, out } => helper_series::run(&dir, &out),
    };
    if let Err(e) = done {
        eprintln!("fh_plot: {e}");
        std::process::exit(1);
    }
}
