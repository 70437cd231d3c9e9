//! Settings: the `fh_config` struct and `FH_*` environment variables (in progress).
