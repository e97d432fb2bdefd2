//! The in-memory, sharded limiter.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use arc_swap::ArcSwap;

use super::hash::stable_hash;
use super::store::{CounterStore, Delta, GlobalCounts, StoreError};
use super::window;
use super::{Decision, RateLimitParams};

/// Number of shards (a power of two; the top bits of the key's hash select the shard).
pub const SHARDS: usize = 64;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();
/// Saturation of the per-key reference counter of the CLOCK eviction.
const MAX_REFS: u8 = 3;
/// Slots examined per shard per flush by the idle-key collector.
const GC_STEP: usize = 512;
/// With nothing to flush, probe the store this often (ms) so health (and the fleet size)
/// is kept current.
const PROBE_EVERY_MS: u64 = 1_000;
/// Adaptive sync: a key far from its limit (see [`Slot::needs_sync`]) is sent only every
/// `SYNC_EVERY`-th flush (all such keys on the same flush, so the others need no store call
/// at all); keys near their limit are sent at every flush.
const SYNC_EVERY: u64 = 8;
/// "Near the limit": the key's estimate (last known global counts, the estimate of the other
/// instances' unsynced admissions and its own unsynced admissions) is at least this
/// percentage of the limit.
const NEAR_LIMIT_PERCENT: u128 = 50;
/// A key whose own unsynced admissions reach this percentage of what the fleet had left at
/// the last sync is sent at the next flush, near its limit or not.
const BIG_DELTA_PERCENT: u128 = 10;
/// A previous window's total read at least this long (ms) into the current window (and at
/// least `2 * SYNC_EVERY` flush intervals) is taken as final: late deltas of the other
/// instances for it have arrived. It is then not read again for that window.
const PREV_SETTLE_MS: u64 = 2_000;
/// `Slot::flags`: in the shard's dirty list.
const QUEUED: u8 = 1;
/// `Slot::flags`: `g_prev` is the final total of the previous window.
const PREV_FINAL: u8 = 2;
/// `Slot::flags`: the key's counts matter to the fleet: it is queued for the store when
/// checked. Set once this instance admitted more than [`LOCAL_ONLY_MAX`] requests of it in
/// the current and previous windows, or refused it, or synced it; never cleared.
const SHARED: u8 = 4;
/// `Slot::flags`: synced with the store at least once (a global view exists).
const SYNCED: u8 = 8;
/// `Slot::flags`: created, without a ghost, in a shard that evicted keys in this or the
/// previous window: it may be a key this instance forgot. Until its first sync it admits at
/// most [`LOCAL_ONLY_MAX`] requests, then is refused for one sync (`Retry-After: 1`).
const UNKNOWN: u8 = 16;
/// `Slot::flags`: the store lost this key's counts and restored them from a floor (this
/// instance's or another's). Such an answer tells what some instance knew, not what the
/// fleet did since: until a sync brings news (a total above what this instance knew plus
/// what it sent, i.e. another instance wrote), the estimate of the other instances'
/// unsynced admissions (`est`) and a cached refusal are kept, not reset, and `est` counts
/// in the decision even while the fleet share is suspended.
const RESTORED: u8 = 32;
/// Keys stay local until their counts can matter: a key this instance admitted at most
/// this many times over its current and previous windows (and never refused) is never sent
/// to the store, so a flood of keys each seen once creates no store key at all. Bound on the
/// overshoot this adds: each instance may admit up to `LOCAL_ONLY_MAX` requests of a key
/// that the fleet does not see, i.e. at most `N x LOCAL_ONLY_MAX` (N instances) per sliding
/// window per key above the limit (1 per instance; the fleet share already caps what an
/// instance admits of a key before syncing it).
pub const LOCAL_ONLY_MAX: u64 = 1;
/// `Retry-After` of a request refused only for the fleet share: the next syncs (every
/// `flush_interval_ms`) grant a new share, so the smallest whole number of seconds.
const SHARE_RETRY_SECS: u64 = 1;

/// Identity hasher for keys that already are uniformly distributed 64-bit hashes.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Not used for u64 keys; fold anything else in deterministically.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type IdMap = HashMap<u64, u32, BuildHasherDefault<IdHasher>>;

