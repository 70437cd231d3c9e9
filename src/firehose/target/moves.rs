//! A move request at the target: validate everything, then release, pin (or reuse), run the
//! small put, and reply. Nothing changes when validation fails.

use super::Target;
use crate::firehose::error::WireError;
use crate::firehose::stats::FirehoseStats;
use crate::firehose::wire::{self, Grant, Msg, PinReq, RemoteError};
use crate::firehose::{Outbox, RegionPins};
use crate::net::Rank;

impl Target {
    #[allow(clippy::too_many_arguments)]
    pub fn handle_move(
        &mut self,
        from: Rank,
        req: u32,
        releases: &[u64],
        pins: &[PinReq],
        put: Option<(u64, &[u8])>,
        rp: &mut dyn RegionPins,
        out: &mut Outbox,
        st: &mut FirehoseStats,
    ) -> Result<(), WireError> {
        // --- validation: no state touched above the line ---
        let wants_reply = !pins.is_empty() || put.is_some();
        if wants_reply != (req != 0) {
            return Err(WireError::Malformed);
        }
        let next_req = self.peers[from as usize].last_req.wrapping_add(1).max(1);
        if wants_reply && req != next_req {
            return Err(WireError::UnknownRequest);
        }
        let mut freed = 0u64;
        for (i, h) in releases.iter().enumerate() {
            let slot = *self.by_handle.get(h).ok_or(WireError::NotHeld)?;
            if !self.region(slot).holders.contains(&from) || releases[..i].contains(h) {
                return Err(WireError::NotHeld);
            }
            freed += self.region(slot).nb as u64;
        }
        if pins.len() > wire::pins_per_move(self.max_msg) {
            return Err(WireError::BadPin);
        }
        let buckets_in_space = 1u128 << (64 - self.shift);
        let r = self.r as u64;
        let mut reserve = 0u64;
        for p in pins {
            let nb = p.nb as u64;
            let ok = p.nb >= 1
                && nb <= r
                && p.nb.is_power_of_two()
                && p.start % nb == 0
                && p.start % r + nb <= r
                && (p.start as u128 + nb as u128) <= buckets_in_space
                && p.need_n >= 1
                && p.need_off as u64 + p.need_n as u64 <= nb;
            if !ok {
                return Err(WireError::BadPin);
            }
            reserve += nb;
        }
        if let Some((addr, data)) = put {
            if data.len() > self.small_put_max || addr.checked_add(data.len() as u64).is_none() {
                return Err(WireError::BadPut);
            }
        }
        let peer = &self.peers[from as usize];
        if peer.charge - freed + reserve > peer.quota {
            return Err(WireError::OverQuota);
        }
        // --- mutation ---
        if wants_reply {
            self.peers[from as usize].last_req = req;
        }
        for h in releases {
            let slot = self.by_handle[h];
            self.drop_holder(slot, from, rp, st);
        }
        let grants: Vec<Result<Grant, RemoteError>> =
            pins.iter().map(|p| self.grant(from, p, rp, st)).collect();
        let put_res = put.map(|(addr, data)| rp.write(addr, data).map_err(RemoteError::from));
        if wants_reply {
            let m = Msg::Reply {
                req,
                grants,
                put: put_res,
            };
            out.push_back((from, wire::encode(&m)));
        }
        if self.adaptive {
            self.rebalance(out, st);
        }
        Ok(())
    }

    /// One pin for `from`: an existing region inside the pin's range that covers the needed
    /// buckets (a victim or another peer's), else a new pin of the whole range, else of just
    /// the needed buckets.
    fn grant(
        &mut self,
        from: Rank,
        p: &PinReq,
        rp: &mut dyn RegionPins,
        st: &mut FirehoseStats,
    ) -> Result<Grant, RemoteError> {
        let need_lo = p.start + p.need_off as u64;
        let need_hi = need_lo + p.need_n as u64;
        let end = p.start + p.nb as u64;
        let best = self
            .by_start
            .range((p.start, 0)..(end, 0))
            .map(|&(_, slot)| slot)
            .filter(|&slot| {
                let g = self.region(slot);
                let g_end = g.start + g.nb as u64;
                g_end <= end
                    && g.start <= need_lo
                    && g_end >= need_hi
                    && g.revoking.is_empty()
                    && !g.holders.contains(&from)
            })
            .max_by_key(|&slot| self.region(slot).nb);
        let slot = match best {
            Some(slot) => {
                if self.region(slot).holders.is_empty() {
                    self.take_victim(slot);
                    st.victim_hits += 1;
                } else {
                    st.shared_hits += 1;
                }
                slot
            }
            None => {
                let mut last = RemoteError::NoMemory;
                let mut got = None;
                let tries = [(p.start, p.nb), (need_lo, p.need_n)];
                for &(s, n) in tries.iter().take(if p.need_n == p.nb { 1 } else { 2 }) {
                    if !self.trim_victims(n as u64, rp, st) {
                        continue;
                    }
                    match rp.pin(s << self.shift, (n as usize) << self.shift) {
                        Ok(rkey) => {
                            got = Some(self.insert(s, n, rkey, st));
                            break;
                        }
                        Err(e) => last = e.into(),
                    }
                }
                got.ok_or(last)?
            }
        };
        let reg = self.region_mut(slot);
        reg.holders.push(from);
        let g = Grant {
            handle: reg.handle,
            start: reg.start,
            nb: reg.nb,
            rkey: reg.rkey,
        };
        self.peers[from as usize].charge += g.nb as u64;
        Ok(g)
    }
}
