//! One error type for every verbs call, carrying the failing verb and its errno so a log line says
//! exactly which step broke (a bare errno from a QP transition is useless when debugging RoCE).

use std::fmt;
use std::time::Duration;

/// Why a verbs operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerbsError {
    /// No usable RDMA device: `ibv_get_device_list` failed (ENOSYS on a kernel without RDMA),
    /// returned an empty list, or the requested name is not in it.
    NoDevice(String),
    /// A verb failed; `errno` is what it reported (the return value or `errno`).
    Call { op: &'static str, errno: i32 },
    /// Polling for completions gave up.
    Timeout { what: &'static str, after: Duration },
    /// A work request completed with an error status.
    Completion {
        wr_id: u64,
        status: u32,
        text: String,
    },
}

impl VerbsError {
    /// The error of a verb that returned NULL / -1 and set `errno`.
    pub fn last(op: &'static str) -> Self {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        VerbsError::Call { op, errno }
    }

    /// The error of a verb that returns its errno directly (`ibv_modify_qp`, `ibv_post_send`...).
    /// Some providers return -1 and set errno instead, so a negative value reads errno.
    pub(crate) fn from_ret(op: &'static str, ret: i32) -> Self {
        if ret < 0 {
            Self::last(op)
        } else {
            VerbsError::Call { op, errno: ret }
        }
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::NoDevice(why) => write!(f, "no RDMA device ({why})"),
            VerbsError::Call { op, errno } => write!(
                f,
                "{op} failed: {} (errno {errno})",
                std::io::Error::from_raw_os_error(*errno)
            ),
            VerbsError::Timeout { what, after } => {
                write!(f, "timed out after {after:?} waiting for {what}")
            }
            VerbsError::Completion {
                wr_id,
                status,
                text,
            } => write!(
                f,
                "work request {wr_id} completed with status {status} ({text})"
            ),
        }
    }
}

impl std::error::Error for VerbsError {}

/// Shorthand used by every verbs object.
pub type VerbsResult<T> = Result<T, VerbsError>;
