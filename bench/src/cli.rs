//! What the bench binaries' argument parsers share (each binary includes this file with
//! `#[path]`: the bench crate has no library target).

use lexopt::ValueExt;

/// The value of a numeric option; an error names the option.
#[allow(dead_code)] // not every binary has numeric options
pub fn num<T>(p: &mut lexopt::Parser, flag: &str) -> Result<T, lexopt::Error>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let v = p.value()?.string()?;
    v.parse().map_err(|e| format!("{flag} {v:?}: {e}").into())
}

/// Turns a parser's result into the binaries' convention: `Err("")` means help was asked for
/// (`Ok(None)` from the parser), any other `Err` is the message to print.
pub fn finish<A>(parsed: Result<Option<A>, lexopt::Error>) -> Result<A, String> {
    parsed.map_err(|e| e.to_string())?.ok_or_else(String::new)
}
