//! The flush protocol: which queued keys a flush sends (adaptive sync), the one store
//! round trip per flush, retrying an unacknowledged batch unchanged, and applying the
//! answers ([`super::slot::apply`]) and the store's health to the limiter.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::limiter::Limiter;
use super::pending::{PendingBatch, Taken};
use super::shard::{gc_step, lock};
use super::slot::{apply, Slot, QUEUED, SHARED};
use super::store::{Batch, CounterStore, Delta, GlobalCounts, StoreError};

/// With nothing to flush, probe the store this often (ms) so health (and the fleet size)
/// is kept current.
pub(super) const PROBE_EVERY_MS: u64 = 1_000;
/// Adaptive sync: a key far from its limit (see [`Slot::needs_sync`]) is sent only every
/// `SYNC_EVERY`-th flush (all such keys on the same flush, so the others need no store call
/// at all); keys near their limit are sent at every flush.
pub(super) const SYNC_EVERY: u64 = 8;
/// A previous window's total read at least this long (ms) into the current window (and at
/// least `2 * SYNC_EVERY` flush intervals) is taken as final: late deltas of the other
/// instances for it have arrived. It is then not read again for that window.
pub(super) const PREV_SETTLE_MS: u64 = 2_000;

/// Further counts that ride in the limiters' batches, with no round trip of their own
/// (the tenants' cost quotas): each is a [`Delta`] like a key's window count.
pub trait FlushExtra: Send + Sync {
    /// Appends this flush's deltas to `out` (`all`: also those with nothing new, to read
    /// their totals). Deltas taken are owed an [`FlushExtra::answered`]; a batch that
    /// fails is retried unchanged until it is answered.
    fn take(&self, now_ms: u64, all: bool, out: &mut Vec<Delta>);
    /// The store's totals for `deltas`, in their order.
    fn answered(&self, deltas: &[Delta], counts: &[GlobalCounts]);
}

/// Result of one successful [`Limiter::flush_once`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlushOutcome {
    /// Keys sent in the batch.
    pub keys: usize,
    /// Admissions delivered.
    pub admissions: u64,
    /// Whether the store was called at all.
    pub called_store: bool,
}

/// What one flush takes from the limiters: the deltas and their way back.
#[derive(Default)]
struct Take {
    batch: Vec<Delta>,
    taken: Vec<Taken>,
    limiters: Vec<Arc<()>>,
    admissions: u64,
}

impl Limiter {
    /// One flush of this limiter alone: see [`flush`].
    pub async fn flush_once(
        &self,
        store: &dyn CounterStore,
        now_ms: u64,
    ) -> Result<FlushOutcome, StoreError> {
        flush(&[self], store, &|| now_ms, false).await
    }

    /// As [`Limiter::flush_once`], reading the time from `clock` when it starts and again
    /// when the store answers (a test driving a slow store on its own clock).
    #[cfg(test)]
    pub(crate) async fn flush_once_clocked(
        &self,
        store: &dyn CounterStore,
        clock: &(dyn Fn() -> u64 + Sync),
    ) -> Result<FlushOutcome, StoreError> {
        flush(&[self], store, clock, false).await
    }

    /// As [`Limiter::flush_once`], but sends every queued key (used for the final flush at
    /// shutdown).
    pub async fn flush_all(
        &self,
        store: &dyn CounterStore,
        now_ms: u64,
    ) -> Result<FlushOutcome, StoreError> {
        flush(&[self], store, &|| now_ms, true).await
    }

