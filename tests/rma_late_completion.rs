//! The endpoint's RDMA completion handler holds the Firehose engine itself (not the `Rma`): a
//! completion that arrives after the context was dropped (the endpoint outlives it while another
//! holder keeps the peers) still finds the engine and ends its op there, with nothing left to
//! free twice and no access to the gone context.

#[path = "common/rma_job.rs"]
#[allow(dead_code)]
mod rma_job;
#[path = "common/sim_mem.rs"]
#[allow(dead_code)]
mod sim_mem;

use firehose::net::RdmaKind;
use firehose::pin::null::NullPinner;
use firehose::rma::sim_pins::SimPins;
use firehose::rma::Rma;
use rma_job::{fh_config, peers, sim_net, unbounded_cache, Servers};
use sim_mem::Buf;
use std::sync::Arc;

#[test]
fn a_completion_after_the_context_went_ends_its_op_quietly() {
    let net = sim_net(2, 5, 0);
    let rmas: Vec<Arc<Rma>> = (0..2)
        .map(|r| {
            let pins = Box::new(SimPins::new(net.clone(), r));
            let cache = Some(unbounded_cache(Arc::new(NullPinner)));
            Rma::with_pins(peers(&net, r), cache, fh_config(r, 2, 64, 16, 16), pins).unwrap()
        })
        .collect();
    let target = Buf::new(4096, 0);
    let mut rmas = rmas.into_iter();
    let (a, b) = (rmas.next().unwrap(), rmas.next().unwrap());
    let server = Servers::start([b.clone()]);
    // The first put misses (its move needs rank 1); the second hits and is posted at once.
    let src = [0x11u8; 64];
    let put = |v: &[u8]| {
        // SAFETY: `v` outlives the request (the test polls until its completion ran).
        unsafe {
            a.start(
                RdmaKind::Write,
                1,
                target.addr(),
                v.as_ptr().cast_mut(),
                v.len(),
                false,
            )
        }
        .unwrap()
    };
    a.wait(put(&src)).unwrap();
    let hits = a.stats().fh.hits;
    let late = [0x22u8; 64];
    let _h = put(&late);
    assert_eq!(a.stats().fh.hits, hits + 1, "posted on a hit");
    // Nothing polled rank 0 since: its completion is still to come. The context goes.
    let p = a.peers().clone();
    let ok = p.am().stats().rdma_ok;
    drop(a);
    // Polling the endpoint runs the RDMA (the simulator runs a one-sided op in its initiator's
    // poll) and hands its completion to the handler, which ends the op in the engine it holds.
    for _ in 0..1000 {
        p.am().progress().unwrap();
        if p.am().stats().rdma_ok > ok {
            break;
        }
        std::thread::yield_now();
    }
    assert_eq!(
        p.am().stats().rdma_ok,
        ok + 1,
        "the late completion arrived"
    );
    drop(server);
    // SAFETY: nothing writes the target any more.
    assert_eq!(unsafe { &target.bytes()[..64] }, &late[..]);
    drop(b);
}
