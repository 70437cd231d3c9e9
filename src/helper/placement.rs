//! Where the helper runs, or whether it runs at all: the paper's conservative policy (section 5)
//! gives a process a helper thread only when an idle core is there for it, because a helper that
//! shares a core with computation delays the computation, and a helper that is descheduled
//! misses its deadlines (which costs the callers synchronous pins).
//!
//! * `Cpu(n)` (`FH_HELPER_CPU=n`): run, bound to core `n`, if `n` is in this process's affinity
//!   mask; else stay off.
//! * `Auto`: run (unbound) if the cores in the affinity mask outnumber the tasks that are
//!   runnable now: this process's runnable threads, or the system's (`/proc/loadavg`) scaled to
//!   the share of online cores the mask allows, whichever is more. Decided once, at start.
//! * `Anywhere`: run unbound whatever the load (tests, and benchmarks on shared machines).
//!
//! What it does not do: the paper's coordination *between* processes (keep the helpers of the
//! tasks that pin the most). Every process decides for itself from the same snapshot of the load.

/// How the helper is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Auto,
    Cpu(usize),
    Anywhere,
}

/// `Ok(Some(cpu))`: run bound to `cpu`; `Ok(None)`: run unbound; `Err(reason)`: stay off.
pub fn decide(p: Placement) -> Result<Option<usize>, String> {
    match p {
        Placement::Anywhere => Ok(None),
        Placement::Cpu(n) => {
            let allowed = allowed_cpus();
            if allowed.contains(&n) {
                Ok(Some(n))
            } else {
                Err(format!(
                    "FH_HELPER_CPU={n} is not in this process's affinity mask {allowed:?}"
                ))
            }
        }
        Placement::Auto => {
            let allowed = allowed_cpus().len();
            let busy = busy_tasks(allowed);
            if allowed > busy {
                Ok(None)
            } else {
                Err(format!(
                    "no idle core: {allowed} allowed, {busy} runnable (set FH_HELPER_CPU to force)"
                ))
            }
        }
    }
}

/// Cores in this process's affinity mask.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return vec![0];
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE; CPU_ISSET only reads the set.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Runnable tasks competing for the `allowed` cores.
fn busy_tasks(allowed: usize) -> usize {
    let own = own_runnable_threads();
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    let system = system_runnable()
        .map(|r| (r * allowed).div_ceil(online))
        .unwrap_or(0);
    own.max(system)
}

/// Threads of this process in state R (the caller among them).
fn own_runnable_threads() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 1;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|s| {
            // The state follows the command name, which is in parentheses and may contain any
            // character: look after the last ')'.
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|st| st == "R")
        })
        .count()
        .max(1)
}

/// Runnable tasks in the whole system: the numerator of the 4th field of /proc/loadavg
/// ("running/total"), which counts this reader too.
fn system_runnable() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().nth(3)?.split('/').next()?.parse().ok()
}

/// Bind the calling thread to `cpu`. Errors are returned as errno.
pub fn bind_current_thread(cpu: usize) -> Result<(), i32> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set; CPU_SET writes within it (cpu was
    // checked against the mask, so it is below CPU_SETSIZE).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_cpu_must_be_allowed() {
        let allowed = allowed_cpus();
        assert!(!allowed.is_empty());
        assert_eq!(decide(Placement::Cpu(allowed[0])), Ok(Some(allowed[0])));
        let e = decide(Placement::Cpu(100_000)).unwrap_err();
        assert!(e.contains("FH_HELPER_CPU=100000"), "{e}");
        assert_eq!(decide(Placement::Anywhere), Ok(None));
    }

    #[test]
    fn auto_says_why_it_stays_off() {
        // Whatever the machine's load, the answer is consistent with its inputs.
        match decide(Placement::Auto) {
            Ok(None) => {}
            Ok(Some(_)) => panic!("auto never binds"),
            Err(e) => assert!(e.contains("no idle core"), "{e}"),
        }
        assert!(own_runnable_threads() >= 1);
        assert!(system_runnable().unwrap() >= 1);
    }

    #[test]
    fn binding_to_an_allowed_cpu_works() {
        let cpu = allowed_cpus()[0];
        std::thread::spawn(move || {
            bind_current_thread(cpu).unwrap();
            // SAFETY: sched_getcpu has no preconditions.
            assert_eq!(unsafe { libc::sched_getcpu() }, cpu as i32);
        })
        .join()
        .unwrap();
    }
}
