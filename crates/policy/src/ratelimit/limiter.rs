//! The limiter: parameters, the shared state and the decision ([`Limiter::check`]). The
//! key cache is in [`super::shard`], one key's policy in [`super::slot`], the flush
//! protocol in [`super::flush`].

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::hash::{stable_hash, stable_hash_in};
use super::pending::FlushState;
use super::shard::{lock, Shard, MAX_REFS, SHARDS, SHARD_BITS};
use super::slot::{Slot, LOCAL_ONLY_MAX, RESTORED, SHARED, SYNCED, UNKNOWN};
use super::table::{empty_slot, key_id};
use super::window::{self, Sliding};
use super::{Decision, RateLimitParams};

/// `Retry-After` of a request refused only for the fleet share: the next syncs (every
/// `flush_interval_ms`) grant a new share, so the smallest whole number of seconds.
const SHARE_RETRY_SECS: u64 = 1;

/// Parameters plus derived values, swapped atomically on reload.
pub(super) struct Params {
    pub(super) window_ms: u64,
    pub(super) window_secs: u64,
    pub(super) limit: u64,
    pub(super) overrides: HashMap<String, u64>,
    pub(super) cap_per_shard: usize,
    pub(super) generation: u16,
}

impl Params {
    fn new(p: RateLimitParams, generation: u16) -> Self {
        let window_secs = p.window_secs.max(1);
        Self {
            window_ms: window_secs.saturating_mul(1000),
            window_secs,
            limit: p.limit,
            overrides: p.overrides,
            cap_per_shard: p.max_tracked_keys.div_ceil(SHARDS).max(1),
            generation,
        }
    }

    pub(super) fn limit_for(&self, key: &[u8]) -> u64 {
        if self.overrides.is_empty() {
            return self.limit;
        }
        // Overrides come from TOML (UTF-8); a key that is not UTF-8 has none.
        std::str::from_utf8(key)
            .ok()
            .and_then(|k| self.overrides.get(k))
            .copied()
            .unwrap_or(self.limit)
    }
}

/// Sharded sliding-window limiter. Share as `Arc<Limiter>`.
pub struct Limiter {
    pub(super) params: ArcSwap<Params>,
    pub(super) shards: Box<[Mutex<Shard>]>,
    pub(super) hasher: RandomState,
    pub(super) healthy: AtomicBool,
    pub(super) store_errors: AtomicU64,
    /// Store answers that came back a flush interval or more after their batch was sent.
    pub(super) late_answers: AtomicU64,
    /// Keys evicted while holding admissions not yet delivered to the store.
    pub(super) dropped_unsent: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) last_store_call_ms: AtomicU64,
    /// Serializes flushes and holds the batch that failed, retried as-is (same id).
    pub(super) flush_state: futures_util::lock::Mutex<FlushState>,
    /// Random per-limiter high half of batch ids.
    pub(super) instance_id: u64,
    /// Live instances sharing the store, as last reported by it (1 when it reports none).
    /// Kept while the store is unreachable.
    pub(super) instances: AtomicU64,
    /// Divisor of the fleet share applied by [`Limiter::check`]: `instances` while the
    /// store is healthy, 1 (no share) while it is not.
    pub(super) share_n: AtomicU64,
    /// Identifies this limiter in a flush of several: a pending batch holds a clone, so
    /// no other limiter can have this allocation's address while the batch is pending.
    pub(super) token: Arc<()>,
    /// Hash namespace of a named policy's keys (`None`: the `[rate_limit]` policy, whose
    /// store keys are the plain hash of the API key).
    namespace: Option<Box<[u8]>>,
}

impl Limiter {
    /// A limiter with no tracked keys; `store_healthy` starts true.
    pub fn new(params: RateLimitParams) -> Self {
        let shards: Vec<Mutex<Shard>> = (0..SHARDS).map(|_| Mutex::default()).collect();
        Self {
            params: ArcSwap::from_pointee(Params::new(params, 1)),
            shards: shards.into_boxed_slice(),
            hasher: RandomState::new(),
            healthy: AtomicBool::new(true),
            store_errors: AtomicU64::new(0),
            late_answers: AtomicU64::new(0),
            dropped_unsent: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            last_store_call_ms: AtomicU64::new(0),
            flush_state: futures_util::lock::Mutex::new(FlushState::default()),
            instance_id: instance_id(),
            instances: AtomicU64::new(1),
            share_n: AtomicU64::new(1),
            token: Arc::new(()),
            namespace: None,
        }
    }

