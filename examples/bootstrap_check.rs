//! Bootstrap check under a real launcher: run it with
//! `mpirun --allow-run-as-root --oversubscribe -n 4 target/debug/examples/bootstrap_check`
//! (scripts/bootstrap-mpirun does, with 2 and 4 ranks).
//!
//! `from_env` must pick PMIx and agree with the launcher on rank and size; then 20 rounds of an
//! allgather of rank- and round-dependent blobs (lengths from 0 to 256 KiB), every byte of every
//! rank's part checked, each round followed by a barrier; then an allgather with unequal lengths
//! must fail on every rank, and the bootstrap must still work after it.
//!
//! Test only: `FH_TEST_BOOTSTRAP_CORRUPT=RANK:ROUND` makes that rank flip one byte of its blob in
//! that round, to show that the check fails (exit 1) when data is wrong.

use firehose::internals::net::bootstrap::from_env;
use std::process::exit;

const ROUNDS: u32 = 20;
/// Blob lengths, cycled through by round: empty, tiny, odd, page-ish, and large enough that
/// PMIx may store it compressed.
const LENS: [usize; 7] = [1, 0, 7, 64, 4093, 65536, 262144];

fn byte(rank: u32, round: u32, i: usize) -> u8 {
    (rank as usize * 131 + round as usize * 17 + i * 7 + (i >> 8)) as u8
}

fn fail(rank: impl std::fmt::Display, what: String) -> ! {
    eprintln!("bootstrap-check: rank {rank}: FAIL: {what}");
    exit(1)
}

fn main() {
    let mut b = from_env().unwrap_or_else(|e| fail("?", format!("from_env: {e}")));
    let (rank, size) = (b.rank(), b.size());
    for (var, ours) in [
        ("OMPI_COMM_WORLD_RANK", rank),
        ("OMPI_COMM_WORLD_SIZE", size),
    ] {
        if let Some(theirs) = std::env::var(var).ok().and_then(|v| v.parse::<u32>().ok()) {
            if theirs != ours {
                fail(
                    rank,
                    format!("{var}={theirs} but the bootstrap says {ours}"),
                );
            }
        }
    }
    let corrupt: Option<(u32, u32)> =
        std::env::var("FH_TEST_BOOTSTRAP_CORRUPT")
            .ok()
            .and_then(|v| {
                let (r, n) = v.split_once(':')?;
                Some((r.parse().ok()?, n.parse().ok()?))
            });

    let mut verified = 0usize;
    for round in 0..ROUNDS {
        let len = LENS[round as usize % LENS.len()];
        let mut mine: Vec<u8> = (0..len).map(|i| byte(rank, round, i)).collect();
        if corrupt == Some((rank, round)) && len > 0 {
            mine[len / 2] ^= 0x40;
            eprintln!(
                "bootstrap-check: rank {rank}: corrupting byte {} of round {round} (test)",
                len / 2
            );
        }
        let all = b
            .allgather(&mine)
            .unwrap_or_else(|e| fail(rank, format!("round {round}: {e}")));
        if all.len() != len * size as usize {
            fail(
                rank,
                format!(
                    "round {round}: {} bytes, want {}",
                    all.len(),
                    len * size as usize
                ),
            );
        }
        for (from, part) in
            all.chunks(len.max(1))
                .enumerate()
                .take(if len == 0 { 0 } else { size as usize })
        {
            for (i, &got) in part.iter().enumerate() {
                let want = byte(from as u32, round, i);
                if got != want {
                    fail(
                        rank,
                        format!(
                            "round {round}: rank {from}'s byte {i} is {got:#04x}, want {want:#04x}"
                        ),
                    );
                }
            }
        }
        verified += all.len();
        b.barrier()
            .unwrap_or_else(|e| fail(rank, format!("barrier {round}: {e}")));
    }

    if size > 1 {
        let odd = vec![0u8; if rank == size - 1 { 5 } else { 4 }];
        match b.allgather(&odd) {
            Ok(_) => fail(rank, "an allgather with unequal lengths succeeded".into()),
            Err(e) if e.0.contains("bytes") => {}
            Err(e) => fail(
                rank,
                format!("unequal lengths gave an unexpected error: {e}"),
            ),
        }
    }
    // Still usable after the refused round.
    let after = b
        .allgather(&rank.to_le_bytes())
        .unwrap_or_else(|e| fail(rank, format!("allgather after the unequal round: {e}")));
    let want: Vec<u8> = (0..size).flat_map(u32::to_le_bytes).collect();
    if after != want {
        fail(
            rank,
            format!("allgather after the unequal round: {after:?}, want {want:?}"),
        );
    }
    b.barrier()
        .unwrap_or_else(|e| fail(rank, format!("final barrier: {e}")));
    println!(
        "bootstrap-check: rank {rank} of {size}: {ROUNDS} rounds ok, {verified} bytes verified"
    );
}
