//! The fuzz driver: decodes bytes into C API calls (through the Rust `extern "C"` functions, so
//! the whole boundary is exercised: argument checks, panic guard, handle ownership) and checks
//! invariants after every call against a small model.
//!
//! Invariants:
//! - every success is exactly one hit or one miss; a miss returns a key never seen in this run,
//!   a hit returns a key already handed out (mlock keys are unique per pin);
//! - no stale hit: once `fh_notify_unmapped` (or a remap) overlapped any range served under a
//!   key, that key is never returned again;
//! - invalid input returns its documented status and leaves every counter unchanged; so do
//!   double and made-up releases;
//! - `in_use` is 0 exactly when the driver holds nothing, `pinned_bytes <= pinned_peak`, and
//!   with nothing held the limits are respected; after a flush with nothing held nothing is
//!   pinned; the cache finalizes cleanly at the end.

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::OnceLock;

use firehose::ffi::*;
use firehose::status::fh_status;

const ARENAS: usize = 3;
const ARENA_PAGES: usize = 32;
/// Calls per input at most, so one input stays fast.
const MAX_CALLS: usize = 400;

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// Base addresses of the arenas, mapped once per process and never unmapped (remaps replace
/// pages in place with MAP_FIXED).
fn arenas() -> &'static [usize; ARENAS] {
    static A: OnceLock<[usize; ARENAS]> = OnceLock::new();
    A.get_or_init(|| {
        let mut out = [0; ARENAS];
        for slot in &mut out {
            // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    ARENA_PAGES * page(),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED, "mmap of a fuzz arena");
            *slot = p as usize;
        }
        out
    })
}

/// Reads the input; past the end every read is 0 (so short inputs are still valid programs).
struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Bytes<'_> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let v = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        v
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | u16::from(self.u8()) << 8
    }
}

fn stats(c: *mut fh_cache) -> fh_stats {
    let mut s = fh_stats::default();
    // SAFETY: `c` is a live cache of this run; `s` is a valid output.
    assert_eq!(unsafe { fh_get_stats(c, &mut s) }, fh_status::FH_OK);
    s
}

struct Held {
    handle: u64,
}

struct Run {
    c: *mut fh_cache,
    page: usize,
    max_pinned: usize,
    max_regions: usize,
    held: Vec<Held>,
    released: Vec<u64>,
    successes: u64,
    /// Every range served under each key in this run.
    key_ranges: HashMap<u32, Vec<(usize, usize)>>,
    /// Keys whose memory was invalidated: must never be returned again.
    dead_keys: HashSet<u32>,
    calls: usize,
}

impl Run {
    /// A range inside one arena: (start, len), both > 0.
    fn range(&self, b: &mut Bytes) -> (usize, usize) {
        let base = arenas()[b.u8() as usize % ARENAS];
        let size = ARENA_PAGES * self.page;
        let off = (b.u16() as usize * 97) % size;
        let len = 1 + (b.u16() as usize * 131) % (size - off);
        (base + off, len)
    }

