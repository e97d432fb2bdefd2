//! Counter stores: where instances meet to add up their admissions.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

pub use crate::StoreError;

/// One key's unflushed admissions, relative to window index `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delta {
    /// Stable hash of the API key (see [`super::hash::stable_hash`]); the raw key never
    /// reaches a store.
    pub key_hash: u128,
    /// Window length of the key's policy, in seconds (>= 1): the store keeps a count for two
    /// windows of this length (Redis TTL, the in-process store's clean-up). One batch carries
    /// the deltas of every policy, whatever their windows.
    pub window_secs: u64,
    /// Epoch-aligned window index (`now_ms / (window_secs * 1000)`) of `cur`.
    pub window: u64,
    /// Admissions to add to window `window`.
    pub cur: u64,
    /// Admissions to add to window `window - 1`.
    pub prev: u64,
    /// Whether the caller needs the total of window `window - 1` back. When false (the
    /// caller already holds its final value) and `prev` is 0, a store may skip reading it
    /// and return anything as `prev` (the caller ignores it).
    pub need_prev: bool,
    /// What the caller last read as window `window`'s total (0 = nothing known). Counters
    /// only grow, so a store holding less lost data (`FLUSHALL`, a restart without
    /// persistence, an eviction): it raises the counter to this floor before adding `cur`
    /// rather than trusting the loss. A floor never exceeds the true total, so several
    /// instances restoring the same loss restore it once (it is a maximum, not a sum).
    pub floor_cur: u64,
    /// As `floor_cur`, for window `window - 1` (applied only when that window is read or
    /// written: `need_prev` or `prev > 0`).
    pub floor_prev: u64,
}

/// Global totals after a sync, for the delta's windows `window` (`cur`) and `window - 1`
/// (`prev`). These include the deltas just sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GlobalCounts {
    /// Total for window `window`.
    pub cur: u64,
    /// Total for window `window - 1`.
    pub prev: u64,
    /// The store held less than the caller's floor ([`Delta::floor_cur`] or
    /// [`Delta::floor_prev`]): it lost data and restored it from this caller's floor. The
    /// totals then tell what the caller knew, not what the other instances did since.
    pub restored: bool,
}

/// One flush's batch, as handed to [`CounterStore::sync`].
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// Unique per batch and limiter; a failed batch is retried with the same id and the same
    /// deltas, and a store must apply one id at most once (a call that timed out on the
    /// client may still have been executed). Its high 64 bits identify the calling process's
    /// limiters (random, fixed for their lifetime): a shared store may count live instances
    /// by them (see [`CounterStore::instances`]).
    pub id: u128,
    /// Every delta of the flush, of every policy.
    pub deltas: &'a [Delta],
    /// The caller's clock (Unix ms).
    pub now_ms: u64,
}

/// What [`CounterStore::sync`] answers: the totals, one per delta in the batch's order.
pub type SyncResult = Result<Vec<GlobalCounts>, StoreError>;

/// A shared counter store.
#[async_trait]
pub trait CounterStore: Send + Sync {
    /// Adds every delta to its key's windows and returns the resulting totals, one per delta
    /// in the same order. An empty batch is a health probe (it must still reach the store).
    /// Must be bounded in time. See [`Batch`] for the id's contract.
    async fn sync(&self, batch: Batch<'_>) -> SyncResult;

    /// `"redis"` or `"local"` (for `/status`).
    fn kind(&self) -> &'static str;

    /// Live instances (limiters) sharing this store, as learned by the last successful
    /// [`CounterStore::sync`] (which must have counted the caller itself); `None` for a store
    /// that is not shared or has not synced yet. Read by the limiter right after each
    /// successful sync to size its share of each key's remaining quota.
    fn instances(&self) -> Option<u64> {
        None
    }
}

/// In-process store, used when there is no `[redis]` section: same window math, no sharing.
/// Windows older than the previous one are dropped; the number of keys is capped.
pub struct LocalStore {
    map: Mutex<HashMap<u128, LocalCounts>>,
    max_keys: usize,
}

#[derive(Debug, Clone, Copy)]
struct LocalCounts {
    window_ms: u64,
    window: u64,
    cur: u64,
    prev: u64,
}

impl LocalStore {
    /// A store holding at most `super::DEFAULT_MAX_TRACKED_KEYS * 2` keys.
    pub fn new() -> Self {
        Self::with_max_keys(super::DEFAULT_MAX_TRACKED_KEYS * 2)
    }

