//! Allocation-free reader of /proc/self/maps (used inside the shmdt hook, where we may be inside
//! malloc, and on the userfaultfd miss path). Raw open/read into a stack buffer, one line at a time.

/// One mapping (VMA) as the kernel lists it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Vma {
    pub start: usize,
    pub end: usize,
    /// `rwxp` / `rw-s` as listed.
    pub perms: [u8; 4],
    pub inode: u64,
    /// Mapped from a file (or SysV shm / memfd), i.e. the path column is not empty.
    pub has_path: bool,
    /// Path starts with "/SYSV": a SysV shared memory segment; `inode` is then the shm id.
    pub sysv_shm: bool,
    /// "[heap]" (the brk heap).
    pub heap: bool,
}

const BUF: usize = 8192;

/// Call `f` for each mapping in address order until it returns false. Returns false if the file
/// could not be read. Lines longer than the buffer are skipped.
pub(super) fn for_each_vma(mut f: impl FnMut(&Vma) -> bool) -> bool {
    // SAFETY: plain syscalls on a NUL-terminated literal path and a stack buffer we own.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; BUF];
    let mut filled = 0usize;
    let mut skipping = false;
    let mut ok = true;
    'read: loop {
        // SAFETY: reading into the unfilled tail of our own buffer.
        let n = unsafe { libc::read(fd, buf[filled..].as_mut_ptr().cast(), BUF - filled) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            ok = false;
            break;
        }
        if n == 0 {
            break;
        }
        filled += n as usize;
        let mut pos = 0;
        while let Some(nl) = buf[pos..filled].iter().position(|&b| b == b'\n') {
            let line = &buf[pos..pos + nl];
            pos += nl + 1;
            if skipping {
                skipping = false;
                continue;
            }
            if let Some(v) = parse_line(line) {
                if !f(&v) {
                    break 'read;
                }
            }
        }
        buf.copy_within(pos..filled, 0);
        filled -= pos;
        if filled == BUF {
            // One line longer than the buffer (a very long path): drop it.
            filled = 0;
            skipping = true;
        }
    }
    // SAFETY: closing the fd we opened.
    unsafe { libc::close(fd) };
    ok
}

/// The mapping containing `addr`, if any.
#[cfg(test)]
pub(super) fn find(addr: usize) -> Option<Vma> {
    let mut found = None;
    for_each_vma(|v| {
        if v.start <= addr && addr < v.end {
            found = Some(*v);
        }
        v.end <= addr
    });
    found
}

fn hex(s: &[u8]) -> Option<usize> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    s.iter().try_fold(0usize, |acc, &c| {
        Some(acc * 16 + (c as char).to_digit(16)? as usize)
    })
}

fn dec(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &c| {
        acc.checked_mul(10)?
            .checked_add((c as char).to_digit(10)? as u64)
    })
}

/// `start-end perms offset dev inode [path]`
pub(super) fn parse_line(line: &[u8]) -> Option<Vma> {
    let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let range = fields.next()?;
    let dash = range.iter().position(|&b| b == b'-')?;
    let start = hex(&range[..dash])?;
    let end = hex(&range[dash + 1..])?;
    let perms_f = fields.next()?;
    let mut perms = [b'-'; 4];
    for (d, s) in perms.iter_mut().zip(perms_f) {
        *d = *s;
    }
    let _offset = fields.next()?;
    let _dev = fields.next()?;
    let inode = dec(fields.next()?)?;
    let path = fields.next().unwrap_or(&[]);
    Some(Vma {
        start,
        end,
        perms,
        inode,
        has_path: path.first() == Some(&b'/'),
        sysv_shm: path.starts_with(b"/SYSV"),
        heap: path == b"[heap]",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines() {
        let v = parse_line(b"7f0000000000-7f0000021000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!(
            (v.start, v.end, &v.perms, v.inode, v.has_path),
            (0x7f00_0000_0000, 0x7f00_0002_1000, b"rw-p", 0, false)
        );
        let v = parse_line(
            b"7f1-7f2 rw-s 00000000 00:01 32789                      /SYSV00000000 (deleted)",
        )
        .unwrap();
        assert!(v.sysv_shm && v.has_path);
        assert_eq!(v.inode, 32789);
        let v =
            parse_line(b"55d0-55f0 rw-p 00000000 00:00 0                          [heap]").unwrap();
        assert!(v.heap && !v.has_path);
        assert!(parse_line(b"garbage").is_none());
    }

    #[test]
    fn finds_own_stack_and_a_fresh_mapping() {
        let local = 0u8;
        let v = find(&local as *const u8 as usize).expect("stack is mapped");
        assert!(v.perms[0] == b'r' && v.perms[1] == b'w');
        // SAFETY: anonymous private mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * 4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let v = find(p as usize + 4096).expect("mapped");
        assert!(v.start <= p as usize && v.end >= p as usize + 3 * 4096);
        // SAFETY: our own mapping.
        unsafe { libc::munmap(p, 3 * 4096) };
    }
}
