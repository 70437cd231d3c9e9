//! RLIMIT_MEMLOCK: raise it at start so the mlock backend can pin the 10^5-region working set,
//! and say what the run actually had.

/// What the run ended up with.
#[derive(Debug, Clone, Copy)]
pub struct MemlockInfo {
    /// Soft limit in bytes (`u64::MAX` = unlimited).
    pub soft: u64,
    pub hard: u64,
    /// CAP_IPC_LOCK lets mlock ignore the limit entirely (root in most containers has it).
    pub cap_ipc_lock: bool,
}

impl MemlockInfo {
    pub fn describe(&self) -> String {
        let f = |v: u64| {
            if v == libc::RLIM_INFINITY {
                "unlimited".to_string()
            } else {
                format!("{} KiB", v / 1024)
            }
        };
        format!(
            "RLIMIT_MEMLOCK soft {} hard {}, CAP_IPC_LOCK {}",
            f(self.soft),
            f(self.hard),
            if self.cap_ipc_lock {
                "yes (limit not enforced)"
            } else {
                "no"
            }
        )
    }
}

/// Try unlimited first (needs CAP_SYS_RESOURCE), else raise the soft limit to the hard one.
pub fn raise() -> MemlockInfo {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit/getrlimit only read/write the rlimit structs we pass by pointer.
    unsafe {
        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) != 0 {
            let mut cur = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut cur) == 0 {
                cur.rlim_cur = cur.rlim_max;
                libc::setrlimit(libc::RLIMIT_MEMLOCK, &cur);
            }
        }
    }
    let mut now = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as above.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut now) };
    MemlockInfo {
        soft: now.rlim_cur,
        hard: now.rlim_max,
        cap_ipc_lock: has_cap_ipc_lock(),
    }
}

/// Bit 14 of CapEff in /proc/self/status.
fn has_cap_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}