    /// The limiter of the named policy `name` (`[[rate_limit.policies]]`): its keys are
    /// apart from every other policy's, in memory and in the store (the store sees the hash
    /// of the policy name with the key), so one API key has one count per policy.
    pub fn for_policy(params: RateLimitParams, name: &str) -> Self {
        let mut ns = Vec::with_capacity(name.len() + 8);
        ns.extend_from_slice(b"policy:");
        ns.extend_from_slice(name.as_bytes());
        ns.push(0);
        Self {
            namespace: Some(ns.into_boxed_slice()),
            ..Self::new(params)
        }
    }

    /// The store hash of `key` in this limiter's namespace.
    pub(super) fn key_hash(&self, key: &[u8]) -> u128 {
        match &self.namespace {
            None => stable_hash(key),
            Some(ns) => stable_hash_in(ns, key),
        }
    }

    /// Hot reload: new limits, overrides and caps apply from the next decision; counts are
    /// kept, unless the window length changed: then every key starts afresh.
    pub fn set_params(&self, params: RateLimitParams) {
        let old = self.params.load_full();
        let new = Params::new(params, old.generation.wrapping_add(1));
        let window_changed = new.window_ms != old.window_ms;
        self.params.store(std::sync::Arc::new(new));
        if window_changed {
            for m in self.shards.iter() {
                *lock(m) = Shard::default();
            }
        }
    }

    /// Live instances sharing the counter store, as last reported by it (1 for a store that
    /// is not shared, or before the first successful sync).
    pub fn instances(&self) -> u64 {
        self.instances.load(Ordering::Relaxed)
    }

    /// Window length currently configured, in seconds.
    pub fn window_secs(&self) -> u64 {
        self.params.load().window_secs
    }

    /// The limit that applies to `key` (its override, or the default).
    pub fn limit_for<K: AsRef<[u8]> + ?Sized>(&self, key: &K) -> u64 {
        self.params.load().limit_for(key.as_ref())
    }

    /// The process-local id of `key` (its position in a shard's table derives from it).
    #[inline]
    fn id_of(&self, key: &[u8]) -> u64 {
        key_id(self.hasher.hash_one(key))
    }

    #[inline]
    fn shard_of(&self, id: u64) -> &Mutex<Shard> {
        &self.shards[(id >> (64 - SHARD_BITS)) as usize]
    }

    /// Decides one request for `key` at `now_ms` (Unix ms). In-memory only, never blocks on
    /// I/O; the request is counted only if admitted. Keys are bytes: two keys are the same
    /// key only if they are equal byte for byte.
    pub fn check<K: AsRef<[u8]> + ?Sized>(&self, key: &K, now_ms: u64) -> Decision {
        self.decide_key(key.as_ref(), now_ms, true)
    }

    /// What the fleet admitted of `key` over the sliding window at `now_ms`, as this
    /// instance knows it (the last synced totals with its own admissions since): `None`
    /// while the key has never been synced with the store (no fleet view).
    pub fn fleet_estimate<K: AsRef<[u8]> + ?Sized>(&self, key: &K, now_ms: u64) -> Option<u64> {
        let p = self.params.load();
        let id = self.id_of(key.as_ref());
        let shard = lock(self.shard_of(id));
        let i = shard.find(id)?;
        let s = shard.table.slots().get(i)?;
        if s.flags & SYNCED == 0 {
            return None;
        }
        let wms = p.window_ms;
        let w = now_ms / wms;
        let (prev, cur) = (
            u64::from(s.g_prev).saturating_add(s.own_prev()),
            u64::from(s.g_cur).saturating_add(s.own_cur()),
        );
        Some(super::slot::estimate_at(
            s.win,
            prev,
            cur,
            w,
            wms,
            now_ms % wms,
        ))
    }

    /// As [`Limiter::check`], but an admission is not counted: whether this policy would
    /// admit the request. A request checked against several policies is counted against
    /// each only once every one of them admits it (see the app's `ratelimit::policy`).
    pub fn peek<K: AsRef<[u8]> + ?Sized>(&self, key: &K, now_ms: u64) -> Decision {
        self.decide_key(key.as_ref(), now_ms, false)
    }

    /// Takes back one admission of `key` counted by [`Limiter::check`] at `now_ms` and not
    /// flushed yet (another policy refused the same request in between). Returns whether
    /// there was one to take back (an admission already handed to a flush stays counted).
    pub fn uncount<K: AsRef<[u8]> + ?Sized>(&self, key: &K, now_ms: u64) -> bool {
        let id = self.id_of(key.as_ref());
        let mut shard = lock(self.shard_of(id));
        let Some(i) = shard.find(id) else {
            return false;
        };
        let w = now_ms / self.params.load().window_ms;
        match shard.table.slots_mut().get_mut(i) {
            Some(s) if s.win == w && s.l_cur > 0 => {
                s.l_cur -= 1;
                true
            }
            _ => false,
        }
    }

