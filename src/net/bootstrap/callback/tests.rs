//! The callback bootstrap against fake hosts written in Rust: a host whose allgather is a
//! `LocalGroup` (N ranks as threads), a host that fails, and a host that counts calls.

use super::*;
use crate::net::bootstrap::local::{LocalBootstrap, LocalGroup};
use std::sync::atomic::{AtomicU32, Ordering};

/// Host allgather over a `LocalBootstrap` (the `ctx`).
unsafe extern "C" fn local_allgather(
    ctx: *mut c_void,
    send: *const c_void,
    len: usize,
    recv: *mut c_void,
) -> c_int {
    // SAFETY: the tests pass a live, exclusively used `LocalBootstrap` as ctx, and buffers of
    // `len` and `size * len` bytes (the callback contract).
    let (b, mine) = unsafe {
        (
            &mut *(ctx as *mut LocalBootstrap),
            std::slice::from_raw_parts(send as *const u8, len),
        )
    };
    match b.allgather(mine) {
        Ok(all) => {
            // SAFETY: recv holds size * len bytes, which is what the group returns.
            unsafe { std::ptr::copy_nonoverlapping(all.as_ptr(), recv as *mut u8, all.len()) };
            0
        }
        Err(_) => -1,
    }
}

unsafe extern "C" fn failing_allgather(
    _: *mut c_void,
    _: *const c_void,
    _: usize,
    _: *mut c_void,
) -> c_int {
    5
}

unsafe extern "C" fn failing_barrier(_: *mut c_void) -> c_int {
    -3
}

static COUNTED: AtomicU32 = AtomicU32::new(0);
/// A job of one: copies send to recv and counts calls and the total length asked for.
unsafe extern "C" fn counting_allgather(
    _: *mut c_void,
    send: *const c_void,
    len: usize,
    recv: *mut c_void,
) -> c_int {
    COUNTED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: size is 1 in these tests, so recv holds len bytes.
    unsafe { std::ptr::copy_nonoverlapping(send as *const u8, recv as *mut u8, len) };
    0
}

fn ops(rank: u32, size: u32, ctx: *mut c_void) -> HostOps {
    HostOps {
        rank,
        size,
        ctx,
        allgather: Some(local_allgather),
        barrier: None,
    }
}

/// Runs `f` on each of `size` ranks, each with a `CallbackBootstrap` over its own group member.
fn on_ranks<T: Send + 'static>(
    size: u32,
    f: impl Fn(&mut CallbackBootstrap) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let threads: Vec<_> = LocalGroup::new(size)
        .into_iter()
        .map(|local| {
            let f = f.clone();
            std::thread::spawn(move || {
                let mut local = Box::new(local);
                let ctx = &mut *local as *mut LocalBootstrap as *mut c_void;
                // SAFETY: `local` outlives `b` (dropped at the end of this closure, after b).
                let mut b =
                    unsafe { CallbackBootstrap::new(ops(local.rank(), size, ctx)) }.unwrap();
                f(&mut b)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn allgathers_in_rank_order_and_barriers() {
    on_ranks(4, |b| {
        for round in 0..20u8 {
            let mine: Vec<u8> = (0..=round).map(|i| i ^ b.rank() as u8).collect();
            let all = b.allgather(&mine).unwrap();
            let want: Vec<u8> = (0..4u8)
                .flat_map(|r| (0..=round).map(move |i| i ^ r))
                .collect();
            assert_eq!(all, want);
            b.barrier().unwrap();
        }
        assert_eq!(b.allgather(&[]).unwrap(), Vec::<u8>::new());
    });
}

#[test]
fn unequal_lengths_fail_on_every_rank_without_hanging() {
    let results = on_ranks(3, |b| {
        let mine = vec![7u8; if b.rank() == 1 { 3 } else { 2 }];
        b.allgather(&mine)
    });
    for r in &results {
        let e = r.as_ref().unwrap_err();
        assert!(e.0.contains("bytes by rank: [2, 3, 2]"), "{e}");
    }
}

#[test]
fn a_failing_host_allgather_is_a_bootstrap_error() {
    let ops = HostOps {
        rank: 0,
        size: 2,
        ctx: std::ptr::null_mut(),
        allgather: Some(failing_allgather),
        barrier: Some(failing_barrier),
    };
    // SAFETY: the fake callbacks touch nothing.
    let mut b = unsafe { CallbackBootstrap::new(ops) }.unwrap();
    let e = b.allgather(b"x").unwrap_err();
    assert!(e.0.contains("allgather callback returned 5"), "{e}");
    let e = b.barrier().unwrap_err();
    assert!(e.0.contains("barrier callback returned -3"), "{e}");
}

#[test]
fn without_a_barrier_callback_a_barrier_is_one_allgather() {
    let ops = HostOps {
        rank: 0,
        size: 1,
        ctx: std::ptr::null_mut(),
        allgather: Some(counting_allgather),
        barrier: None,
    };
    // SAFETY: the counting callback copies len bytes into a recv of len bytes (size 1).
    let mut b = unsafe { CallbackBootstrap::new(ops) }.unwrap();
    let before = COUNTED.load(Ordering::SeqCst);
    b.barrier().unwrap();
    assert_eq!(COUNTED.load(Ordering::SeqCst) - before, 1);
    // And an allgather is two calls: lengths, then data.
    assert_eq!(b.allgather(b"abc").unwrap(), b"abc");
    assert_eq!(COUNTED.load(Ordering::SeqCst) - before, 3);
}

#[test]
fn bad_ops_are_refused_as_bad_config() {
    let good = ops(0, 2, std::ptr::null_mut());
    let cases = [
        (HostOps { size: 0, ..good }, BadOps::ZeroSize),
        (
            HostOps { rank: 2, ..good },
            BadOps::RankOutOfRange { rank: 2, size: 2 },
        ),
        (
            HostOps {
                allgather: None,
                ..good
            },
            BadOps::NoAllgather,
        ),
    ];
    for (ops, want) in cases {
        // SAFETY: refused before any callback could be stored or called.
        let got = unsafe { CallbackBootstrap::new(ops) }.unwrap_err();
        assert_eq!(got, want);
    }
}
