//! The flush protocol: which queued keys a flush sends (adaptive sync), the one store
//! round trip per flush, retrying an unacknowledged batch unchanged, and applying the
//! answers ([`super::slot::apply`]) and the store's health to the limiter.

use std::sync::atomic::Ordering;

use super::limiter::Limiter;
use super::shard::{gc_step, lock};
use super::slot::{apply, Slot, QUEUED, SHARED};
use super::store::{CounterStore, Delta, StoreError};

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

/// A batch the store did not acknowledge. Its admissions stay in the slots' `p_*` counters
/// (so they keep counting) and are retried with the same id until acknowledged.
pub(super) struct PendingBatch {
    pub(super) id: u128,
    pub(super) window_secs: u64,
    pub(super) batch: Vec<Delta>,
    /// (shard, slot id, whether the previous window's total read back is final).
    pub(super) taken: Vec<(u8, u64, bool)>,
    pub(super) admissions: u64,
}

#[derive(Default)]
pub(super) struct FlushState {
    pub(super) seq: u64,
    pub(super) pending: Option<PendingBatch>,
    /// Flushes so far (every [`SYNC_EVERY`]-th sends every queued key).
    pub(super) flushes: u64,
    /// `now_ms` of the last flush.
    pub(super) last_flush_ms: u64,
}

impl Limiter {
    /// One flush: sends queued keys' unsent admissions (and keys that were merely checked,
    /// to refresh their global view) to `store` in one batch, then applies the returned
    /// global counts. Adaptive sync: keys near their limit (or with large unsent deltas, or
    /// refused for their fleet share) are sent at every flush; the others stay queued and
    /// are sent every `SYNC_EVERY`-th flush (so never more than `SYNC_EVERY - 1` flushes
    /// late), at each of the first `SYNC_EVERY` flushes, and at the first flush after a
    /// store failure. A flush with nothing to send
    /// does not call the store (except the idle probe). A batch that fails is kept (its
    /// admissions keep counting locally) and retried unchanged, with the same batch id,
    /// before anything new is sent. Also collects idle keys incrementally. Concurrent calls
    /// are serialized.
    pub async fn flush_once(
        &self,
        store: &dyn CounterStore,
        now_ms: u64,
    ) -> Result<FlushOutcome, StoreError> {
        self.flush(store, now_ms, false).await
    }

    /// As [`Limiter::flush_once`], but sends every queued key (used for the final flush at
    /// shutdown).
    pub async fn flush_all(
        &self,
        store: &dyn CounterStore,
        now_ms: u64,
    ) -> Result<FlushOutcome, StoreError> {
        self.flush(store, now_ms, true).await
    }

