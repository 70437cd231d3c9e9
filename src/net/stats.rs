//! Counters of the active-message layer: relaxed atomics bumped on the hot path (one cache line
//! touched per message), read as a `StatsSnapshot`.

use crate::net::wire::{Kind, Reject};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live counters of one endpoint.
#[derive(Debug, Default)]
pub struct Stats {
    sent_msgs: [AtomicU64; Kind::COUNT],
    sent_bytes: [AtomicU64; Kind::COUNT],
    recv_msgs: [AtomicU64; Kind::COUNT],
    recv_bytes: [AtomicU64; Kind::COUNT],
    rejected: [AtomicU64; Reject::COUNT],
    credit_stalls: AtomicU64,
    excess_credits: AtomicU64,
    progress_wakeups: AtomicU64,
    thread_events: AtomicU64,
    peers_lost: AtomicU64,
    peers_given_up: AtomicU64,
    queue_overflows: AtomicU64,
    probes: AtomicU64,
    rdma_ok: AtomicU64,
    rdma_failed: AtomicU64,
}

/// A copy of the counters. Bytes count whole messages, header included.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Indexed by `Kind::index()`.
    pub sent_msgs: [u64; Kind::COUNT],
    pub sent_bytes: [u64; Kind::COUNT],
    pub recv_msgs: [u64; Kind::COUNT],
    pub recv_bytes: [u64; Kind::COUNT],
    /// Indexed by `Reject::index()`.
    pub rejected: [u64; Reject::COUNT],
    /// Messages that found no credit and were queued.
    pub credit_stalls: u64,
    /// Credit fields that gave back more than was outstanding (clamped; a buggy or hostile peer).
    pub excess_credits: u64,
    /// Times the progress thread woke from `Link::wait`.
    pub progress_wakeups: u64,
    /// Events (messages, completions, losses) the progress thread handled itself.
    pub progress_thread_events: u64,
    pub peers_lost: u64,
    /// Of those, live peers this rank declared lost (`Am::give_up`): silent past a wait's bound,
    /// or over `FH_AM_MAX_QUEUED`.
    pub peers_given_up: u64,
    /// Of those, peers given up on because the messages queued for them (waiting for credits
    /// they did not give back) passed `FH_AM_MAX_QUEUED`.
    pub queue_overflows: u64,
    /// `Link::probe` calls made by waits that lasted longer than the probe interval.
    pub probes: u64,
    /// RDMA completions passed up (`Am::set_rdma_handler`): succeeded, failed.
    pub rdma_ok: u64,
    pub rdma_failed: u64,
}

impl StatsSnapshot {
    pub fn sent(&self, k: Kind) -> u64 {
        self.sent_msgs[k.index()]
    }
    pub fn received(&self, k: Kind) -> u64 {
        self.recv_msgs[k.index()]
    }
    pub fn rejected(&self, r: Reject) -> u64 {
        self.rejected[r.index()]
    }
    pub fn rejected_total(&self) -> u64 {
        self.rejected.iter().sum()
    }
    /// Credit-only messages sent.
    pub fn credit_only_sent(&self) -> u64 {
        self.sent(Kind::CreditOnly)
    }
}

fn load<const N: usize>(a: &[AtomicU64; N]) -> [u64; N] {
    std::array::from_fn(|i| a[i].load(Relaxed))
}

impl Stats {
    pub fn sent(&self, k: Kind, bytes: usize) {
        self.sent_msgs[k.index()].fetch_add(1, Relaxed);
        self.sent_bytes[k.index()].fetch_add(bytes as u64, Relaxed);
    }
    pub fn received(&self, k: Kind, bytes: usize) {
        self.recv_msgs[k.index()].fetch_add(1, Relaxed);
        self.recv_bytes[k.index()].fetch_add(bytes as u64, Relaxed);
    }
    pub fn rejected(&self, r: Reject) {
        self.rejected[r.index()].fetch_add(1, Relaxed);
    }
    pub(crate) fn credit_stall(&self) {
        self.credit_stalls.fetch_add(1, Relaxed);
    }
    pub(crate) fn excess_credits(&self) {
        self.excess_credits.fetch_add(1, Relaxed);
    }
    pub(crate) fn progress_wakeup(&self) {
        self.progress_wakeups.fetch_add(1, Relaxed);
    }
    pub(crate) fn progress_thread_events(&self, n: usize) {
        self.thread_events.fetch_add(n as u64, Relaxed);
    }
    pub(crate) fn peer_lost(&self) {
        self.peers_lost.fetch_add(1, Relaxed);
    }
    pub(crate) fn peer_given_up(&self) {
        self.peers_given_up.fetch_add(1, Relaxed);
    }
    pub(crate) fn queue_overflow(&self) {
        self.queue_overflows.fetch_add(1, Relaxed);
    }
    pub fn probe(&self) {
        self.probes.fetch_add(1, Relaxed);
    }
    pub fn rdma_done(&self, ok: bool) {
        if ok { &self.rdma_ok } else { &self.rdma_failed }.fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            sent_msgs: load(&self.sent_msgs),
            sent_bytes: load(&self.sent_bytes),
            recv_msgs: load(&self.recv_msgs),
            recv_bytes: load(&self.recv_bytes),
            rejected: load(&self.rejected),
            credit_stalls: self.credit_stalls.load(Relaxed),
            excess_credits: self.excess_credits.load(Relaxed),
            progress_wakeups: self.progress_wakeups.load(Relaxed),
            progress_thread_events: self.thread_events.load(Relaxed),
            peers_lost: self.peers_lost.load(Relaxed),
            peers_given_up: self.peers_given_up.load(Relaxed),
            queue_overflows: self.queue_overflows.load(Relaxed),
            probes: self.probes.load(Relaxed),
            rdma_ok: self.rdma_ok.load(Relaxed),
            rdma_failed: self.rdma_failed.load(Relaxed),
        }
    }
}
