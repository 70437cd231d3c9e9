//! Building a `VerbsLink`: create the CQs, buffers and one RC QP per peer, swap endpoints in one
//! bootstrap allgather, connect every QP, pre-post every receive slot, and meet at a barrier.
//!
//! Every QP is connected here, at start, rather than on first use: the bootstrap is collective
//! (every rank must call the same allgather) and exists only while the job starts, so there is
//! no later moment at which two ranks could swap endpoints without a link. N-1 QPs per rank (and
//! N-1 sets of receive slots) are fine at the scales we target (tens to a few hundred ranks); a
//! larger job would want SRQ or DC, which is a different link.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use super::comp_channel::CompChannel;
use super::cq::{Cq, POLL_BATCH};
use super::endpoint_blob::RankBlob;
use super::link::VerbsLink;
use super::path::{Endpoint, Path};
use super::peer::Peer;
use super::qp::{Qp, QpCaps, QpTiming, Sge};
use super::reg_buf::RegBuf;
use super::settings::LinkSettings;
use super::wr_id::{self, WrKind, MAX_RANKS};
use crate::net::{Bootstrap, LinkError, Rank};
use crate::pin::verbs::{Pd, VerbsError};
use crate::pin::Access;
use crate::rt::lock::Lock;

/// RC timing of the link's QPs. A dead peer must surface as RETRY_EXC_ERR in about a second:
/// 4.096 us * 2^15 = 134 ms per attempt, 1 + 6 attempts = ~0.94 s. RNR: finite (6 retries of
/// 10.24 ms) on purpose: `rnr_retry = 7` means "forever", which can soft-lock rxe, and with the
/// AM layer's credits a receiver-not-ready is a bug that should surface, not spin.
pub(crate) const LINK_TIMING: QpTiming = QpTiming {
    ack_timeout: 15,
    retry_cnt: 6,
    rnr_retry: 6,
    min_rnr_timer: 20,
    // Set per peer at connection: see `LINK_RD_ATOMIC`.
    rd_atomic: 1,
    dest_rd_atomic: 1,
};

/// RDMA READs a link QP may have outstanding (capped by the device; the initiator side also by
/// the peer's responder depth from its blob). With 1, every `Link::rdma` READ to a peer waits
/// for the previous one: gets of one peer were serialised.
const LINK_RD_ATOMIC: u32 = 16;

/// Inline payload asked for; providers grant less (or refuse, then we ask for none).
const WANT_INLINE: u32 = 256;

/// `Link::max_rdma` never exceeds this (an SGE length is 32 bits; rxe's port maximum is 2 GiB).
const MAX_RDMA_CAP: u32 = 1 << 31;

/// How a `VerbsLink` is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerbsLinkConfig {
    /// HCA port (from 1).
    pub port: u8,
    /// RoCE GID index; `None` lets `Path::discover` choose.
    pub gid_index: Option<u8>,
    pub settings: LinkSettings,
    pub timing: QpTiming,
}

impl Default for VerbsLinkConfig {
    fn default() -> Self {
        VerbsLinkConfig {
            port: 1,
            gid_index: None,
            settings: LinkSettings::default(),
            timing: LINK_TIMING,
        }
    }
}

fn dev(e: VerbsError) -> LinkError {
    LinkError::Device(e.to_string())
}

/// A 24-bit starting PSN that differs between runs and QPs (a stale packet from an earlier QP
/// with the same number should not land in sequence).
fn initial_psn(rank: Rank, peer: Rank) -> u32 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = t ^ (u64::from(rank) << 40) ^ (u64::from(peer) << 20) ^ 0x9E37_79B9_7F4A_7C15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    (x as u32) & 0xff_ffff
}

fn create_qp(
    pd: &Arc<Pd>,
    send_cq: &Arc<Cq>,
    recv_cq: &Arc<Cq>,
    sq_depth: u32,
    recv_slots: u32,
) -> Result<Qp, VerbsError> {
    let mut caps = QpCaps {
        max_send_wr: sq_depth,
        max_recv_wr: recv_slots,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: WANT_INLINE,
        signal_all: false,
    };
    Qp::create_rc(pd, send_cq, recv_cq, caps).or_else(|_| {
        // Some providers refuse an inline size they cannot do rather than rounding it down.
        caps.max_inline_data = 0;
        Qp::create_rc(pd, send_cq, recv_cq, caps)
    })
}