    fn register(&mut self, b: &mut Bytes) {
        let (start, len) = self.range(b);
        let mode = b.u8();
        let access = u32::from(mode & 0x0f);
        let before = stats(self.c);
        let mut mr = fh_mr {
            handle: 0,
            addr: std::ptr::null_mut(),
            length: 0,
            lkey: 0,
            rkey: 0,
        };
        let sentinel = mr;
        // One call in eight is deliberately invalid.
        let (addr, len, access, expect) = match (mode >> 4) % 8 {
            0 => match b.u8() % 4 {
                0 => (start, 0, access, Some(fh_status::FH_ERR_ZERO_LENGTH)),
                1 => (0, len, access, Some(fh_status::FH_ERR_NULL)),
                2 => (
                    usize::MAX - 5,
                    len + 10,
                    access,
                    Some(fh_status::FH_ERR_OVERFLOW),
                ),
                _ => (
                    start,
                    len,
                    access | 0x10 << (b.u8() % 20),
                    Some(fh_status::FH_ERR_BAD_ACCESS),
                ),
            },
            _ => (start, len, access, None),
        };
        // SAFETY: `c` is live; `mr` is a valid output; the address is only pinned.
        let st = unsafe { fh_register(self.c, addr as *const c_void, len, access, &mut mr) };
        self.calls += 1;
        let after = stats(self.c);
        if let Some(want) = expect {
            assert_eq!(st, want, "invalid register({addr:#x}, {len}, {access:#x})");
            assert_eq!(before, after, "a refused register changed the counters");
            assert_eq!(mr, sentinel, "a refused register wrote its output");
            return;
        }
        let page_start = start & !(self.page - 1);
        let page_len = (start + len).next_multiple_of(self.page) - page_start;
        if st != fh_status::FH_OK {
            // Only a request that can never fit is refused for valid memory.
            assert_eq!(
                st,
                fh_status::FH_ERR_TOO_LARGE,
                "register({start:#x}, {len})"
            );
            assert!(
                page_len > self.max_pinned,
                "TOO_LARGE for {page_len} <= {}",
                self.max_pinned
            );
            assert_eq!((before.hits, before.misses), (after.hits, after.misses));
            assert_eq!(mr, sentinel, "a refused register wrote its output");
            return;
        }
        assert_eq!(
            (mr.addr as usize, mr.length),
            (start, len),
            "caller's range echoed back"
        );
        self.successes += 1;
        let hit = after.hits == before.hits + 1 && after.misses == before.misses;
        let miss = after.misses == before.misses + 1 && after.hits == before.hits;
        assert!(
            hit ^ miss,
            "a success must count one hit or one miss: {before:?} -> {after:?}"
        );
        assert!(
            !self.dead_keys.contains(&mr.lkey),
            "STALE HIT: key {} was invalidated",
            mr.lkey
        );
        let seen = self.key_ranges.contains_key(&mr.lkey);
        assert_eq!(seen, hit, "hit={hit} but key {} seen={seen}", mr.lkey);
        self.key_ranges
            .entry(mr.lkey)
            .or_default()
            .push((start, start + len));
        self.held.push(Held { handle: mr.handle });
    }

    fn deregister(&mut self, b: &mut Bytes) {
        let pick = b.u16() as usize;
        if !self.held.is_empty() && !b.u8().is_multiple_of(8) {
            let h = self.held.swap_remove(pick % self.held.len());
            // SAFETY: `c` is live.
            let st = unsafe { fh_deregister(self.c, h.handle) };
            self.calls += 1;
            assert_eq!(st, fh_status::FH_OK, "release of a held handle");
            self.released.push(h.handle);
            return;
        }
        // A double release or a made-up handle: refused, nothing changes.
        let handle = match self.released.get(pick % self.released.len().max(1)) {
            Some(&h) if b.u8().is_multiple_of(2) => h,
            _ => u64::from(b.u16()) << 32 | u64::from(b.u16()),
        };
        if self.held.iter().any(|h| h.handle == handle) {
            return;
        }
        let before = stats(self.c);
        // SAFETY: `c` is live.
        let st = unsafe { fh_deregister(self.c, handle) };
        self.calls += 1;
        assert_eq!(
            st,
            fh_status::FH_ERR_UNKNOWN_HANDLE,
            "release of {handle:#x}"
        );
        assert_eq!(
            before,
            stats(self.c),
            "a refused release changed the counters"
        );
    }

    /// Marks every key that served a range overlapping [start, end) as dead.
    fn invalidated(&mut self, start: usize, end: usize) {
        for (key, ranges) in &self.key_ranges {
            if ranges.iter().any(|&(s, e)| s < end && start < e) {
                self.dead_keys.insert(*key);
            }
        }
    }

    fn notify(&mut self, b: &mut Bytes) {
        let (start, len) = self.range(b);
        let st = fh_notify_unmapped(start as *const c_void, len);
        self.calls += 1;
        assert_eq!(st, fh_status::FH_OK);
        self.invalidated(start, start + len);
    }