/// Parameters plus derived values, swapped atomically on reload.
struct Params {
    window_ms: u64,
    window_secs: u64,
    limit: u64,
    overrides: HashMap<String, u64>,
    cap_per_shard: usize,
    generation: u16,
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

    fn limit_for(&self, key: &[u8]) -> u64 {
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

/// One tracked key: exactly one cache line. (Its stable hash for the store lives in the
/// shard's parallel `hashes` vector, read only when flushing.)
#[derive(Debug, Clone)]
#[repr(align(64))]
struct Slot {
    /// Process-local hash (map key).
    id: u64,
    /// Window index of the `*_cur` counters.
    win: u64,
    /// Last known global totals (include our own flushed admissions).
    g_prev: u32,
    g_cur: u32,
    /// Admissions not yet sent.
    l_prev: u32,
    l_cur: u32,
    /// Admissions sent by the flush in progress, not yet acknowledged.
    p_prev: u32,
    p_cur: u32,
    /// Estimate of the other instances' admissions not yet in `g_cur` (counted in the
    /// current window), set by each sync; used only while the fleet share applies.
    est: u32,
    /// Cached refusal: the key stays refused until this instant (ms), unless new counts
    /// arrive. 0 = no cached refusal.
    blocked_until: u64,
    limit: u64,
    /// Parameter generation (wrapping) the slot's limit was computed for. A slot untouched
    /// for exactly a multiple of 65,536 reloads would keep a stale limit: harmless.
    generation: u16,
    /// CLOCK reference counter: 0 for a key seen once.
    refs: u8,
    /// [`QUEUED`]: in the shard's dirty list (to be sent at a coming flush);
    /// [`PREV_FINAL`]: `g_prev` is final (no need to read it from the store again).
    flags: u8,
}

impl Slot {
    #[inline]
    fn queued(&self) -> bool {
        self.flags & QUEUED != 0
    }

    #[inline]
    fn prev_final(&self) -> bool {
        self.flags & PREV_FINAL != 0
    }

    /// Whether this dirty key must be sent at this flush (rather than at the next
    /// every-`SYNC_EVERY` flush): its estimate is near the limit, or its own unsynced
    /// admissions are large relative to what the fleet had left, or the fleet share refuses
    /// it (a fresh view grants a new share). `n` = divisor of the share, `e` = elapsed ms.
    ///
    /// Deferring a far key is safe for accuracy: its admissions between syncs stay bounded
    /// by the same checks as always (the known counts and its share of what the fleet had
    /// left, both from its last sync), and it is sent as soon as it gets near its limit or
    /// its unsynced admissions get large, so the other instances miss at most a small,
    /// bounded part of it, and only while the key is far from its limit.
    fn needs_sync(&self, n: u64, wms: u64, e: u64) -> bool {
        if self.flags & (UNKNOWN | SYNCED) == UNKNOWN {
            return true; // possibly a forgotten key: learn its counts at once
        }
        let w = u128::from(wms);
        let a = w - u128::from(e.min(wms));
        let cap = u128::from(self.limit) * w;
        let global =
            u128::from(self.g_prev) * a + (u128::from(self.g_cur) + u128::from(self.est)) * w;
        let own = u128::from(self.own_prev()) * a + u128::from(self.own_cur()) * w;
        if (global + own) * 100 >= cap * NEAR_LIMIT_PERCENT || global >= cap {
            return true;
        }
        if own * 100 >= (cap - global) * BIG_DELTA_PERCENT {
            return true;
        }
        n > 1
            && !window::within_share(
                (
                    u64::from(self.g_prev),
                    u64::from(self.g_cur).saturating_add(u64::from(self.est)),
                ),
                (self.own_prev(), self.own_cur()),
                self.limit,
                n,
                wms,
                e,
            )
    }

    #[inline]
    fn roll(&mut self, w: u64) {
        if w <= self.win {
            return;
        }
        self.flags &= !PREV_FINAL;
        if w == self.win + 1 {
            self.g_prev = self.g_cur;
            self.l_prev = self.l_cur;
            self.p_prev = self.p_cur;
            // `est` stays (counted as current: conservative until the next sync).
        } else {
            self.g_prev = 0;
            self.l_prev = 0;
            self.p_prev = 0;
            self.est = 0;
            self.flags &= !RESTORED;
        }
        self.g_cur = 0;
        self.l_cur = 0;
        self.p_cur = 0;
        self.win = w;
    }

    #[inline]
    fn prev(&self) -> u64 {
        u64::from(self.g_prev)
            .saturating_add(u64::from(self.p_prev))
            .saturating_add(u64::from(self.l_prev))
    }

    #[inline]
    fn cur(&self) -> u64 {
        u64::from(self.g_cur)
            .saturating_add(u64::from(self.p_cur))
            .saturating_add(u64::from(self.l_cur))
    }

    /// This instance's admissions of the previous window not yet in `g_prev`.
    #[inline]
    fn own_prev(&self) -> u64 {
        u64::from(self.p_prev).saturating_add(u64::from(self.l_prev))
    }

    /// This instance's admissions of the current window not yet in `g_cur`.
    #[inline]
    fn own_cur(&self) -> u64 {
        u64::from(self.p_cur).saturating_add(u64::from(self.l_cur))
    }

    /// Both windows are older than the previous one: the key no longer matters.
    fn is_dead(&self, w: u64) -> bool {
        self.win.saturating_add(1) < w
    }

    /// Known to be at or near its limit at window `w`, elapsed `e`: the estimate (everything
    /// known, global and own) is at least half the limit. Such keys are evicted last.
    fn near_limit(&self, w: u64, wms: u64, e: u64) -> bool {
        self.limit > 0
            && 2 * estimate_at(self.win, self.prev(), self.cur(), w, wms, e) >= self.limit
    }
}

/// Sliding estimate (whole requests, rounded down) at window `w`, elapsed `e`, of counts
/// `(prev, cur)` recorded for window `win` (rolled forward as the window math does).
fn estimate_at(win: u64, prev: u64, cur: u64, w: u64, wms: u64, e: u64) -> u64 {
    let (prev, cur, e) = if win >= w {
        (prev, cur, if win == w { e } else { 0 })
    } else if win + 1 == w {
        (cur, 0, e)
    } else {
        return 0;
    };
    let wms128 = u128::from(wms.max(1));
    let v = u128::from(prev) * (wms128 - u128::from(e.min(wms))) / wms128 + u128::from(cur);
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// What an evicted key leaves behind, so that it comes back with its counts: the shard keeps
/// one per slot of its cap (direct-mapped by the key's process-local hash; on a collision
/// the larger estimate stays). Allocated at the shard's first eviction.
#[derive(Debug, Clone, Copy, Default)]
struct Ghost {
    id: u64,
    win: u64,
    /// Known global totals (in-flight batch included) of the previous and current window.
    g: [u32; 2],
    /// This instance's admissions not yet sent, previous and current window.
    l: [u32; 2],
    shared: bool,
    used: bool,
}

impl Ghost {
    fn estimate(&self, w: u64, wms: u64, e: u64) -> u64 {
        let prev = u64::from(self.g[0]) + u64::from(self.l[0]);
        let cur = u64::from(self.g[1]) + u64::from(self.l[1]);
        estimate_at(self.win, prev, cur, w, wms, e)
    }
}

#[derive(Default)]
struct Shard {
    index: IdMap,
    slots: Vec<Slot>,
    /// Stable hash of each slot's key (same positions as `slots`).
    hashes: Vec<u128>,
    /// Slot indexes to send at a coming flush (each at most once: [`QUEUED`]).
    dirty: Vec<u32>,
    /// CLOCK hand.
    hand: usize,
    /// Idle-key collector cursor.
    gc_cursor: usize,
    /// Ghosts of evicted keys (empty until the first eviction).
    ghosts: Vec<Ghost>,
    /// Window of the last eviction, if any.
    evicted_win: Option<u64>,
}

impl Shard {
    /// CLOCK victim: the first slot at or after the hand that is dead or has no reference
    /// left; slots passed over lose one reference. Keys hit repeatedly survive a flood of
    /// one-shot keys, which have no reference at all. Keys at or near their limit
    /// ([`Slot::near_limit`]) are passed over without losing a reference: they are evicted
    /// only when every live slot of the shard is near its limit (an attacker needs half a
    /// limit of admitted requests per such slot).
    fn victim(&mut self, w: u64, wms: u64, e: u64) -> usize {
        let n = self.slots.len();
        // Every slot loses a reference per pass, so 1 + MAX_REFS passes always find one.
        for protect in [true, false] {
            let mut protected_run = 0;
            for _ in 0..(n * (usize::from(MAX_REFS) + 1) + 1) {
                if self.hand >= n {
                    self.hand = 0;
                }
                let i = self.hand;
                self.hand += 1;
                let s = &mut self.slots[i];
                if s.is_dead(w) {
                    return i;
                }
                if protect && s.near_limit(w, wms, e) {
                    protected_run += 1;
                    if protected_run >= n {
                        break; // all near their limit: plain CLOCK
                    }
                    continue;
                }
                protected_run = 0;
                if s.refs == 0 {
                    return i;
                }
                s.refs -= 1;
            }
        }
        self.hand.min(n.saturating_sub(1))
    }

    /// Takes the ghost of key `id`, if one is still alive at window `w`.
    fn take_ghost(&mut self, id: u64, w: u64) -> Option<Ghost> {
        if self.ghosts.is_empty() {
            return None;
        }
        let j = (id % self.ghosts.len() as u64) as usize;
        let g = self.ghosts[j];
        if g.used && g.id == id && g.win.saturating_add(1) >= w {
            self.ghosts[j].used = false;
            return Some(g);
        }
        None
    }

    /// Remembers slot `i` (about to be evicted) as a ghost; false if its counts are lost
    /// (another key's larger ghost holds the entry).
    fn bury(&mut self, i: usize, w: u64, wms: u64, e: u64, cap: usize) -> bool {
        let s = &self.slots[i];
        if s.is_dead(w) {
            return true;
        }
        let g = Ghost {
            id: s.id,
            win: s.win,
            g: [
                s.g_prev.saturating_add(s.p_prev),
                s.g_cur.saturating_add(s.p_cur),
            ],
            l: [s.l_prev, s.l_cur],
            shared: s.flags & SHARED != 0,
            used: true,
        };
        if g.g == [0, 0] && g.l == [0, 0] {
            return true;
        }
        if self.ghosts.is_empty() {
            self.ghosts = vec![Ghost::default(); cap.max(1)];
        }
        let j = (g.id % self.ghosts.len() as u64) as usize;
        let old = self.ghosts[j];
        if !old.used
            || old.id == g.id
            || old.win.saturating_add(1) < w
            || g.estimate(w, wms, e) >= old.estimate(w, wms, e)
        {
            self.ghosts[j] = g;
            return true;
        }
        false
    }

    /// Removes slot `i` (swap-remove). Only called while the dirty list is empty.
    fn remove_at(&mut self, i: usize) {
        let id = self.slots[i].id;
        self.index.remove(&id);
        self.slots.swap_remove(i);
        self.hashes.swap_remove(i);
        if i < self.slots.len() {
            let moved = self.slots[i].id;
            if let Some(ix) = self.index.get_mut(&moved) {
                *ix = i as u32;
            }
        }
    }

    #[inline]
    fn queue(&mut self, i: usize) {
        if !self.slots[i].queued() {
            self.slots[i].flags |= QUEUED;
            self.dirty.push(i as u32);
        }
    }
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

/// Sharded sliding-window limiter. Share as `Arc<Limiter>`.
pub struct Limiter {
    params: ArcSwap<Params>,
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    healthy: AtomicBool,
    store_errors: AtomicU64,
    /// Keys evicted while holding admissions not yet delivered to the store.
    dropped_unsent: AtomicU64,
    evictions: AtomicU64,
    last_store_call_ms: AtomicU64,
    /// Serializes flushes and holds the batch that failed, retried as-is (same id).
    flush_state: tokio::sync::Mutex<FlushState>,
    /// Random per-limiter high half of batch ids.
    instance_id: u64,
    /// Live instances sharing the store, as last reported by it (1 when it reports none).
    /// Kept while the store is unreachable.
    instances: AtomicU64,
    /// Divisor of the fleet share applied by [`Limiter::check`]: `instances` while the
    /// store is healthy, 1 (no share) while it is not.
    share_n: AtomicU64,
}

/// A batch the store did not acknowledge. Its admissions stay in the slots' `p_*` counters
/// (so they keep counting) and are retried with the same id until acknowledged.
struct PendingBatch {
    id: u128,
    window_secs: u64,
    batch: Vec<Delta>,
    /// (shard, slot id, whether the previous window's total read back is final).
    taken: Vec<(u8, u64, bool)>,
    admissions: u64,
}

#[derive(Default)]
struct FlushState {
    seq: u64,
    pending: Option<PendingBatch>,
    /// Flushes so far (every [`SYNC_EVERY`]-th sends every queued key).
    flushes: u64,
    /// `now_ms` of the last flush.
    last_flush_ms: u64,
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
            dropped_unsent: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            last_store_call_ms: AtomicU64::new(0),
            flush_state: tokio::sync::Mutex::new(FlushState::default()),
            instance_id: instance_id(),
            instances: AtomicU64::new(1),
            share_n: AtomicU64::new(1),
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

    #[inline]
    fn shard_of(&self, id: u64) -> &Mutex<Shard> {
        &self.shards[(id >> (64 - SHARD_BITS)) as usize]
    }

    /// Decides one request for `key` at `now_ms` (Unix ms). In-memory only, never blocks on
    /// I/O; the request is counted only if admitted. Keys are bytes: two keys are the same
    /// key only if they are equal byte for byte.
    pub fn check<K: AsRef<[u8]> + ?Sized>(&self, key: &K, now_ms: u64) -> Decision {
        let key = key.as_ref();
        let p = self.params.load();
        let id = self.hasher.hash_one(key);
        let mut shard = lock(self.shard_of(id));
        let wms = p.window_ms;
        let w = now_ms / wms;
        let e = now_ms % wms;

        let i = match shard.index.get(&id) {
            Some(&i) => {
                let i = i as usize;
                let s = &mut shard.slots[i];
                if s.refs < MAX_REFS {
                    s.refs += 1;
                }
                i
            }
            None => self.insert(&mut shard, id, key, &p, w, e),
        };
        let s = &mut shard.slots[i];
        if s.generation != p.generation {
            s.limit = p.limit_for(key);
            s.generation = p.generation;
            s.blocked_until = 0;
        }
        let d = self.decide(s, now_ms, wms, w, e);
        // Keys whose counts matter are sent at a coming flush (also when merely refused:
        // that refreshes their global view); the others stay local.
        if shard.slots[i].flags & SHARED != 0 {
            shard.queue(i);
        }
        d
    }

    /// The decision proper on the key's slot (see [`Limiter::check`]).
    #[inline]
    fn decide(&self, s: &mut Slot, now_ms: u64, wms: u64, mut w: u64, mut e: u64) -> Decision {
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
            let secs = window::ceil_secs(ms).max(1);
            return Decision::Limited {
                limit,
                retry_after_secs: secs,
                reset_secs: secs,
            };
        }

        let prev = s.prev();
        let mut cur = s.cur();
        if s.flags & RESTORED != 0 {
            // After a loss, until news, the estimate of the other instances' unsynced
            // admissions is part of what is known, also while the share (which otherwise
            // carries it) is suspended by a store outage.
            cur = cur.saturating_add(u64::from(s.est));
        }
        let own = s.own_prev().saturating_add(s.own_cur());
        if window::admits(prev, cur, limit, wms, e) {
            // A key that may have been forgotten (evicted) admits no more than a key kept
            // local before its first sync, which tells its real counts.
            let unknown = s.flags & (UNKNOWN | SYNCED) == UNKNOWN
                && own >= LOCAL_ONLY_MAX
                && self.healthy.load(Ordering::Relaxed);
            // Several instances: this one's share of what the fleet had left at the last
            // sync (see the module doc). Refused only for the share: retry after the next
            // syncs, not cached.
            let n = self.share_n.load(Ordering::Relaxed);
            if unknown
                || (n > 1
                    && !window::within_share(
                        (
                            u64::from(s.g_prev),
                            u64::from(s.g_cur).saturating_add(u64::from(s.est)),
                        ),
                        (s.own_prev(), s.own_cur()),
                        limit,
                        n,
                        wms,
                        e,
                    ))
            {
                s.flags |= SHARED;
                return Decision::Limited {
                    limit,
                    retry_after_secs: SHARE_RETRY_SECS,
                    reset_secs: SHARE_RETRY_SECS,
                };
            }
            s.l_cur = s.l_cur.saturating_add(1);
            if own >= LOCAL_ONLY_MAX {
                s.flags |= SHARED;
            }
            let cur = cur.saturating_add(1);
            Decision::Allowed {
                limit,
                remaining: window::remaining(prev, cur, limit, wms, e),
                reset_secs: window::ceil_secs(window::drain_ms(prev, cur, wms, e)),
            }
        } else {
            s.flags |= SHARED;
            let ms = window::retry_after_ms(prev, cur, limit, wms, e).max(1);
            s.blocked_until = now_ms.saturating_add(ms);
            let secs = window::ceil_secs(ms).max(1);
            Decision::Limited {
                limit,
                retry_after_secs: secs,
                reset_secs: secs,
            }
        }
    }

    /// Adds a slot for a new key, evicting one under the shard's cap. A key evicted before
    /// comes back with its counts from its ghost; a key without one, in a shard that evicted
    /// recently, may be a forgotten key ([`UNKNOWN`]).
    #[cold]
    fn insert(&self, shard: &mut Shard, id: u64, key: &[u8], p: &Params, w: u64, e: u64) -> usize {
        let key_hash = stable_hash(key);
        let mut slot = Slot {
            id,
            win: w,
            g_prev: 0,
            g_cur: 0,
            l_prev: 0,
            l_cur: 0,
            p_prev: 0,
            p_cur: 0,
            est: 0,
            blocked_until: 0,
            limit: p.limit_for(key),
            generation: p.generation,
            refs: 0,
            flags: 0,
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
        if shard.slots.len() < p.cap_per_shard {
            let i = shard.slots.len();
            shard.slots.push(slot);
            shard.hashes.push(key_hash);
            shard.index.insert(id, i as u32);
            return i;
        }
        let i = shard.victim(w, p.window_ms, e);
        let kept = shard.bury(i, w, p.window_ms, e, p.cap_per_shard);
        if restored.is_none() {
            // This shard evicts now: the next keys new to it may be forgotten ones.
            slot.flags |= UNKNOWN;
        }
        shard.evicted_win = Some(w);
        let old = &shard.slots[i];
        // Admissions already in a batch (`p_*`) are still delivered; `l_*` are lost unless
        // the ghost keeps them.
        if (old.l_cur | old.l_prev) != 0 && !old.is_dead(w) && !kept {
            self.dropped_unsent.fetch_add(1, Ordering::Relaxed);
        }
        self.evictions.fetch_add(1, Ordering::Relaxed);
        let old_id = old.id;
        // Keep the queued flag: the slot index may already be in the dirty list.
        let flags = old.flags & QUEUED;
        shard.index.remove(&old_id);
        shard.slots[i] = Slot {
            flags: flags | slot.flags,
            ..slot
        };
        shard.hashes[i] = key_hash;
        shard.index.insert(id, i as u32);
        i
    }

    /// Keys currently tracked.
    pub fn tracked_keys(&self) -> usize {
        self.shards.iter().map(|s| lock(s).index.len()).sum()
    }

    /// False after a failed store call, true again after a successful one.
    pub fn store_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Failed store calls (timeouts, connection and command errors).
    pub fn store_errors_total(&self) -> u64 {
        self.store_errors.load(Ordering::Relaxed)
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
                    .slots
                    .iter()
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

    /// One flush: sends queued keys' unsent admissions (and keys that were merely checked,
    /// to refresh their global view) to `store` in one batch, then applies the returned
    /// global counts. Adaptive sync: keys near their limit (or with large unsent deltas, or
    /// refused for their fleet share) are sent at every flush; the others stay queued and
    /// are sent every [`SYNC_EVERY`]-th flush (so never more than `SYNC_EVERY - 1` flushes
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

    /// (window, prev, cur, global cur) of a key, for tests.
    #[cfg(test)]
    pub(crate) fn slot_counts_for_tests(&self, key: &str) -> (u64, u64, u64, u64) {
        self.slot_counts(key).unwrap_or_default()
    }

    #[cfg(test)]
    fn slot_counts<K: AsRef<[u8]> + ?Sized>(&self, key: &K) -> Option<(u64, u64, u64, u64)> {
        let id = self.hasher.hash_one(key.as_ref());
        let sh = lock(self.shard_of(id));
        sh.index.get(&id).map(|&i| {
            let s = &sh.slots[i as usize];
            (s.win, s.prev(), s.cur(), u64::from(s.g_cur))
        })
    }
}

/// Applies the global counts returned for delta `d`; `n` live instances; `prev_final`: the
/// previous window's total returned is final. A total below what was known before plus
/// what was just added (the store lost data and did not restore it) is not trusted: the
/// known value stays (the next sync carries it as the floor again).
///
/// After a loss ([`GlobalCounts::restored`], or a total below the floor) the answer is
/// only what this instance (or the first instance to restore) knew: the other instances'
/// admissions that were not yet in this instance's view are missing from it until they
/// write back their own floors. So the answer does not reopen the key: `est` (the estimate
/// of those admissions) only grows and a cached refusal stays, until a sync brings news
/// ([`RESTORED`]). Without this an instance whose view was one flush old, refusing on its
/// estimate, restored its own older total first, dropped the estimate and admitted again.
fn apply(s: &mut Slot, d: &Delta, c: GlobalCounts, n: u64, prev_final: bool) {
    let sat = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let known = d.floor_cur.saturating_add(d.cur);
    if c.restored || c.cur < known {
        s.flags |= RESTORED;
    } else if c.cur > known {
        s.flags &= !RESTORED;
    }
    let restored = s.flags & RESTORED != 0;
    // The other instances are assumed to hold as many admissions not yet synced as we just
    // sent (they see the same traffic); replaced at every sync (only raised after a loss).
    let mut est = sat(n.saturating_sub(1).saturating_mul(d.cur));
    if restored {
        est = est.max(s.est);
    }
    let cur = c.cur.max(known);
    s.flags = (s.flags | SYNCED | SHARED) & !UNKNOWN;
    if s.win == d.window {
        s.g_cur = sat(cur);
        // Without `need_prev` the store may not have read it: `g_prev` is final already.
        if d.need_prev || d.prev > 0 {
            s.g_prev = sat(c.prev.max(d.floor_prev.saturating_add(d.prev)));
            if prev_final {
                s.flags |= PREV_FINAL;
            }
        }
        s.est = est;
    } else if s.win == d.window + 1 {
        s.g_prev = sat(cur);
        s.est = est;
    } else {
        s.est = 0;
    }
    s.p_cur = 0;
    s.p_prev = 0;
    // New global counts: recompute any cached refusal (unless they only restore a loss).
    if !restored {
        s.blocked_until = 0;
    }
}

fn gc_step(sh: &mut Shard, w: u64, wms: u64, e: u64, cap: usize) {
    // Over the cap after a reload that lowered it: evict down to it.
    while sh.slots.len() > cap {
        let i = sh.victim(w, wms, e);
        sh.bury(i, w, wms, e, cap);
        sh.evicted_win = Some(w);
        sh.remove_at(i);
    }
    let mut budget = GC_STEP;
    while budget > 0 && !sh.slots.is_empty() {
        budget -= 1;
        if sh.gc_cursor >= sh.slots.len() {
            sh.gc_cursor = 0;
        }
        let i = sh.gc_cursor;
        if sh.slots[i].is_dead(w) {
            sh.remove_at(i); // re-examine index i (now holds the moved slot)
        } else {
            sh.gc_cursor += 1;
        }
    }
    if sh.hand >= sh.slots.len() {
        sh.hand = 0;
    }
}

fn instance_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    RandomState::new().hash_one((t, std::process::id()))
}

#[inline]
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Approximate memory per tracked key: the slot and its stable hash, plus the index entry
/// (with the hash table's control byte and a 7/8 load factor), a dirty-list entry and the
/// ghost entry (one per slot of the cap once the shard evicts).
pub fn approx_bytes_per_key() -> usize {
    let slot =
        std::mem::size_of::<Slot>() + std::mem::size_of::<u128>() + std::mem::size_of::<Ghost>();
    let index = (std::mem::size_of::<(u64, u32)>() + 1) * 8 / 7;
    slot + index + std::mem::size_of::<u32>()
}

const _: () = assert!(std::mem::size_of::<Slot>() == 64);

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "limiter_tests.rs"]
pub(crate) mod tests;
