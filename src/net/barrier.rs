//! A barrier over active messages (dissemination: round k sends to `rank + 2^k`, waits for
//! `rank - 2^k`), so that a rank waiting in the barrier keeps answering its peers' requests.
//! A bootstrap barrier (a PMIx fence) would block without progress: a peer still waiting for our
//! reply before it enters the barrier would wait until its timeout.

use super::am::Am;
use super::Rank;
use crate::status::{fh_status, FhResult};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Handler id of the barrier's one-way message (ids >= 0xFF00 belong to the library).
pub const BARRIER_AM: u16 = 0xFF00;
/// Handler id of the liveness ping a waiting rank sends to the peer it waits for: its reply (or
/// `FH_ERR_PEER_LOST`) tells a slow peer from a dead one, so a barrier never hangs on a corpse.
pub const PING_AM: u16 = 0xFF01;

/// Arrivals per (epoch, round), filled by the handler, consumed by `enter`.
#[derive(Default)]
struct Arrivals {
    seen: HashMap<(u32, u8), u32>,
}

/// One rank's barrier state; `register` once on the endpoint, then `enter` collectively.
pub struct AmBarrier {
    arrivals: Arc<Mutex<Arrivals>>,
    /// Barriers entered so far; also serialises `enter` (one barrier at a time per rank).
    epoch: Mutex<u32>,
}

impl AmBarrier {
    /// Registers the barrier's handler on `am`.
    pub fn register(am: &Am) -> AmBarrier {
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

    /// Returns once every rank has entered the same barrier; progresses `am` while waiting. A
    /// peer waited for longer than `probe` is pinged: a dead one fails the barrier with
    /// `FH_ERR_PEER_LOST`; `timeout` bounds the whole wait (`FH_ERR_TIMEOUT`).
    pub fn enter(&self, am: &Am, timeout: Option<Duration>, probe: Duration) -> FhResult<()> {
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
                {
                    let mut g = self.arrivals.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(n) = g.seen.get_mut(&(*epoch, round)) {
                        *n -= 1;
                        if *n == 0 {
                            g.seen.remove(&(*epoch, round));
                        }
                        break;
                    }
                }
                if am.progress()? == 0 {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        return Err(fh_status::FH_ERR_TIMEOUT);
                    }
                    if now >= next_ping {
                        // Progresses while it waits, so arrivals keep being counted.
                        am.call(from, PING_AM, &[])?;
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
