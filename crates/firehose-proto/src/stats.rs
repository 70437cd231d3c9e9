//! Plain counters of one rank's Firehose state machine (initiator and target side together).

/// A snapshot returned by `Firehose::stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FirehoseStats {
    /// Initiator: acquires fully covered by held firehoses (one-sided).
    pub hits: u64,
    /// Initiator: acquires that needed at least one move (or joined one).
    pub misses: u64,
    /// Initiator: misses that joined a move already in flight for the same buckets.
    pub hit_pending: u64,
    /// Initiator: move requests sent (messages carrying pins, releases or a put).
    pub moves_sent: u64,
    /// Initiator: small puts that rode inside a move.
    pub puts_in_move: u64,
    /// Initiator: of those, moves that carried no pins because the peer's evicted firehoses
    /// had gone unused (pinning did not pay: `FH_SMALL_PUT_PINS=auto`).
    pub puts_in_move_unpinned: u64,
    /// Initiator: ops that ended in `Event::Failed`.
    pub failures: u64,
    /// Initiator: firehoses given up because their target revoked them.
    pub revoked: u64,
    /// Target: regions pinned (`RegionPins::pin` successes) and unpinned.
    pub pins: u64,
    pub unpins: u64,
    /// Target: pins answered from an unreferenced pinned region (victim FIFO).
    pub victim_hits: u64,
    /// Target: pins answered from a region another peer already holds.
    pub shared_hits: u64,
    /// Target: moves answered with a refusal (`RemoteError::Refused`: pins, put, or both).
    pub moves_refused: u64,
    /// Initiator (adaptive): QUOTA_SETs refused (a raise not asked for, a cut out of bounds).
    pub bad_quota_sets: u64,
    /// Target: REVOKE messages sent.
    pub revokes: u64,
    /// Target (adaptive): quota grants and cuts sent.
    pub quota_grants: u64,
    pub quota_cuts: u64,
    /// Target: bytes pinned now and at most so far.
    pub pinned_bytes: u64,
    pub pinned_peak: u64,
}