    /// The memory really changes: fresh pages mapped over part of an arena (after telling the
    /// caches, as a runtime's hook would).
    fn remap(&mut self, b: &mut Bytes) {
        let (start, len) = self.range(b);
        let s = start & !(self.page - 1);
        let e = (start + len).next_multiple_of(self.page);
        assert_eq!(
            fh_notify_unmapped(s as *const c_void, e - s),
            fh_status::FH_OK
        );
        self.invalidated(s, e);
        // SAFETY: [s, e) lies inside one of our own arenas (page-aligned), which nothing else uses;
        // replacing its pages is the point. Pinned holders only ever unpin (munlock) this range.
        let p = unsafe {
            libc::mmap(
                s as *mut c_void,
                e - s,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        assert_eq!(p as usize, s, "MAP_FIXED remap");
        self.calls += 1;
    }

    fn flush(&mut self) {
        let mut n = usize::MAX;
        // SAFETY: `c` is live; `n` is a valid output.
        assert_eq!(unsafe { fh_flush(self.c, &mut n) }, fh_status::FH_OK);
        self.calls += 1;
        assert_ne!(n, usize::MAX, "fh_flush wrote its count");
        if self.held.is_empty() {
            let s = stats(self.c);
            assert_eq!(
                (s.regions, s.pinned_bytes),
                (0, 0),
                "flush with nothing held"
            );
        }
    }

    fn set_limits(&mut self, b: &mut Bytes) {
        self.max_pinned = self.page * (1 + b.u8() as usize % 64);
        self.max_regions = b.u8() as usize % 16;
        // SAFETY: `c` is live.
        let st = unsafe { fh_set_limits(self.c, self.max_pinned, self.max_regions) };
        self.calls += 1;
        assert_eq!(st, fh_status::FH_OK);
    }

    fn check(&self) {
        let s = stats(self.c);
        assert_eq!(
            s.hits + s.misses,
            self.successes,
            "hits + misses == successful registers"
        );
        assert!(s.pinned_bytes <= s.pinned_peak, "{s:?}");
        assert_eq!(
            s.pinned_bytes % self.page as u64,
            0,
            "pinned bytes are whole pages"
        );
        assert!(
            s.in_use <= self.held.len() as u64,
            "{s:?} with {} held",
            self.held.len()
        );
        assert_eq!(
            s.in_use == 0,
            self.held.is_empty(),
            "{s:?} with {} held",
            self.held.len()
        );
        assert!(s.regions >= s.in_use, "{s:?}");
        if self.held.is_empty() {
            assert!(s.regions <= self.max_regions as u64, "region bound: {s:?}");
            assert!(
                s.pinned_bytes <= self.max_pinned as u64,
                "byte bound: {s:?}"
            );
        }
    }
}

/// Runs one input. Returns how many C calls it made.
pub fn run(data: &[u8]) -> usize {
    let page = page();
    let mut b = Bytes { data, pos: 0 };
    let mut cfg = std::mem::MaybeUninit::<fh_config>::uninit();
    // SAFETY: a valid output for one fh_config.
    assert_eq!(
        unsafe { fh_config_init(cfg.as_mut_ptr()) },
        fh_status::FH_OK
    );
    // SAFETY: initialised by the successful call above.
    let mut cfg = unsafe { cfg.assume_init() };
    cfg.backend = FH_BACKEND_MLOCK;
    cfg.monitor = 0; // invalidation comes from fh_notify_unmapped only: deterministic
    cfg.max_pinned = page * (1 + b.u8() as usize % 64);
    cfg.max_regions = b.u8() as usize % 16;
    let mut c = std::ptr::null_mut();
    // SAFETY: `cfg` and `c` are valid.
    assert_eq!(unsafe { fh_cache_new(&cfg, &mut c) }, fh_status::FH_OK);
    let mut run = Run {
        c,
        page,
        max_pinned: cfg.max_pinned,
        max_regions: cfg.max_regions,
        held: Vec::new(),
        released: Vec::new(),
        successes: 0,
        key_ranges: HashMap::new(),
        dead_keys: HashSet::new(),
        calls: 0,
    };
    while !b.done() && run.calls < MAX_CALLS {
        match b.u8() % 10 {
            0..=3 => run.register(&mut b),
            4 | 5 => run.deregister(&mut b),
            6 => run.notify(&mut b),
            7 => run.remap(&mut b),
            8 => run.flush(),
            _ => run.set_limits(&mut b),
        }
        run.check();
    }
    for h in std::mem::take(&mut run.held) {
        // SAFETY: `c` is live.
        assert_eq!(unsafe { fh_deregister(c, h.handle) }, fh_status::FH_OK);
    }
    run.check();
    // SAFETY: `c` is live and not used after this call.
    assert_eq!(unsafe { fh_cache_finalize(c) }, fh_status::FH_OK);
    run.calls
}

/// `n` pseudo-random inputs (the seeded RNG) through [`run`]; returns the number of calls.
pub fn smoke(n: u64, seed: u64) -> usize {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut calls = 0;
    for _ in 0..n {
        let mut data = vec![0u8; rng.usize(..1024)];
        rng.fill(&mut data);
        calls += run(&data);
    }
    calls
}
