//! How the driver names ranks and ops (a leaf: every other file uses them).

/// A process of the job, as the driver numbers them (`0..size`); the same type as
/// `firehose::net::Rank`.
pub type Rank = u32;

/// The driver's name for an op (unique among its unfinished ops).
pub type OpId = u64;
