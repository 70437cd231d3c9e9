//! The collective start (`fh_init`'s `Rma::new`; here `Rma::with_pins_collective` over the
//! simulator) must not return on a rank before every rank can take Firehose messages.
//!
//! The race: rank 1 has every peer's settings and leaves the settings exchange, while rank 0
//! still polls in its own (a third rank's message is slow). Rank 1's first put sends a Firehose
//! message to rank 0, whose polling delivers it before rank 0 installed its handlers: rejected,
//! lost, and the put waits out `FH_AM_TIMEOUT_MS`. That was the 4-rank start-up timeout of the
//! verbs suite's remote invalidation test. The test switch `set_exchange_linger_for_tests`
//! makes rank 0 keep polling in its exchange for a while, so the window is always open.

#[path = "common/rma_job.rs"]
#[allow(dead_code)]
mod rma_job;
#[path = "common/sim_mem.rs"]
#[allow(dead_code)]
mod sim_mem;

use firehose::net::settings::NetSettings;
use firehose::net::{Link, Peers, RdmaKind};
use firehose::pin::null::NullPinner;
use firehose::rma::agree::set_exchange_linger_for_tests;
use firehose::rma::sim_pins::SimPins;
use firehose::rma::Rma;
use rma_job::{fh_config, sim_net, unbounded_cache};
use sim_mem::Buf;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const SIZE: u32 = 3;
const LEN: usize = 64 * 1024;

#[test]
fn first_put_after_start_reaches_a_rank_still_in_its_exchange() {
    let net = sim_net(SIZE, 7, 0);
    // Rank 0 polls in its exchange for 1.5 s after it has every peer's settings.
    set_exchange_linger_for_tests(0, Duration::from_millis(1500));
    // A lost message shows up as a timeout of the put well before the test's own bound.
    let settings = NetSettings {
        timeout: Some(Duration::from_secs(6)),
        ..NetSettings::default()
    };
    let target = Arc::new(Buf::new(LEN, 0));
    let done = Arc::new(AtomicBool::new(false));
    let built = Arc::new(Barrier::new(SIZE as usize));
    let threads: Vec<_> = (0..SIZE)
        .map(|r| {
            let (net, target, done, built) =
                (net.clone(), target.clone(), done.clone(), built.clone());
            std::thread::spawn(move || {
                let link: Arc<dyn Link> = net.link(r);
                let peers = Arc::new(Peers::from_link(link, settings).unwrap());
                let cache = unbounded_cache(Arc::new(NullPinner));
                let c = fh_config(r, SIZE, 64, 16, 16);
                let pins = Box::new(SimPins::new(net.clone(), r));
                let rma = Rma::with_pins_collective(peers, Some(cache), c, pins)
                    .expect("collective start");
                let mut outcome = Ok(());
                if r == 1 {
                    // At once, as a program's first fh_put after fh_init.
                    let mut src = vec![0x5au8; LEN];
                    let t0 = Instant::now();
                    // SAFETY: `src` lives and is untouched until the wait returns.
                    let h = unsafe {
                        rma.start(
                            RdmaKind::Write,
                            0,
                            target.addr(),
                            src.as_mut_ptr(),
                            LEN,
                            false,
                        )
                    }
                    .unwrap();
                    outcome = rma.wait(h).map_err(|e| (e, t0.elapsed()));
                    done.store(true, SeqCst);
                } else {
                    while !done.load(SeqCst) {
                        rma.progress().unwrap();
                        std::thread::yield_now();
                    }
                }
                let rejected = rma.peers().am().stats().rejected_total();
                built.wait();
                (r, outcome, rejected, rma)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    set_exchange_linger_for_tests(0, Duration::ZERO);
    for (r, outcome, rejected, _) in &results {
        assert_eq!(
            *rejected, 0,
            "rank {r} rejected a message (delivered before its handlers existed)"
        );
        if let Err((e, after)) = outcome {
            panic!("rank {r}: the first put to rank 0 failed after {after:?}: {e:?}");
        }
    }
    // SAFETY: every op is done (rank 1's wait returned), nothing writes the buffer any more.
    let got = unsafe { target.bytes() };
    assert!(got.iter().all(|&b| b == 0x5a), "the put did not land");
}
