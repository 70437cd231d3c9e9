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

/// Runs a binary's parser (`from_parser`) over `args` (without the program name), with
/// `finish`'s convention.
#[allow(dead_code)] // not every binary that includes this file parses its arguments here
pub fn parse<I, A>(
    args: I,
    from_parser: fn(lexopt::Parser) -> Result<Option<A>, lexopt::Error>,
) -> Result<A, String>
where
    I: IntoIterator<Item: Into<std::ffi::OsString>>,
{
    finish(from_parser(lexopt::Parser::from_args(args)))
}

/// Turns a parser's result into the binaries' convention: `Err("")` means help was asked for
/// (`Ok(None)` from the parser), any other `Err` is the message to print.
pub fn finish<A>(parsed: Result<Option<A>, lexopt::Error>) -> Result<A, String> {
    parsed.map_err(|e| e.to_string())?.ok_or_else(String::new)
}

/// The parsed arguments, or the end of the process as every bench binary ends it: `--help`
/// prints the usage (exit 0), a bad argument prints `name: error` and the usage on stderr
/// (exit 2).
#[allow(dead_code)] // am_bench, fh_bench, reg_write_bw print their help on stderr instead
pub fn or_exit<A>(parsed: Result<A, String>, name: &str, usage: &str) -> A {
    use std::io::Write as _;
    match parsed {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            print!("{usage}");
            let _ = std::io::stdout().flush();
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("{name}: {e}\n{usage}");
            std::process::exit(2);
        }
    }
}
