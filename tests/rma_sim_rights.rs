//! Rights per operation through the whole driver (`rma::Rma`) on the simulated link:
//! a get from a peer's read-only memory and a put from a read-only local buffer work at every
//! size (inline, riding in a move, RDMA: one chunk and many). The simulator checks what verbs
//! would: the target's pins (`SimPins`) refuse a write right on memory the process cannot
//! write, as `ibv_reg_mr` does (EFAULT), and the local registrations go through a pinner that
//! does the same (`VerbsLike`), so an op that asks for more rights than it needs fails here.

use firehose::net::RdmaKind;
use firehose::pin::{Access, PinError, Pinned, Pinner};
use firehose::rma::sim_pins::{writable, SimPins};
use firehose::rma::Rma;
use firehose_proto::{PinFailure, RegionPins, Rights};
use std::sync::{Arc, Mutex};

#[path = "common/rma_job.rs"]
#[allow(dead_code)]
mod rma_job;
use rma_job::{fh_config, peers, sim_net, unbounded_cache, Servers};

/// A local pinner with verbs' rule: a write right (local or remote) needs writable memory.
struct VerbsLike;

impl Pinner for VerbsLike {
    fn pin(&self, addr: usize, len: usize, access: Access) -> Result<Pinned, PinError> {
        let write = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
        if access.0 & write.0 != 0 && !writable(addr as u64, len) {
            return Err(PinError::Failed(libc::EFAULT));
        }
        Ok(Pinned {
            token: addr,
            lkey: 1,
            rkey: 1,
        })
    }
    fn unpin(&self, _: Pinned, _: usize, _: usize) {}
    fn name(&self) -> &'static str {
        "verbs-like"
    }
}

/// The rights of every pin the target made.
type PinLog = Arc<Mutex<Vec<(u64, usize, Rights)>>>;

struct Logged {
    inner: SimPins,
    log: PinLog,
}

impl RegionPins for Logged {
    fn pin(&mut self, addr: u64, len: usize, rights: Rights) -> Result<u32, PinFailure> {
        let k = self.inner.pin(addr, len, rights)?;
        self.log.lock().unwrap().push((addr, len, rights));
        Ok(k)
    }
    fn unpin(&mut self, addr: u64, len: usize, rkey: u32) {
        self.inner.unpin(addr, len, rkey)
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), PinFailure> {
        self.inner.write(addr, data)
    }
}

struct Job {
    _server: Servers,
    rmas: Vec<Arc<Rma>>,
    logs: Vec<PinLog>,
}

/// Two ranks; puts up to 256 bytes inline, up to `small_put_max` in a move.
fn job() -> Job {
    let size = 2;
    let net = sim_net(size, 7, 256);
    let mut logs = Vec::new();
    let rmas = (0..size)
        .map(|r| {
            let cache = unbounded_cache(Arc::new(VerbsLike));
            let c = fh_config(r, size, 64, 16, 8);
            let log = PinLog::default();
            logs.push(log.clone());
            let pins = Logged {
                inner: SimPins::new(net.clone(), r),
                log,
            };
            Rma::with_pins(peers(&net, r), Some(cache), c, Box::new(pins)).unwrap()
        })
        .collect::<Vec<_>>();
    // Rank 1 only serves (rank 0 progresses in its waits).
    Job {
        _server: Servers::start([rmas[1].clone()]),
        rmas,
        logs,
    }
}

/// A private anonymous mapping of `len` bytes filled with `f(i)`, then made read-only
/// (`writable`: left read-write). Unmapped on drop.
struct Map {
    p: *mut u8,
    len: usize,
}