    /// A store holding at most `max_keys` keys (at least 1).
    pub fn with_max_keys(max_keys: usize) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            max_keys: max_keys.max(1),
        }
    }

    /// Keys currently held.
    pub fn len(&self) -> usize {
        self.map
            .lock()
            .map(|m| m.len())
            .unwrap_or_else(|e| e.into_inner().len())
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Current totals of a key for window `window` and `window - 1` (tests, debugging).
    pub fn counts(&self, key_hash: u128, window: u64) -> GlobalCounts {
        let m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&key_hash)
            .map(|c| counts_at(c, window))
            .unwrap_or_default()
    }
}

impl Default for LocalStore {
    fn default() -> Self {
        Self::new()
    }
}

fn counts_at(c: &LocalCounts, window: u64) -> GlobalCounts {
    if c.window == window {
        GlobalCounts {
            cur: c.cur,
            prev: c.prev,
            restored: false,
        }
    } else if c.window + 1 == window {
        GlobalCounts {
            cur: 0,
            prev: c.cur,
            restored: false,
        }
    } else if c.window == window + 1 {
        GlobalCounts {
            cur: c.prev,
            prev: 0,
            restored: false,
        }
    } else {
        GlobalCounts::default()
    }
}

#[async_trait]
impl CounterStore for LocalStore {
    async fn sync(&self, batch: Batch<'_>) -> SyncResult {
        let now_ms = batch.now_ms;
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(batch.deltas.len());
        for d in batch.deltas {
            let window_ms = d.window_secs.max(1).saturating_mul(1000);
            let c = m.entry(d.key_hash).or_insert(LocalCounts {
                window_ms,
                window: d.window,
                cur: 0,
                prev: 0,
            });
            // Roll forward to the delta's window.
            if d.window == c.window + 1 {
                c.prev = c.cur;
                c.cur = 0;
                c.window = d.window;
            } else if d.window > c.window + 1 {
                *c = LocalCounts {
                    window_ms,
                    window: d.window,
                    cur: 0,
                    prev: 0,
                };
            }
            // Never below what the caller already knew (see `Delta::floor_cur`).
            let mut restored = false;
            if c.window == d.window {
                restored |= c.cur < d.floor_cur;
                c.cur = c.cur.max(d.floor_cur).saturating_add(d.cur);
                if d.need_prev || d.prev > 0 {
                    restored |= c.prev < d.floor_prev;
                    c.prev = c.prev.max(d.floor_prev).saturating_add(d.prev);
                }
            } else if c.window == d.window + 1 {
                // The store is one window ahead of this delta.
                restored |= c.prev < d.floor_cur;
                c.prev = c.prev.max(d.floor_cur).saturating_add(d.cur);
            }
            out.push(GlobalCounts {
                restored,
                ..counts_at(c, d.window)
            });
        }
        if m.len() > self.max_keys {
            m.retain(|_, c| c.window + 1 >= now_ms / c.window_ms);
            if m.len() > self.max_keys {
                // Still over: drop arbitrary keys (bounded memory beats accuracy here).
                let excess = m.len() - self.max_keys;
                let victims: Vec<u128> = m.keys().take(excess).copied().collect();
                for k in victims {
                    m.remove(&k);
                }
            }
        }
        Ok(out)
    }

