//! The C ABI (in progress).
