//! One tracked key: its slot (counts, flags), the sync policy that decides when it is
//! sent ([`Slot::needs_sync`]), how a store answer is applied ([`apply`]), and the ghost an
//! evicted key leaves behind. Pure: time is a parameter.

use super::store::{Delta, GlobalCounts};
use super::window;

/// "Near the limit": the key's estimate (last known global counts, the estimate of the other
/// instances' unsynced admissions and its own unsynced admissions) is at least this
/// percentage of the limit.
pub(super) const NEAR_LIMIT_PERCENT: u128 = 50;
/// A key whose own unsynced admissions reach this percentage of what the fleet had left at
/// the last sync is sent at the next flush, near its limit or not.
pub(super) const BIG_DELTA_PERCENT: u128 = 10;
/// `Slot::flags`: in the shard's dirty list.
pub(super) const QUEUED: u8 = 1;
/// `Slot::flags`: `g_prev` is the final total of the previous window.
pub(super) const PREV_FINAL: u8 = 2;
/// `Slot::flags`: the key's counts matter to the fleet: it is queued for the store when
/// checked. Set once this instance admitted more than [`LOCAL_ONLY_MAX`] requests of it in
/// the current and previous windows, or refused it, or synced it; never cleared.
pub(super) const SHARED: u8 = 4;
/// `Slot::flags`: synced with the store at least once (a global view exists).
pub(super) const SYNCED: u8 = 8;
/// `Slot::flags`: created, without a ghost, in a shard that evicted keys in this or the
/// previous window: it may be a key this instance forgot. Until its first sync it admits at
/// most [`LOCAL_ONLY_MAX`] requests, then is refused for one sync (`Retry-After: 1`).
pub(super) const UNKNOWN: u8 = 16;
/// `Slot::flags`: the store lost this key's counts and restored them from a floor (this
/// instance's or another's). Such an answer tells what some instance knew, not what the
/// fleet did since: until a sync brings news (a total above what this instance knew plus
/// what it sent, i.e. another instance wrote), the estimate of the other instances'
/// unsynced admissions (`est`) and a cached refusal are kept, not reset, and `est` counts
/// in the decision even while the fleet share is suspended.
pub(super) const RESTORED: u8 = 32;
/// Keys stay local until their counts can matter: a key this instance admitted at most
/// this many times over its current and previous windows (and never refused) is never sent
/// to the store, so a flood of keys each seen once creates no store key at all. Bound on the
/// overshoot this adds: each instance may admit up to `LOCAL_ONLY_MAX` requests of a key
/// that the fleet does not see, i.e. at most `N x LOCAL_ONLY_MAX` (N instances) per sliding
/// window per key above the limit (1 per instance; the fleet share already caps what an
/// instance admits of a key before syncing it).
pub const LOCAL_ONLY_MAX: u64 = 1;
/// First contact in a large fleet: in a fleet of more than this many live instances, an
/// instance that has not synced a key yet (no view of what the fleet admitted of it) takes
/// its share with the divisor `n² / FIRST_CONTACT_FLEET` rather than `n`, so the first
/// contacts of all `n` instances add up to `FIRST_CONTACT_FLEET / n` of the limit in
/// expectation (under 5% from 80 instances), not to the whole limit again. An instance
/// refused for it is synced at the next flush and takes its share of what the fleet really
/// has left from then on. In such a fleet the estimate of the other instances' unsynced
/// admissions is also at least what they added since this instance's last view.
/// Fleets up to this size keep the plain share and estimate (see the module doc for what
/// that leaves).
pub const FIRST_CONTACT_FLEET: u64 = 4;