    fn kind(&self) -> &'static str {
        "local"
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn batch(deltas: &[Delta], now_ms: u64) -> Batch<'_> {
        Batch {
            id: 0,
            deltas,
            now_ms,
        }
    }

    #[tokio::test]
    async fn local_store_windows() {
        let s = LocalStore::with_max_keys(10);
        let d = |w, cur, prev| Delta {
            key_hash: 7,
            window_secs: 60,
            window: w,
            cur,
            prev,
            need_prev: true,
            floor_cur: 0,
            floor_prev: 0,
        };
        let r = s.sync(batch(&[d(5, 3, 0)], 5 * 60_000)).await.unwrap();
        assert_eq!(
            r,
            vec![GlobalCounts {
                cur: 3,
                prev: 0,
                restored: false
            }]
        );
        let r = s.sync(batch(&[d(5, 2, 0)], 5 * 60_000)).await.unwrap();
        assert_eq!(
            r,
            vec![GlobalCounts {
                cur: 5,
                prev: 0,
                restored: false
            }]
        );
        // rollover: window 6 gets 1, previous (5) gets 1 late delta
        let r = s.sync(batch(&[d(6, 1, 1)], 6 * 60_000)).await.unwrap();
        assert_eq!(
            r,
            vec![GlobalCounts {
                cur: 1,
                prev: 6,
                restored: false
            }]
        );
        // a straggler for window 5 from another instance
        let r = s.sync(batch(&[d(5, 1, 0)], 6 * 60_000)).await.unwrap();
        assert_eq!(
            r,
            vec![GlobalCounts {
                cur: 7,
                prev: 0,
                restored: false
            }]
        );
        assert_eq!(
            s.counts(7, 6),
            GlobalCounts {
                cur: 1,
                prev: 7,
                restored: false
            }
        );
        // skip of 2+ windows forgets everything
        let r = s.sync(batch(&[d(9, 0, 0)], 9 * 60_000)).await.unwrap();
        assert_eq!(
            r,
            vec![GlobalCounts {
                cur: 0,
                prev: 0,
                restored: false
            }]
        );
    }

    #[tokio::test]
    async fn local_store_restores_a_lost_count_from_the_floor() {
        let s = LocalStore::new();
        let d = |key_hash, cur, floor_cur, floor_prev| Delta {
            key_hash,
            window_secs: 60,
            window: 5,
            cur,
            prev: 0,
            need_prev: true,
            floor_cur,
            floor_prev,
        };
        // (`s` stands for a store restarted empty: key 1 was at 100 before.)
        assert_eq!(s.counts(1, 5), GlobalCounts::default());
        // Two callers that knew 100 (and 40 in the previous window) restore it once.
        let r = s.sync(batch(&[d(1, 0, 100, 40)], 5 * 60_000)).await;
        assert_eq!(
            r.unwrap(),
            vec![GlobalCounts {
                cur: 100,
                prev: 40,
                restored: true
            }]
        );
        let r = s.sync(batch(&[d(1, 2, 100, 40)], 5 * 60_000)).await;
        assert_eq!(
            r.unwrap(),
            vec![GlobalCounts {
                cur: 102,
                prev: 40,
                restored: false
            }]
        );
        // A floor below the stored total changes nothing.
        let r = s.sync(batch(&[d(1, 1, 50, 0)], 5 * 60_000)).await;
        assert_eq!(
            r.unwrap(),
            vec![GlobalCounts {
                cur: 103,
                prev: 40,
                restored: false
            }]
        );
    }

    #[tokio::test]
    async fn local_store_bounded() {
        let s = LocalStore::with_max_keys(100);
        for i in 0..1000u128 {
            let d = Delta {
                key_hash: i,
                window_secs: 60,
                window: 1,
                cur: 1,
                prev: 0,
                need_prev: true,
                floor_cur: 0,
                floor_prev: 0,
            };
            s.sync(batch(&[d], 60_000)).await.unwrap();
        }
        assert!(s.len() <= 100);
    }
}