impl Map {
    fn new(len: usize, f: impl Fn(usize) -> u8, writable: bool) -> Map {
        // SAFETY: a fresh private mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let p = p.cast::<u8>();
        for i in 0..len {
            // SAFETY: inside the mapping.
            unsafe { *p.add(i) = f(i) };
        }
        if !writable {
            // SAFETY: our mapping.
            assert_eq!(unsafe { libc::mprotect(p.cast(), len, libc::PROT_READ) }, 0);
        }
        Map { p, len }
    }
    fn addr(&self) -> u64 {
        self.p as u64
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: mapped while `self` lives; no RDMA runs when tests read it.
        unsafe { std::slice::from_raw_parts(self.p, self.len) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: our mapping.
        unsafe { libc::munmap(self.p.cast(), self.len) };
    }
}

fn pattern(seed: usize) -> impl Fn(usize) -> u8 {
    move |i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8
}

/// Blocking op of rank 0 on rank 1.
fn run(rma: &Rma, kind: RdmaKind, raddr: u64, local: *mut u8, len: usize) {
    // SAFETY: the callers' buffers outlive the wait.
    let h = unsafe { rma.start(kind, 1, raddr, local, len, false) }.unwrap();
    rma.wait(h)
        .unwrap_or_else(|e| panic!("{kind:?} of {len} bytes: {e:?}"));
}

const SIZES: [usize; 5] = [8, 1000, 64 << 10, 256 << 10, 4 << 20];

#[test]
fn get_from_a_read_only_mapping_of_the_peer() {
    let j = job();
    let src = Map::new(4 << 20, pattern(3), false);
    for len in SIZES {
        let mut dst = vec![0u8; len];
        let off = 4096 * 3 + 5;
        let len = len.min(src.len - off);
        run(
            &j.rmas[0],
            RdmaKind::Read,
            src.addr() + off as u64,
            dst.as_mut_ptr(),
            len,
        );
        assert_eq!(&dst[..len], &src.bytes()[off..off + len], "get of {len}");
    }
    // Every pin the target made for these gets is read-only.
    let log = j.logs[1].lock().unwrap();
    assert!(!log.is_empty());
    let other: Vec<_> = log.iter().filter(|p| p.2 != Rights::READ).collect();
    assert!(
        other.is_empty(),
        "a get pins read-only: {:?}",
        other.first()
    );
    drop(log);
    j.rmas[0].check_idle().unwrap();
}

#[test]
fn get_from_a_read_only_file_mapping_of_the_peer() {
    let j = job();
    let path = std::env::temp_dir().join(format!("fh-rights-{}", std::process::id()));
    let data: Vec<u8> = (0..1 << 20).map(pattern(9)).collect();
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: a read-only shared mapping of a file we own.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            data.len(),
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    std::fs::remove_file(&path).unwrap();
    for len in [100, 64 << 10, 1 << 20] {
        let mut dst = vec![0u8; len];
        run(&j.rmas[0], RdmaKind::Read, p as u64, dst.as_mut_ptr(), len);
        assert_eq!(dst, data[..len]);
    }
    // SAFETY: our mapping.
    unsafe { libc::munmap(p, data.len()) };
}

#[test]
fn put_from_a_read_only_buffer() {
    let j = job();
    let dst = Map::new(8 << 20, |_| 0, true);
    let mut off = 0usize;
    for (i, len) in SIZES.into_iter().enumerate() {
        let src = Map::new(len, pattern(i), false);
        run(
            &j.rmas[0],
            RdmaKind::Write,
            dst.addr() + off as u64,
            src.p,
            len,
        );
        assert_eq!(&dst.bytes()[off..off + len], src.bytes(), "put of {len}");
        off += len + 4096;
    }
    j.rmas[0].check_idle().unwrap();
    // Puts pin for writing only.
    let log = j.logs[1].lock().unwrap();
    let other: Vec<_> = log.iter().filter(|p| p.2 != Rights::WRITE).collect();
    assert!(
        other.is_empty(),
        "{} pins of {} not write-only: {:?}",
        other.len(),
        log.len(),
        other.first()
    );
}

/// A put to a peer's read-only memory is refused at every size (the target cannot pin it for
/// writing, nor write a small put there), and the bytes stay.
#[test]
fn put_to_read_only_memory_of_the_peer_fails() {
    let j = job();
    let dst = Map::new(1 << 20, pattern(5), false);
    for len in [8, 1000, 64 << 10] {
        let mut src = vec![0xeeu8; len];
        // SAFETY: `src` outlives the wait.
        let h = unsafe {
            j.rmas[0].start(RdmaKind::Write, 1, dst.addr(), src.as_mut_ptr(), len, false)
        }
        .unwrap();
        assert_eq!(
            j.rmas[0].wait(h),
            Err(firehose::rma::RmaError::RemoteFault),
            "{len}"
        );
    }
    let want: Vec<u8> = (0..1 << 20).map(pattern(5)).collect();
    assert_eq!(dst.bytes(), &want[..]);
}
