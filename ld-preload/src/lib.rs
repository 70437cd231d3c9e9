//! LD_PRELOAD shim (issue 4, not started).