    fn decide_key(&self, key: &[u8], now_ms: u64, count: bool) -> Decision {
        let p = self.params.load();
        let id = self.id_of(key);
        let mut shard = lock(self.shard_of(id));
        let wms = p.window_ms;
        let w = now_ms / wms;
        let e = now_ms % wms;

        let i = match shard.find(id) {
            Some(i) => {
                let s = &mut shard.table.slots_mut()[i];
                if s.refs < MAX_REFS {
                    s.refs += 1;
                }
                i
            }
            None => self.insert(&mut shard, id, key, &p, w, e),
        };
        let s = &mut shard.table.slots_mut()[i];
        if s.generation != p.generation {
            s.limit = p.limit_for(key);
            s.generation = p.generation;
            s.blocked_until = 0;
        }
        let d = self.decide(s, now_ms, wms, w, e, count);
        // Keys whose counts matter are sent at a coming flush (also when merely refused:
        // that refreshes their global view); the others stay local.
        if s.flags & SHARED != 0 {
            shard.queue(i);
        }
        d
    }

    /// The decision proper on the key's slot (see [`Limiter::check`]).
    #[inline]
    fn decide(
        &self,
        s: &mut Slot,
        now_ms: u64,
        wms: u64,
        mut w: u64,
        mut e: u64,
        count: bool,
    ) -> Decision {
        if w < s.win {
            // A clock slightly behind the one that last touched the key: decide as of the
            // start of the key's window.
            w = s.win;
            e = 0;
        }
        s.roll(w);
        let limit = s.limit;

        if s.blocked_until > now_ms {
            let ms = s.blocked_until - now_ms;
            return limited(limit, window::ceil_secs(ms).max(1));
        }

        let (at, own) = known(s, wms, e);
        let cur = at.cur;
        if at.admits(limit) {
            if self.over_share(s, own, limit, wms, e) {
                // Refused only for the share: retry after the next syncs, not cached.
                s.flags |= SHARED;
                return limited(limit, SHARE_RETRY_SECS);
            }
            if count {
                s.l_cur = s.l_cur.saturating_add(1);
                if own >= LOCAL_ONLY_MAX {
                    s.flags |= SHARED;
                }
            }
            let cur = cur.saturating_add(1);
            Decision::Allowed {
                limit,
                remaining: Sliding { cur, ..at }.remaining(limit),
                reset_secs: window::ceil_secs(Sliding { cur, ..at }.drain_ms()),
            }
        } else {
            s.flags |= SHARED;
            let ms = at.retry_after_ms(limit).max(1);
            s.blocked_until = now_ms.saturating_add(ms);
            limited(limit, window::ceil_secs(ms).max(1))
        }
    }

    /// Whether a key the window admits is still refused: a key that may have been
    /// forgotten (evicted) admits no more than a key kept local before its first sync,
    /// which tells its real counts; and with several instances, this one keeps to its
    /// share of what the fleet had left at the last sync (see the module doc).
    #[inline]
    fn over_share(&self, s: &Slot, own: u64, limit: u64, wms: u64, e: u64) -> bool {
        let unknown = s.flags & (UNKNOWN | SYNCED) == UNKNOWN
            && own >= LOCAL_ONLY_MAX
            && self.healthy.load(Ordering::Relaxed);
        let n = self.share_n.load(Ordering::Relaxed);
        unknown
            || (n > 1
                && !window::within_share(
                    s.known_global(wms, e),
                    s.own(),
                    limit,
                    s.share_divisor(n),
                    || s.share_draw(e),
                ))
    }

    /// Adds a slot for a new key, evicting one under the shard's cap. A key evicted before
    /// comes back with its counts from its ghost; a key without one, in a shard that evicted
    /// recently, may be a forgotten key ([`UNKNOWN`]).
    #[cold]
    fn insert(&self, shard: &mut Shard, id: u64, key: &[u8], p: &Params, w: u64, e: u64) -> usize {
        let key_hash = self.key_hash(key);
        let mut slot = Slot {
            id,
            win: w,
            limit: p.limit_for(key),
            generation: p.generation,
            ..empty_slot()
        };
        let restored = shard.take_ghost(id, w);
        if let Some(g) = restored {
            slot.win = g.win;
            slot.g_prev = g.g[0];
            slot.g_cur = g.g[1];
            slot.l_prev = g.l[0];
            slot.l_cur = g.l[1];
            if g.shared {
                slot.flags = SHARED;
            }
        } else if shard
            .evicted_win
            .is_some_and(|ew| ew.saturating_add(1) >= w)
        {
            slot.flags = UNKNOWN;
        }
        if shard.table.len() >= p.cap_per_shard {
            if let Some(i) = shard.victim(w, p.window_ms, e) {
                self.evict(shard, i, w, e, p);
                if restored.is_none() {
                    // This shard evicts now: the next keys new to it may be forgotten ones.
                    slot.flags |= UNKNOWN;
                }
            }
        }
        // A slot reusing the position of a queued, evicted one stays queued (the position
        // is in the dirty list); the flush drops it if the new key is local-only.
        shard.table.insert(slot, key_hash, &mut shard.dirty)
    }

