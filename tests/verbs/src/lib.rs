//! Shared pieces of the real-verbs test programs: page-aligned buffers, byte patterns and their
//! check, and the exit-code convention (0 pass, 77 skip, 1 fail) the suite scripts read.

pub mod buffer;
pub mod pattern;

/// Exit code for "passed".
pub const EXIT_PASS: i32 = 0;
/// Exit code for "could not run here" (no device), as automake and scripts/verbs-suite read it.
pub const EXIT_SKIP: i32 = 77;
/// Exit code for "ran and found a problem".
pub const EXIT_FAIL: i32 = 1;
