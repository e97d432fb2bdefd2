//! What the flush protocol keeps between flushes: the batch the store has not
//! acknowledged yet (retried unchanged) and the flush counters. The limiter holds it
//! (`Limiter::flush_state`); the protocol itself is in `super::flush`.

use std::sync::Arc;

use super::store::Delta;

/// A delta's way back to its slot: the limiter (policy) it came from, its shard and slot
/// id, and whether the previous window's total read back is final.
#[derive(Debug, Clone, Copy)]
pub(super) struct Taken {
    /// Index of the limiter's token in the batch's `limiters`.
    pub(super) limiter: usize,
    pub(super) shard: u8,
    pub(super) slot: u64,
    pub(super) prev_final: bool,
}

/// A batch the store did not acknowledge. Its admissions stay in the slots' `p_*` counters
/// (so they keep counting) and are retried with the same id until acknowledged.
pub(super) struct PendingBatch {
    pub(super) id: u128,
    pub(super) batch: Vec<Delta>,
    pub(super) taken: Vec<Taken>,
    /// The tokens of the limiters the deltas came from (see [`Taken::limiter`]).
    pub(super) limiters: Vec<Arc<()>>,
    pub(super) admissions: u64,
    /// `batch[extra_from..]` are the [`super::FlushExtra`]'s deltas (`taken` covers the
    /// limiters' only).
    pub(super) extra_from: usize,
}

#[derive(Default)]
pub(super) struct FlushState {
    pub(super) seq: u64,
    pub(super) pending: Option<PendingBatch>,
    /// Flushes so far (every `SYNC_EVERY`-th sends every queued key).
    pub(super) flushes: u64,
    /// `now_ms` of the last flush.
    pub(super) last_flush_ms: u64,
}