impl VerbsLink {
    /// Build this rank's link: every rank of `bootstrap` must call this collectively (it does one
    /// allgather and one barrier). `pd` is the protection domain (and through it the device
    /// context) the QPs and buffers are made on. Returns once every rank's QPs are connected and
    /// its receive slots posted, so a `send` right after cannot find a peer unready.
    pub fn new(
        pd: &Arc<Pd>,
        bootstrap: &mut dyn Bootstrap,
        cfg: &VerbsLinkConfig,
    ) -> Result<Self, LinkError> {
        let boot = |e: crate::net::BootstrapError| LinkError::Device(e.to_string());
        let (rank, size) = (bootstrap.rank(), bootstrap.size());
        if size == 0 || size >= MAX_RANKS || rank >= size {
            return Err(LinkError::BadRank(rank));
        }
        cfg.settings
            .validate()
            .map_err(|e| LinkError::Device(e.to_string()))?;
        let recv_slots = cfg.settings.recv_depth;
        let max_msg = cfg.settings.max_size;
        // One ring slot per send-queue entry, and as deep as the peer's receive slots: the AM
        // layer never has more messages in flight to one peer than that.
        let sq_depth = recv_slots;
        let signal_every = u64::from((sq_depth / 4).clamp(1, 16));
        let peers_n = size - 1;

        let ctx = pd.context();
        let path = Path::discover(ctx, cfg.port, cfg.gid_index).map_err(dev)?;
        // One RDMA op is one work request: longer transfers are refused, not split (the caller,
        // Firehose, moves regions of at most a few hundred KiB).
        let max_rdma = match ctx.query_port(cfg.port).map_err(dev)?.max_msg_sz {
            0 => MAX_RDMA_CAP,
            m => m.min(MAX_RDMA_CAP),
        } as usize;
        let channel = CompChannel::create(ctx).map_err(dev)?;
        let cqe = |per_peer: u32| (per_peer * peers_n).max(1) as i32;
        let send_cq = Cq::create(ctx, cqe(sq_depth), Some(&channel)).map_err(dev)?;
        let recv_cq = Cq::create(ctx, cqe(recv_slots), Some(&channel)).map_err(dev)?;
        let n = size as usize;
        let recv_buf =
            RegBuf::new(pd, n * recv_slots as usize * max_msg, Access::LOCAL_WRITE).map_err(dev)?;
        let send_buf =
            RegBuf::new(pd, n * sq_depth as usize * max_msg, Access::LOCAL_WRITE).map_err(dev)?;
        let probe_buf = RegBuf::new(
            pd,
            (n + 1) * 8,
            Access::LOCAL_WRITE.union(Access::REMOTE_WRITE),
        )
        .map_err(dev)?;
        // The word our probes are sent from: a recognisable non-zero value, written before any
        // QP exists and never again.
        // SAFETY: word `n` lies inside probe_buf (n + 1 words, page-rounded); no QP exists yet.
        unsafe {
            probe_buf
                .ptr()
                .add(8 * n)
                .cast::<u64>()
                .write(0x5052_4f42_4546_4800 | u64::from(rank))
        };

        let mut qps: Vec<Option<Qp>> = Vec::with_capacity(n);
        let mut mine = Vec::with_capacity(n);
        let mut psns = vec![0; n];
        for peer in 0..size {
            if peer == rank {
                qps.push(None);
                mine.push((0, 0));
                continue;
            }
            let qp = create_qp(pd, &send_cq, &recv_cq, sq_depth, recv_slots).map_err(dev)?;
            psns[peer as usize] = initial_psn(rank, peer);
            mine.push((qp.qpn(), psns[peer as usize]));
            qps.push(Some(qp));
        }
        let max_inline = qps
            .iter()
            .flatten()
            .map(|q| q.caps().max_inline_data as usize)
            .min()
            .unwrap_or(0)
            .min(max_msg);

        let (init_max, resp_max) = ctx.rd_atomic_limits().map_err(dev)?;
        let rd_init = LINK_RD_ATOMIC.min(init_max).clamp(1, 255) as u8;
        let rd_resp = LINK_RD_ATOMIC.min(resp_max).clamp(1, 255) as u8;
        let blob = RankBlob {
            rank,
            size,
            lid: path.lid,
            rd_atomic: u16::from(rd_resp),
            gid: path.gid,
            probe_addr: probe_buf.addr(),
            probe_rkey: probe_buf.rkey(),
            recv_depth: recv_slots,
            max_size: max_msg as u32,
            qps: mine,
        };
        let all = bootstrap.allgather(&blob.encode()).map_err(boot)?;
        let blobs =
            RankBlob::decode_all(&all, size).map_err(|e| LinkError::Device(e.to_string()))?;
        for b in &blobs {
            // Slots must match on both sides: a peer with bigger messages would overflow ours,
            // one with more slots would hand its senders credits we do not have.
            if b.recv_depth != recv_slots || b.max_size as usize != max_msg {
                return Err(LinkError::Device(format!(
                    "rank {} has {} slots of {} bytes, rank {rank} has {recv_slots} of {max_msg}: \
                     FH_AM_RECV_DEPTH / FH_AM_MAX_SIZE must be equal on every rank",
                    b.rank, b.recv_depth, b.max_size
                )));
            }
        }

        let mut peers = Vec::with_capacity(n);
        for (peer, qp) in qps.into_iter().enumerate() {
            let Some(qp) = qp else {
                peers.push(None);
                continue;
            };
            let theirs = &blobs[peer];
            let (qpn, psn) = theirs.qps[rank as usize];
            let remote = Endpoint {
                qpn,
                psn,
                lid: theirs.lid,
                gid: theirs.gid,
            };
            // Remote write: the peer's probes land in our probe words through this QP, and its
            // `Link::rdma` WRITEs and READs reach the regions we register for it (the MR's own
            // flags then decide per region; the QP's flags only allow the kinds at all).
            let access = Access::REMOTE_WRITE.union(Access::REMOTE_READ);
            // Never more READs in flight than the peer said it serves (it would fail the QP).
            let timing = QpTiming {
                rd_atomic: rd_init.min(theirs.rd_atomic.clamp(1, 255) as u8),
                dest_rd_atomic: rd_resp,
                ..cfg.timing
            };
            qp.connect_with(&path, psns[peer], access, &remote, timing)
                .map_err(dev)?;
            for slot in 0..recv_slots {
                let off = (peer * recv_slots as usize + slot as usize) * max_msg;
                let sge = Sge {
                    addr: recv_buf.addr() + off as u64,
                    len: max_msg as u32,
                    lkey: recv_buf.lkey(),
                };
                let id = wr_id::encode(WrKind::Recv, peer as Rank, slot);
                // SAFETY: the slot is registered memory owned by the link, outliving the QP
                // (the link drops QPs first); nothing touches it until its completion.
                unsafe { qp.post_recv(id, sge) }.map_err(dev)?;
            }
            peers.push(Some(Peer::new(
                qp,
                theirs.probe_addr,
                theirs.probe_rkey,
                sq_depth,
            )));
        }
        // Nobody sends before every rank's QPs are at RTR with their slots posted.
        bootstrap.barrier().map_err(boot)?;

        Ok(VerbsLink {
            peers,
            send_cq,
            recv_cq,
            channel,
            recv_buf,
            send_buf,
            probe_buf,
            _pd: Arc::clone(pd),
            rank,
            size,
            max_msg,
            recv_slots,
            sq_depth,
            signal_every,
            max_inline,
            max_rdma,
            send_reap: Lock::new(()),
            rdma_queued: AtomicUsize::new(0),
            signaled_posted: AtomicU64::new(0),
            send_reaped: AtomicU64::new(0),
            polls: AtomicU32::new(0),
            recv_skipped: AtomicBool::new(false),
            rdma_done: Mutex::new(VecDeque::with_capacity(n * sq_depth as usize)),
            recv_stash: Lock::new(Vec::with_capacity(POLL_BATCH)),
            lost_unreported: AtomicU32::new(0),
            len_errors: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        })
    }
}