    /// Moves the unsent admissions of the keys this flush sends into `take` (deferred keys
    /// stay queued), and collects idle keys.
    fn take(&self, now_ms: u64, sync_all: bool, interval: u64, take: &mut Take) {
        let p = self.params.load_full();
        let wms = p.window_ms;
        let w = now_ms / wms;
        // A previous window's total read this late into the current one is final.
        let settle = PREV_SETTLE_MS.max(interval.min(wms).saturating_mul(2 * SYNC_EVERY));
        let share_n = self.share_n.load(Ordering::Relaxed);
        let me = take.limiters.len();
        take.limiters.push(Arc::clone(&self.token));
        for (si, m) in self.shards.iter().enumerate() {
            let mut sh = lock(m);
            let mut dirty = std::mem::take(&mut sh.dirty);
            let sh = &mut *sh;
            dirty.retain(|&i| {
                let key_hash = sh.table.hash_at(i as usize);
                let Some(s) = sh.table.slots_mut().get_mut(i as usize) else {
                    return false;
                };
                if !s.queued() {
                    return false;
                }
                if s.flags & SHARED == 0 {
                    // A local-only key in a reused position, or a tombstone (the position
                    // was queued for the key evicted from it).
                    s.flags &= !QUEUED;
                    return false;
                }
                s.roll(w);
                // Elapsed ms in the slot's window (a slot ahead of this clock: its start).
                let e = if s.win == w { now_ms % wms } else { 0 };
                if !sync_all && !s.needs_sync(share_n, wms, e) {
                    return true;
                }
                s.flags &= !QUEUED;
                s.p_cur = s.p_cur.saturating_add(s.l_cur);
                s.p_prev = s.p_prev.saturating_add(s.l_prev);
                s.l_cur = 0;
                s.l_prev = 0;
                take.admissions += u64::from(s.p_cur) + u64::from(s.p_prev);
                let need_prev = !s.prev_final() || s.p_prev > 0;
                take.batch.push(Delta {
                    key_hash,
                    window_secs: p.window_secs,
                    window: s.win,
                    cur: u64::from(s.p_cur),
                    prev: u64::from(s.p_prev),
                    need_prev,
                    floor_cur: u64::from(s.g_cur),
                    floor_prev: u64::from(s.g_prev),
                });
                // The total read back is final if read late enough into the window.
                take.taken.push(Taken {
                    limiter: me,
                    shard: si as u8,
                    slot: s.id,
                    prev_final: need_prev && s.win == w && e >= settle,
                });
                false
            });
            // Deferred keys stay queued (reusing the allocation).
            sh.dirty = dirty;
            // Collect idle keys, only while the dirty list is empty (a rehash of the table
            // moves slots); it is at least every `SYNC_EVERY` flushes.
            if sh.dirty.is_empty() {
                gc_step(sh, w, wms, now_ms % wms, p.cap_per_shard);
            }
        }
    }

    /// Runs `f` on every taken slot of this limiter still present, locking each shard once
    /// per run of deltas from it.
    fn for_each_taken(
        &self,
        limiters: &[Arc<()>],
        taken: &[Taken],
        mut f: impl FnMut(&mut Slot, usize),
    ) {
        let Some(me) = limiters.iter().position(|t| Arc::ptr_eq(t, &self.token)) else {
            return;
        };
        let mut k = 0;
        while k < taken.len() {
            if taken[k].limiter != me {
                k += 1;
                continue;
            }
            let si = taken[k].shard;
            let mut sh = lock(&self.shards[usize::from(si)]);
            while k < taken.len() && taken[k].limiter == me && taken[k].shard == si {
                if let Some(i) = sh.find(taken[k].slot) {
                    if let Some(s) = sh.table.slots_mut().get_mut(i) {
                        f(s, k);
                    }
                }
                k += 1;
            }
        }
    }
}

/// One flush of the limiters of every rate-limit policy (`set[0]` holds the flush state,
/// the batch ids and the store health for all of them): sends the queued keys' unsent
/// admissions (and keys that were merely checked, to refresh their global view) of every
/// policy to `store` in one batch, then applies the returned global counts. Adaptive sync:
/// keys near their limit (or with large unsent deltas, or refused for their fleet share) are
/// sent at every flush; the others stay queued and are sent every `SYNC_EVERY`-th flush (so
/// never more than `SYNC_EVERY - 1` flushes late), at each of the first `SYNC_EVERY`
/// flushes, at the first flush after a store failure and when `force` (shutdown). A flush
/// with nothing to send does not call the store (except the idle probe). A batch that fails
/// is kept (its admissions keep counting locally) and retried unchanged, with the same batch
/// id, before anything new is sent; the deltas of a policy removed meanwhile are still
/// delivered. Also collects idle keys incrementally. Concurrent calls are serialized.
/// `clock` gives the time in ms: read when the flush starts and when the store answers.
pub async fn flush(
    set: &[&Limiter],
    store: &dyn CounterStore,
    clock: &(dyn Fn() -> u64 + Sync),
    force: bool,
) -> Result<FlushOutcome, StoreError> {
    flush_with(set, None, store, clock, force).await
}