/// One tracked key: exactly one cache line. (Its stable hash for the store lives in the
/// shard's parallel `hashes` vector, read only when flushing.)
#[derive(Debug, Clone)]
#[repr(align(64))]
pub(super) struct Slot {
    /// Process-local hash (map key).
    pub(super) id: u64,
    /// Window index of the `*_cur` counters.
    pub(super) win: u64,
    /// Last known global totals (include our own flushed admissions).
    pub(super) g_prev: u32,
    pub(super) g_cur: u32,
    /// Admissions not yet sent.
    pub(super) l_prev: u32,
    pub(super) l_cur: u32,
    /// Admissions sent by the flush in progress, not yet acknowledged.
    pub(super) p_prev: u32,
    pub(super) p_cur: u32,
    /// Estimate of the other instances' admissions not yet in `g_cur` (counted in the
    /// current window), set by each sync; used only while the fleet share applies.
    pub(super) est: u32,
    /// Cached refusal: the key stays refused until this instant (ms), unless new counts
    /// arrive. 0 = no cached refusal.
    pub(super) blocked_until: u64,
    pub(super) limit: u64,
    /// Parameter generation (wrapping) the slot's limit was computed for. A slot untouched
    /// for exactly a multiple of 65,536 reloads would keep a stale limit: harmless.
    pub(super) generation: u16,
    /// CLOCK reference counter: 0 for a key seen once.
    pub(super) refs: u8,
    /// [`QUEUED`]: in the shard's dirty list (to be sent at a coming flush);
    /// [`PREV_FINAL`]: `g_prev` is final (no need to read it from the store again).
    pub(super) flags: u8,
}

impl Slot {
    #[inline]
    pub(super) fn queued(&self) -> bool {
        self.flags & QUEUED != 0
    }

    #[inline]
    pub(super) fn prev_final(&self) -> bool {
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
    pub(super) fn needs_sync(&self, n: u64, wms: u64, e: u64) -> bool {
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
                self.known_global(wms, e),
                self.own(),
                self.limit,
                self.share_divisor(n),
                || self.share_draw(e),
            )
    }

    /// The divisor of this key's fleet share with `n` live instances: `n`, or
    /// `n² / FIRST_CONTACT_FLEET` before its first sync in a fleet larger than
    /// [`FIRST_CONTACT_FLEET`] (see there).
    #[inline]
    pub(super) fn share_divisor(&self, n: u64) -> u64 {
        if n > FIRST_CONTACT_FLEET && self.flags & SYNCED == 0 {
            n.saturating_mul(n) / FIRST_CONTACT_FLEET
        } else {
            n
        }
    }

    /// This key's draw for the fleet share on this instance ([`window::share_draw`]): from
    /// its process-local id (random per limiter, so independent between instances), its
    /// window, the counts of its last sync and the second of the window (`e`: elapsed ms),
    /// so it holds between two syncs within a second. The second matters when no sync
    /// brings news: with R = 1 left and two instances that both drew "no", nothing would
    /// change the draw until the window ends; a new draw each second keeps the share's
    /// `Retry-After: 1` true (at most one more admission per instance per second while
    /// the fleet still has some left).
    #[inline]
    pub(super) fn share_draw(&self, e: u64) -> u64 {
        let view = u64::from(self.g_cur)
            ^ (u64::from(self.est) << 32)
            ^ u64::from(self.g_prev).rotate_left(48)
            ^ (e / 1000).rotate_left(16);
        window::share_draw(self.id, self.win, view)
    }

    /// The fleet's counts as last known (with the estimate of the other instances'
    /// unsynced admissions) at elapsed `e` of `wms`-ms windows.
    #[inline]
    pub(super) fn known_global(&self, wms: u64, e: u64) -> window::Sliding {
        window::Sliding {
            prev: u64::from(self.g_prev),
            cur: u64::from(self.g_cur).saturating_add(u64::from(self.est)),
            w: wms,
            e,
        }
    }

    /// This instance's admissions not yet in the global view: (previous, current window).
    #[inline]
    pub(super) fn own(&self) -> (u64, u64) {
        (self.own_prev(), self.own_cur())
    }

