//! A move request at the target: validate everything, then release, pin (or reuse), run the
//! small put, and reply. A move that can be answered always is (what cannot be honoured is
//! refused in the reply); one that cannot is dropped and changes nothing.

use super::Target;
use crate::error::WireError;
use crate::stats::FirehoseStats;
use crate::wire::{self, Grant, Msg, PinReq, RemoteError};
use crate::Rank;
use crate::{Outbox, RegionPins};

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
        // A move that cannot be answered is dropped: one with no request id (nothing waits on
        // it), one out of sequence (a replay or a forgery: the initiator numbers its moves one by
        // one and every move in sequence gets an answer, so an honest one never is), or one with
        // more pins than a reply can carry.
        let wants_reply = !pins.is_empty() || put.is_some();
        if wants_reply != (req != 0) {
            return Err(WireError::Malformed);
        }
        let next_req = self.peers[from as usize].last_req.wrapping_add(1).max(1);
        if wants_reply && req != next_req {
            return Err(WireError::UnknownRequest);
        }
        if pins.len() > wire::pins_per_move(self.max_msg) {
            return Err(WireError::BadPin);
        }
        // Anything else this target cannot honour is answered, never dropped: a dropped move
        // leaves its ops waiting (for ever, before `rma`'s waits were bounded) and, since the
        // next move must carry the next id, poisoned every later move of that initiator here.
        // What is refused: all the pins (a pin that does not fit this target's buckets or
        // regions, or a move over its quota: ranks that disagree on FH_BUCKET_SIZE,
        // FH_MAXREGION or FH_M, which `fh_init` checks), the put (longer than this target
        // takes), or everything (releases of regions the sender does not hold).
        let releases_ok = self.releases_ok(from, releases);
        let freed: u64 = if releases_ok {
            releases
                .iter()
                .map(|h| self.region(self.by_handle[h]).nb as u64)
                .sum()
        } else {
            0
        };
        let buckets_in_space = 1u128 << (64 - self.shift);
        let r = self.r as u64;
        let mut reserve = 0u64;
        let mut pins_ok = releases_ok;
        for p in pins {
            let nb = p.nb as u64;
            pins_ok &= p.nb >= 1
                && nb <= r
                && p.nb.is_power_of_two()
                && p.start % nb == 0
                && p.start % r + nb <= r
                && (p.start as u128 + nb as u128) <= buckets_in_space
                && p.need_n >= 1
                && p.need_off as u64 + p.need_n as u64 <= nb;
            reserve += nb;
        }
        let peer = &self.peers[from as usize];
        pins_ok &= peer.charge - freed + reserve <= peer.quota;
        let put_ok = releases_ok
            && put.map_or(true, |(addr, data)| {
                data.len() <= self.small_put_max && addr.checked_add(data.len() as u64).is_some()
            });
        if !wants_reply && !releases_ok {
            return Err(WireError::NotHeld);
        }
        // --- mutation ---
        if wants_reply {
            self.peers[from as usize].last_req = req;
        }
        if !(releases_ok && (pins_ok || pins.is_empty()) && put_ok) {
            st.moves_refused += 1;
        }
        if releases_ok {
            for h in releases {
                let slot = self.by_handle[h];
                self.drop_holder(slot, from, rp, st);
            }
        }
        let grants: Vec<Result<Grant, RemoteError>> = pins
            .iter()
            .map(|p| match pins_ok {
                true => self.grant(from, p, rp, st),
                false => Err(RemoteError::Refused),
            })
            .collect();
        let put_res = put.map(|(addr, data)| match put_ok {
            true => rp.write(addr, data).map_err(RemoteError::from),
            false => Err(RemoteError::Refused),
        });
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

    /// Whether `from` holds every region `releases` names, each named once.
    fn releases_ok(&self, from: Rank, releases: &[u64]) -> bool {
        releases.iter().enumerate().all(|(i, h)| {
            self.by_handle
                .get(h)
                .is_some_and(|&slot| self.region(slot).holders.contains(&from))
                && !releases[..i].contains(h)
        })
    }

    /// One pin for `from`: an existing region inside the pin's range that covers the needed
    /// buckets with the rights asked for (a victim or another peer's), else a new pin of the
    /// whole range, else of just the needed buckets, with exactly those rights. (A region
    /// pinned with fewer rights stays as it is: its holders release it, or it ages out of the
    /// victim FIFO; the new one is charged and bounded as any other.)
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
                    && g.rights.covers(p.rights)
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
                    match rp.pin(s << self.shift, (n as usize) << self.shift, p.rights) {
                        Ok(rkey) => {
                            got = Some(self.insert(s, n, rkey, p.rights, st));
                            break;
                        }
                        Err(e) => last = e.into(),
                    }
                }
                got.ok_or(last)?
            }
        };
        let reg = self.region(slot);
        let key = rp.key_for(
            from,
            reg.start << self.shift,
            (reg.nb as usize) << self.shift,
            reg.rights,
            reg.rkey,
        );
        let key = match key {
            Ok(k) => k,
            Err(e) => {
                // The region stays pinned; unheld, it goes (back) to the victim FIFO.
                if self.region(slot).holders.is_empty() {
                    self.push_victim(slot, rp, st);
                }
                return Err(e.into());
            }
        };
        let reg = self.region_mut(slot);
        reg.holders.push(from);
        reg.keys.push(key);
        let g = Grant {
            handle: reg.handle,
            start: reg.start,
            nb: reg.nb,
            rkey: key,
            rights: reg.rights,
        };
        self.peers[from as usize].charge += g.nb as u64;
        Ok(g)
    }
}
