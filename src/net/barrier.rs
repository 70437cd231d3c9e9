//! A barrier over active messages (dissemination: round k sends to `rank + 2^k`, waits for
//! `rank - 2^k`), so that a rank waiting in the barrier keeps answering its peers' requests.
//! A bootstrap barrier (a PMIx fence) would block without progress: a peer still waiting for our
//! reply before it enters the barrier would wait until its timeout.

use super::am::Am;
use super::Rank;
use crate::net::NetError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Handler id of the barrier's one-way message (ids >= 0xFF00 belong to the library).
pub(crate) const BARRIER_AM: u16 = 0xFF00;
/// Handler id of the liveness ping a waiting rank sends to the peer it waits for: its reply (or
/// `NetError::PeerLost`) tells a slow peer from a dead one, so a barrier never hangs on a corpse.
pub(crate) const PING_AM: u16 = 0xFF01;

/// Arrivals per (epoch, round), filled by the handler, consumed by `enter`.
#[derive(Default)]
struct Arrivals {
    seen: HashMap<(u32, u8), u32>,
}

/// One rank's barrier state; `register` once on the endpoint, then `enter` collectively.
pub(crate) struct AmBarrier {
    arrivals: Arc<Mutex<Arrivals>>,
    /// Barriers entered so far; also serialises `enter` (one barrier at a time per rank).
    epoch: Mutex<u32>,
}

impl AmBarrier {
    /// Registers the barrier's handler on `am`.
    pub(crate) fn register(am: &Am) -> AmBarrier {
        let arrivals = Arc::new(Mutex::new(Arrivals::default()));
        let a = arrivals.clone();
        am.register_oneway(BARRIER_AM, move |_peer: Rank, payload: &[u8]| {
            // A malformed barrier message is ignored: it can only make a barrier wait (and time
            // out), never pass early, because a round needs a message tagged with its epoch.
            if payload.len() != 5 {
                return;
            }
            let epoch = u32::from_le_bytes(payload[..4].try_into().unwrap());
            let round = payload[4];
            let mut g = a.lock().unwrap_or_else(|e| e.into_inner());
            *g.seen.entry((epoch, round)).or_insert(0) += 1;
        });
        am.register_request(PING_AM, |_peer: Rank, _payload: &[u8], replier| {
            let _ = replier.reply(&[]);
        });
        AmBarrier {
            arrivals,
            epoch: Mutex::new(0),
        }
    }

    /// Consumes one arrival of (epoch, round) if there is one.
    fn take_arrival(&self, epoch: u32, round: u8) -> bool {
        let mut g = self.arrivals.lock().unwrap_or_else(|e| e.into_inner());
        let Some(n) = g.seen.get_mut(&(epoch, round)) else {
            return false;
        };
        *n -= 1;
        if *n == 0 {
            g.seen.remove(&(epoch, round));
        }
        true
    }

    /// Returns once every rank has entered the same barrier; progresses `am` while waiting. A
    /// peer waited for longer than `probe` is pinged: a dead one fails the barrier with
    /// `NetError::PeerLost`; `timeout` bounds the whole wait (`NetError::Timeout`).
    pub(crate) fn enter(
        &self,
        am: &Am,
        timeout: Option<Duration>,
        probe: Duration,
    ) -> Result<(), NetError> {
        let mut epoch = self.epoch.lock().unwrap_or_else(|e| e.into_inner());
        let (rank, size) = (am.rank(), am.size());
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut dist = 1u32;
        let mut round = 0u8;
        while dist < size {
            let to = (rank + dist) % size;
            let mut msg = [0u8; 5];
            msg[..4].copy_from_slice(&epoch.to_le_bytes());
            msg[4] = round;
            am.send_oneway(to, BARRIER_AM, &msg)?;
            let from = (rank + size - dist) % size;
            let mut next_ping = Instant::now() + probe;
            loop {
                if self.take_arrival(*epoch, round) {
                    break;
                }
                if am.progress()? == 0 {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        return Err(NetError::Timeout);
                    }
                    if now >= next_ping {
                        // Progresses while it waits, so arrivals keep being counted.
                        if let Err(e) = am.call(from, PING_AM, &[]) {
                            // A peer that passed the barrier and finalized while we pinged it
                            // fails the ping (its bye), but its barrier message came before the
                            // bye (in order per pair) and is counted by now: not a loss.
                            if self.take_arrival(*epoch, round) {
                                break;
                            }
                            return Err(e);
                        }
                        next_ping = Instant::now() + probe;
                    }
                    std::hint::spin_loop();
                }
            }
            dist *= 2;
            round += 1;
        }
        *epoch = epoch.wrapping_add(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::settings::NetSettings;
    use crate::net::sim::{Delivery, SimConfig, SimNet};
    use std::sync::Arc;

    /// Rank 0 waits for rank 1, pings it, and rank 1 then sends its barrier message and
    /// finalizes without answering the ping: the ping fails (bye), yet the barrier passed. (Seen
    /// in the VM under load as a spurious FH_ERR_PEER_LOST at the end of 61-am-mpi; without the
    /// re-check after a failed ping this test gets that error.)
    #[test]
    fn a_peer_that_passed_and_left_while_pinged_is_not_lost() {
        let net = SimNet::new(SimConfig::new(2, 1, Delivery::Auto));
        let a = Arc::new(Am::new(net.link(0), NetSettings::default()).unwrap());
        let b = Am::new(net.link(1), NetSettings::default()).unwrap();
        let ba = AmBarrier::register(&a);
        let _bb = AmBarrier::register(&b);
        let a2 = a.clone();
        let waiter = std::thread::spawn(move || {
            ba.enter(&a2, Some(Duration::from_secs(20)), Duration::from_millis(1))
        });
        // Until rank 0's ping is out (its request reached rank 1's link).
        let t0 = Instant::now();
        while a.stats().sent(crate::net::wire::Kind::Request) == 0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "no ping");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Epoch 0, round 0 (2 ranks: one round), then bye; the ping stays unanswered.
        b.send_oneway(0, BARRIER_AM, &[0, 0, 0, 0, 0]).unwrap();
        b.finalize().unwrap();
        assert_eq!(waiter.join().unwrap(), Ok(()));
        assert_eq!(a.outstanding(), 0);
    }
}