/// As [`flush`], with `extra`'s deltas in the same batch (after the limiters'), taken
/// whenever the limiters' keys are all sent (`all`) and otherwise when they have news.
pub async fn flush_with(
    set: &[&Limiter],
    extra: Option<&dyn FlushExtra>,
    store: &dyn CounterStore,
    clock: &(dyn Fn() -> u64 + Sync),
    force: bool,
) -> Result<FlushOutcome, StoreError> {
    let now_ms = clock();
    let Some(&anchor) = set.first() else {
        return Ok(FlushOutcome::default());
    };
    let mut fs = anchor.flush_state.lock().await;
    let mut out = FlushOutcome::default();
    // Everything is sent during the first `SYNC_EVERY` flushes (warm-up: no fleet view
    // yet) and, after a failure (every view is stale), once the store is back.
    let sync_all = force
        || fs.pending.is_some()
        || !anchor.store_healthy()
        || fs.flushes < SYNC_EVERY
        || fs.flushes % SYNC_EVERY == 0;
    fs.flushes = fs.flushes.wrapping_add(1);
    let interval = now_ms.saturating_sub(fs.last_flush_ms);
    fs.last_flush_ms = now_ms;

    // 0. An unacknowledged batch goes first, unchanged.
    if let Some(pb) = fs.pending.take() {
        anchor.last_store_call_ms.store(now_ms, Ordering::Relaxed);
        out.called_store = true;
        match send(set, extra, store, &pb, now_ms, interval, clock).await {
            Ok(()) => {
                out.keys += pb.batch.len();
                out.admissions += pb.admissions;
            }
            Err(e) => {
                fs.pending = Some(pb);
                return Err(e);
            }
        }
    }

    // 1. Take, from every policy's limiter (deferred keys stay queued).
    let mut take = Take::default();
    for l in set {
        l.take(now_ms, sync_all, interval, &mut take);
    }
    let extra_from = take.batch.len();
    if let Some(x) = extra {
        x.take(now_ms, sync_all, &mut take.batch);
    }

    if take.batch.is_empty() {
        let last = anchor.last_store_call_ms.load(Ordering::Relaxed);
        if out.called_store
            || (anchor.store_healthy() && now_ms.saturating_sub(last) < PROBE_EVERY_MS)
        {
            return Ok(out);
        }
    }
    anchor.last_store_call_ms.store(now_ms, Ordering::Relaxed);

    // 2. One store round trip for every policy.
    fs.seq = fs.seq.wrapping_add(1);
    let pb = PendingBatch {
        id: (u128::from(anchor.instance_id) << 64) | u128::from(fs.seq),
        batch: take.batch,
        taken: take.taken,
        limiters: take.limiters,
        admissions: take.admissions,
        extra_from,
    };
    out.called_store = true;
    match send(set, extra, store, &pb, now_ms, interval, clock).await {
        Ok(()) => {
            out.keys += pb.batch.len();
            out.admissions += pb.admissions;
            Ok(out)
        }
        Err(e) => {
            if !pb.batch.is_empty() {
                fs.pending = Some(pb);
            }
            Err(e)
        }
    }
}

/// Sends one batch; applies the counts on success; keeps health and error counters (the
/// error count on `set[0]`, health and the fleet size on every limiter). An answer that
/// comes back `interval` (the time since the previous flush) or more after `now_ms` is
/// late: the other instances may have synced meanwhile (see [`apply`]).
async fn send(
    set: &[&Limiter],
    extra: Option<&dyn FlushExtra>,
    store: &dyn CounterStore,
    pb: &PendingBatch,
    now_ms: u64,
    interval: u64,
    clock: &(dyn Fn() -> u64 + Sync),
) -> Result<(), StoreError> {
    let Some(&anchor) = set.first() else {
        return Ok(());
    };
    let batch = Batch {
        id: pb.id,
        deltas: &pb.batch,
        now_ms,
    };
    let res = match store.sync(batch).await {
        Ok(c) if c.len() == pb.batch.len() => Ok(c),
        Ok(c) => Err(StoreError::Protocol(format!(
            "{} results for {} keys",
            c.len(),
            pb.batch.len()
        ))),
        Err(e) => Err(e),
    };
    match res {
        Ok(counts) => {
            let late = interval > 0 && clock().saturating_sub(now_ms) >= interval;
            if late {
                anchor.late_answers.fetch_add(1, Ordering::Relaxed);
            }
            let n = store
                .instances()
                .map(|n| n.max(1))
                .unwrap_or_else(|| anchor.instances.load(Ordering::Relaxed));
            let was_healthy = anchor.store_healthy();
            for l in set {
                l.instances.store(n, Ordering::Relaxed);
                l.share_n.store(n, Ordering::Relaxed);
                l.for_each_taken(&pb.limiters, &pb.taken, |s, k| {
                    apply(s, &pb.batch[k], counts[k], n, pb.taken[k].prev_final, late);
                });
                l.healthy.store(true, Ordering::Relaxed);
            }
            if let (Some(x), Some(deltas), Some(totals)) = (
                extra,
                pb.batch.get(pb.extra_from..),
                counts.get(pb.extra_from..),
            ) {
                if !deltas.is_empty() {
                    x.answered(deltas, totals);
                }
            }
            if !was_healthy {
                tracing::info!(target: "portcullis::ratelimit", "rate-limit store healthy again");
            }
            Ok(())
        }
        Err(err) => {
            // Unreachable store: each instance enforces the last known global counts
            // plus its own (no share), until a sync succeeds again.
            let was_healthy = anchor.store_healthy();
            for l in set {
                l.share_n.store(1, Ordering::Relaxed);
                l.healthy.store(false, Ordering::Relaxed);
            }
            if !matches!(err, StoreError::Backoff) {
                anchor.store_errors.fetch_add(1, Ordering::Relaxed);
                if was_healthy {
                    tracing::warn!(target: "portcullis::ratelimit", error = %err, "rate-limit store unhealthy; enforcing last known counts");
                }
            }
            Err(err)
        }
    }
}
