//! `FH_AM_MAX_QUEUED`: how many bytes of messages may wait for credits toward one peer.
//!
//! Why a bound: a message that finds no credit is queued until the peer gives credits back, and
//! a peer gives them back only when it handles our messages. A peer that keeps sending requests
//! (Firehose moves) but never returns a credit makes us queue its answers without end (20 000
//! injected puts-in-move: 19 971 queued replies). Past the bound the peer is declared lost
//! (`Am::give_up`: its queue is dropped, it is counted in `StatsSnapshot::queue_overflows`).
//!
//! The default, 16 MiB, is far above what an honest job queues: a Firehose reply is ~30 bytes,
//! a move at most one message (`FH_AM_MAX_SIZE`), and this rank's own sends to a peer that does
//! not progress are bounded by its firehoses and its callers' puts between two waits. `inf`
//! turns the bound off.

//! Read with the other settings (`NetSettings::max_queued`, from `net/settings.rs`); an endpoint
//! takes it from there and `Am::set_max_queued` changes it.

pub(crate) const DEFAULT: usize = 16 << 20;