    /// Evicts the slot at position `i` (buried as a ghost if its counts matter) to make
    /// room for a new key.
    fn evict(&self, shard: &mut Shard, i: usize, w: u64, e: u64, p: &Params) {
        let kept = shard.bury(i, w, p.window_ms, e, p.cap_per_shard);
        shard.evicted_win = Some(w);
        if let Some(old) = shard.table.slots().get(i) {
            // Admissions already in a batch (`p_*`) are still delivered; `l_*` are lost
            // unless the ghost keeps them.
            if (old.l_cur | old.l_prev) != 0 && !old.is_dead(w) && !kept {
                self.dropped_unsent.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.evictions.fetch_add(1, Ordering::Relaxed);
        // A tombstone: nothing moves, the dirty list stays valid.
        shard.table.remove(i);
    }

    /// Keys currently tracked.
    pub fn tracked_keys(&self) -> usize {
        self.shards.iter().map(|s| lock(s).table.len()).sum()
    }

    /// False after a failed store call, true again after a successful one.
    pub fn store_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Failed store calls (timeouts, connection and command errors).
    pub fn store_errors_total(&self) -> u64 {
        self.store_errors.load(Ordering::Relaxed)
    }

    /// Store answers that came back a flush interval or more after their batch was sent.
    /// While answers are that late the fleet share can admit past the limit (by up to
    /// about a quarter of it for a burst on a new key: `limiter_tests`,
    /// `burst_on_a_new_key_with_slow_answers`).
    pub fn late_answers_total(&self) -> u64 {
        self.late_answers.load(Ordering::Relaxed)
    }

    /// Keys evicted (memory cap) so far.
    pub fn evictions_total(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Keys evicted while holding admissions the store had not received yet.
    pub fn dropped_unsent_total(&self) -> u64 {
        self.dropped_unsent.load(Ordering::Relaxed)
    }

    /// Admissions recorded locally but not yet acknowledged by the store.
    pub fn unsent_admissions(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| {
                lock(s)
                    .table
                    .slots()
                    .iter()
                    .filter(|x| x.is_live())
                    .map(|x| {
                        u64::from(x.l_prev)
                            + u64::from(x.l_cur)
                            + u64::from(x.p_prev)
                            + u64::from(x.p_cur)
                    })
                    .sum::<u64>()
            })
            .sum()
    }

    /// (window, prev, cur, global cur) of a key, for tests.
    #[doc(hidden)]
    pub fn slot_counts_for_tests(&self, key: &str) -> (u64, u64, u64, u64) {
        self.slot_counts(key).unwrap_or_default()
    }

    fn slot_counts<K: AsRef<[u8]> + ?Sized>(&self, key: &K) -> Option<(u64, u64, u64, u64)> {
        let id = self.id_of(key.as_ref());
        let sh = lock(self.shard_of(id));
        sh.find(id).map(|i| {
            let s = &sh.table.slots()[i];
            (s.win, s.prev(), s.cur(), u64::from(s.g_cur))
        })
    }
}

fn instance_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    RandomState::new().hash_one((t, std::process::id()))
}

/// What is known of a key now: its sliding window (the last known global counts plus
/// this instance's unsynced admissions) and this instance's own admissions over its
/// current and previous windows.
#[inline]
fn known(s: &Slot, wms: u64, e: u64) -> (Sliding, u64) {
    let mut cur = s.cur();
    if s.flags & RESTORED != 0 {
        // After a loss, until news, the estimate of the other instances' unsynced
        // admissions is part of what is known, also while the share (which otherwise
        // carries it) is suspended by a store outage.
        cur = cur.saturating_add(u64::from(s.est));
    }
    let own = s.own_prev().saturating_add(s.own_cur());
    let at = Sliding {
        prev: s.prev(),
        cur,
        w: wms,
        e,
    };
    (at, own)
}

/// A refusal whose `Retry-After` and reset are both `secs`.
#[inline]
fn limited(limit: u64, secs: u64) -> Decision {
    Decision::Limited {
        limit,
        retry_after_secs: secs,
        reset_secs: secs,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "limiter_tests.rs"]
pub(crate) mod tests;