    #[inline]
    pub(super) fn roll(&mut self, w: u64) {
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
    pub(super) fn prev(&self) -> u64 {
        u64::from(self.g_prev)
            .saturating_add(u64::from(self.p_prev))
            .saturating_add(u64::from(self.l_prev))
    }

    #[inline]
    pub(super) fn cur(&self) -> u64 {
        u64::from(self.g_cur)
            .saturating_add(u64::from(self.p_cur))
            .saturating_add(u64::from(self.l_cur))
    }

    /// This instance's admissions of the previous window not yet in `g_prev`.
    #[inline]
    pub(super) fn own_prev(&self) -> u64 {
        u64::from(self.p_prev).saturating_add(u64::from(self.l_prev))
    }

    /// This instance's admissions of the current window not yet in `g_cur`.
    #[inline]
    pub(super) fn own_cur(&self) -> u64 {
        u64::from(self.p_cur).saturating_add(u64::from(self.l_cur))
    }

    /// Both windows are older than the previous one: the key no longer matters.
    pub(super) fn is_dead(&self, w: u64) -> bool {
        self.win.saturating_add(1) < w
    }

    /// Known to be at or near its limit at window `w`, elapsed `e`: the estimate (everything
    /// known, global and own) is at least half the limit. Such keys are evicted last.
    pub(super) fn near_limit(&self, w: u64, wms: u64, e: u64) -> bool {
        self.limit > 0
            && 2 * estimate_at(self.win, self.prev(), self.cur(), w, wms, e) >= self.limit
    }
}

/// Sliding estimate (whole requests, rounded down) at window `w`, elapsed `e`, of counts
/// `(prev, cur)` recorded for window `win` (rolled forward as the window math does).
pub(super) fn estimate_at(win: u64, prev: u64, cur: u64, w: u64, wms: u64, e: u64) -> u64 {
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
pub(super) struct Ghost {
    pub(super) id: u64,
    pub(super) win: u64,
    /// Known global totals (in-flight batch included) of the previous and current window.
    pub(super) g: [u32; 2],
    /// This instance's admissions not yet sent, previous and current window.
    pub(super) l: [u32; 2],
    pub(super) shared: bool,
    pub(super) used: bool,
}

impl Ghost {
    pub(super) fn estimate(&self, w: u64, wms: u64, e: u64) -> u64 {
        let prev = u64::from(self.g[0]) + u64::from(self.l[0]);
        let cur = u64::from(self.g[1]) + u64::from(self.l[1]);
        estimate_at(self.win, prev, cur, w, wms, e)
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
///
/// In a fleet of more than [`FIRST_CONTACT_FLEET`] instances, `est` is at least the
/// others' news: the total above what this instance knew plus what it sent (the whole
/// total on its first view of the window). Simulated at 1,000 instances, 100x the limit,
/// the window a key is new to the fleet went from 1.23x to 1.02x the limit with it (the
/// smaller first share alone), 1.09x when it counted only on a first view.
///
/// A `late` answer (it came back a flush interval or more after it was sent) is older than
/// the other instances' next syncs, and the admissions they sent meanwhile are missing
/// from it: `est` is not lowered by it (the estimate it held still stands for them).
/// On paused time, two instances alternating requests over a store answering in 50 to
/// 60 ms went over `limit + 1` in 15 of 2,000 runs without this, 12 with it (shares rounded
/// up; 7 to 9 with the remainder drawn: `fleet_share_alternating_requests_with_slow_answers`).
pub(super) fn apply(
    s: &mut Slot,
    d: &Delta,
    c: GlobalCounts,
    n: u64,
    prev_final: bool,
    late: bool,
) {
    let sat = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let known = d.floor_cur.saturating_add(d.cur);
    if c.restored || c.cur < known {
        s.flags |= RESTORED;
    } else if c.cur > known {
        s.flags &= !RESTORED;
    }
    let restored = s.flags & RESTORED != 0;
    // The other instances are assumed to hold as many admissions not yet synced as we just
    // sent (they see the same traffic); replaced at every sync (only raised after a loss
    // or by a late answer).
    let mut est = sat(n.saturating_sub(1).saturating_mul(d.cur));
    if n > FIRST_CONTACT_FLEET && !restored {
        // In a large fleet, also what the others added since this instance's last view
        // (everything, on its first view of the window): see `FIRST_CONTACT_FLEET`.
        est = est.max(sat(c.cur.saturating_sub(known)));
    }
    if restored || late {
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

const _: () = assert!(std::mem::size_of::<Slot>() == 64);