    async fn flush(
        &self,
        store: &dyn CounterStore,
        now_ms: u64,
        force: bool,
    ) -> Result<FlushOutcome, StoreError> {
        let mut fs = self.flush_state.lock().await;
        let p = self.params.load_full();
        let wms = p.window_ms;
        let w = now_ms / wms;
        let mut out = FlushOutcome::default();
        // Everything is sent during the first `SYNC_EVERY` flushes (warm-up: no fleet view
        // yet) and, after a failure (every view is stale), once the store is back.
        let sync_all = force
            || fs.pending.is_some()
            || !self.store_healthy()
            || fs.flushes < SYNC_EVERY
            || fs.flushes % SYNC_EVERY == 0;
        fs.flushes = fs.flushes.wrapping_add(1);
        // A previous window's total read this late into the current one is final.
        let interval = now_ms.saturating_sub(fs.last_flush_ms).min(wms);
        fs.last_flush_ms = now_ms;
        let settle = PREV_SETTLE_MS.max(interval.saturating_mul(2 * SYNC_EVERY));
        let share_n = self.share_n.load(Ordering::Relaxed);

        // 0. An unacknowledged batch goes first, unchanged.
        if let Some(pb) = fs.pending.take() {
            self.last_store_call_ms.store(now_ms, Ordering::Relaxed);
            out.called_store = true;
            match self.send(store, &pb, now_ms).await {
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

        // 1. Take (deferred keys stay queued).
        let mut taken: Vec<(u8, u64, bool)> = Vec::new();
        let mut batch: Vec<Delta> = Vec::new();
        let mut admissions = 0u64;
        for (si, m) in self.shards.iter().enumerate() {
            let mut sh = lock(m);
            let mut dirty = std::mem::take(&mut sh.dirty);
            let sh = &mut *sh;
            dirty.retain(|&i| {
                let key_hash = sh.hashes.get(i as usize).copied().unwrap_or_default();
                let Some(s) = sh.slots.get_mut(i as usize) else {
                    return false;
                };
                if !s.queued() {
                    return false;
                }
                if s.flags & SHARED == 0 {
                    // A local-only key in a reused slot (its index was queued for the key
                    // evicted from it).
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
                admissions += u64::from(s.p_cur) + u64::from(s.p_prev);
                let need_prev = !s.prev_final() || s.p_prev > 0;
                batch.push(Delta {
                    key_hash,
                    window: s.win,
                    cur: u64::from(s.p_cur),
                    prev: u64::from(s.p_prev),
                    need_prev,
                    floor_cur: u64::from(s.g_cur),
                    floor_prev: u64::from(s.g_prev),
                });
                // The total read back is final if read late enough into the window.
                taken.push((si as u8, s.id, need_prev && s.win == w && e >= settle));
                false
            });
            // Deferred keys stay queued (reusing the allocation).
            sh.dirty = dirty;
            // 2. Collect idle keys, only while the dirty list is empty (indexes may move);
            // it is at least every `SYNC_EVERY` flushes.
            if sh.dirty.is_empty() {
                gc_step(sh, w, wms, now_ms % wms, p.cap_per_shard);
            }
        }

        if batch.is_empty() {
            let last = self.last_store_call_ms.load(Ordering::Relaxed);
            if out.called_store
                || (self.store_healthy() && now_ms.saturating_sub(last) < PROBE_EVERY_MS)
            {
                return Ok(out);
            }
        }
        self.last_store_call_ms.store(now_ms, Ordering::Relaxed);

        // 3. One store round trip.
        fs.seq = fs.seq.wrapping_add(1);
        let pb = PendingBatch {
            id: (u128::from(self.instance_id) << 64) | u128::from(fs.seq),
            window_secs: p.window_secs,
            batch,
            taken,
            admissions,
        };
        out.called_store = true;
        match self.send(store, &pb, now_ms).await {
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

    /// Sends one batch; applies the counts on success; keeps health and error counters.
    async fn send(
        &self,
        store: &dyn CounterStore,
        pb: &PendingBatch,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let res = match store.sync(pb.id, &pb.batch, pb.window_secs, now_ms).await {
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
                if let Some(n) = store.instances() {
                    self.instances.store(n.max(1), Ordering::Relaxed);
                }
                let n = self.instances.load(Ordering::Relaxed);
                self.share_n.store(n, Ordering::Relaxed);
                self.for_each_taken(&pb.taken, |s, k| {
                    apply(s, &pb.batch[k], counts[k], n, pb.taken[k].2);
                });
                if !self.healthy.swap(true, Ordering::Relaxed) {
                    tracing::info!(target: "portcullis::ratelimit", "rate-limit store healthy again");
                }
                Ok(())
            }
            Err(err) => {
                // Unreachable store: each instance enforces the last known global counts
                // plus its own (no share), until a sync succeeds again.
                self.share_n.store(1, Ordering::Relaxed);
                if matches!(err, StoreError::Backoff) {
                    self.healthy.store(false, Ordering::Relaxed);
                } else {
                    self.store_errors.fetch_add(1, Ordering::Relaxed);
                    if self.healthy.swap(false, Ordering::Relaxed) {
                        tracing::warn!(target: "portcullis::ratelimit", error = %err, "rate-limit store unhealthy; enforcing last known counts");
                    }
                }
                Err(err)
            }
        }
    }

    /// Runs `f` on every taken slot still present, locking each shard once per run.
    fn for_each_taken(&self, taken: &[(u8, u64, bool)], mut f: impl FnMut(&mut Slot, usize)) {
        let mut k = 0;
        while k < taken.len() {
            let si = taken[k].0;
            let mut sh = lock(&self.shards[usize::from(si)]);
            while k < taken.len() && taken[k].0 == si {
                if let Some(&i) = sh.index.get(&taken[k].1) {
                    if let Some(s) = sh.slots.get_mut(i as usize) {
                        f(s, k);
                    }
                }
                k += 1;
            }
        }
    }
}
