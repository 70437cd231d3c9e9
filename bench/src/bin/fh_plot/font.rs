//! The one font the figures' text is drawn with (plotters' ab_glyph text: pure Rust, no
//! fontconfig or freetype): a TrueType file found on the system, read once per process and
//! registered with plotters as `chart::FAMILY`.

use plotters::style::FontStyle;
use std::sync::OnceLock;

/// Where Debian/Ubuntu (fonts-dejavu-core), Fedora and Arch put DejaVu Sans, then Liberation
/// Sans as a fallback.
const CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// The environment variable naming a font file to use instead.
pub const ENV: &str = "FH_PLOT_FONT";

/// What the error for a missing font starts with (the tests look for it to skip).
pub const NO_FONT: &str = "no font";

static FONT: OnceLock<Result<(), String>> = OnceLock::new();

/// Finds, reads and registers the font (once per process; later calls give the first result).
/// Err: one line saying what is missing.
pub fn load() -> Result<(), String> {
    FONT.get_or_init(|| {
        let path = find()?;
        let bytes = std::fs::read(&path).map_err(|e| format!("font {path}: {e}"))?;
        // plotters keeps the font for the process: the bytes live as long.
        plotters::style::register_font(crate::chart::FAMILY, FontStyle::Normal, bytes.leak())
            .map_err(|_| format!("font {path}: not a TrueType/OpenType font"))
    })
    .clone()
}

/// `FH_PLOT_FONT` when set (it must be a file), else the first candidate there is.
fn find() -> Result<String, String> {
    if let Some(p) = std::env::var_os(ENV).filter(|p| !p.is_empty()) {
        let p = p.to_string_lossy().into_owned();
        return if std::path::Path::new(&p).is_file() {
            Ok(p)
        } else {
            Err(format!("{NO_FONT}: {ENV}={p} is not a file"))
        };
    }
    CANDIDATES
        .iter()
        .find(|p| std::path::Path::new(p).is_file())
        .map(|p| p.to_string())
        .ok_or_else(|| {
            format!(
                "{NO_FONT} found (looked for {} and others): install fonts-dejavu-core or set {ENV} to a .ttf file",
                CANDIDATES[0]
            )
        })
}
