//! The sharded key cache: [`SHARDS`] mutex-protected shards, each an open-addressed table
//! of slots ([`Table`]), a dirty list for the flusher, CLOCK eviction that spares keys near
//! their limit, ghosts of evicted keys and an incremental idle-key collector.

use std::sync::{Mutex, MutexGuard};

use super::slot::{Ghost, Slot, QUEUED, SHARED};
use super::table::{Table, MAX_LOAD_DEN, MAX_LOAD_NUM};

/// Number of shards (a power of two; the top bits of the key's hash select the shard).
pub const SHARDS: usize = 64;
pub(super) const SHARD_BITS: u32 = SHARDS.trailing_zeros();
/// Saturation of the per-key reference counter of the CLOCK eviction.
pub(super) const MAX_REFS: u8 = 3;
/// Table positions examined per shard per flush by the idle-key collector.
pub(super) const GC_STEP: usize = 512;

#[derive(Default)]
pub(super) struct Shard {
    /// The tracked keys' slots, inline in an open-addressed table keyed by their id.
    pub(super) table: Table,
    /// Table positions to send at a coming flush (each at most once: [`QUEUED`]). Valid
    /// whenever the lock is released: slots move only when the table rehashes, which
    /// rebuilds this list.
    pub(super) dirty: Vec<u32>,
    /// CLOCK hand (a table position).
    pub(super) hand: usize,
    /// Idle-key collector cursor (a table position).
    pub(super) gc_cursor: usize,
    /// Ghosts of evicted keys (empty until the first eviction).
    pub(super) ghosts: Vec<Ghost>,
    /// Window of the last eviction, if any.
    pub(super) evicted_win: Option<u64>,
}

impl Shard {
    /// CLOCK victim: the first live slot at or after the hand that is dead or has no
    /// reference left; slots passed over lose one reference. Keys hit repeatedly survive a
    /// flood of one-shot keys, which have no reference at all. Keys at or near their limit
    /// ([`Slot::near_limit`]) are passed over without losing a reference: they are evicted
    /// only when every live slot of the shard is near its limit (an attacker needs half a
    /// limit of admitted requests per such slot). `None` only when no key is tracked.
    pub(super) fn victim(&mut self, w: u64, wms: u64, e: u64) -> Option<usize> {
        let live = self.table.len();
        let slots = self.table.slots_mut();
        let n = slots.len();
        if live == 0 {
            return None;
        }
        // Every live slot loses a reference per pass, so 1 + MAX_REFS passes always find one.
        for protect in [true, false] {
            let mut protected_run = 0;
            for _ in 0..(n * (usize::from(MAX_REFS) + 1) + 1) {
                if self.hand >= n {
                    self.hand = 0;
                }
                let i = self.hand;
                self.hand += 1;
                let s = &mut slots[i];
                if !s.is_live() {
                    continue;
                }
                if s.is_dead(w) {
                    return Some(i);
                }
                if protect && s.near_limit(w, wms, e) {
                    protected_run += 1;
                    if protected_run >= live {
                        break; // all near their limit: plain CLOCK
                    }
                    continue;
                }
                protected_run = 0;
                if s.refs == 0 {
                    return Some(i);
                }
                s.refs -= 1;
            }
        }
        // Not reached (the second pass always finds one); any live slot will do.
        slots.iter().position(Slot::is_live)
    }

    /// Takes the ghost of key `id`, if one is still alive at window `w`.
    pub(super) fn take_ghost(&mut self, id: u64, w: u64) -> Option<Ghost> {
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
    pub(super) fn bury(&mut self, i: usize, w: u64, wms: u64, e: u64, cap: usize) -> bool {
        let Some(s) = self.table.slots().get(i) else {
            return true;
        };
        if !s.is_live() || s.is_dead(w) {
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

    /// The position of the slot of key `id`, if tracked.
    #[inline]
    pub(super) fn find(&self, id: u64) -> Option<usize> {
        self.table.find(id)
    }

    /// Queues the slot at position `i` for a coming flush (once).
    #[inline]
    pub(super) fn queue(&mut self, i: usize) {
        if let Some(s) = self.table.slots_mut().get_mut(i) {
            if !s.queued() {
                s.flags |= QUEUED;
                self.dirty.push(i as u32);
            }
        }
    }
}

/// One step of the idle-key collector (and, after a reload that lowered the cap, eviction
/// down to it). Removals leave tombstones (nothing moves); when tombstones fill an eighth of
/// the table it is rehashed, which rebuilds the dirty list.
pub(super) fn gc_step(sh: &mut Shard, w: u64, wms: u64, e: u64, cap: usize) {
    // Over the cap after a reload that lowered it: evict down to it.
    while sh.table.len() > cap {
        let Some(i) = sh.victim(w, wms, e) else {
            break;
        };
        sh.bury(i, w, wms, e, cap);
        sh.evicted_win = Some(w);
        sh.table.remove(i);
    }
    let n = sh.table.capacity();
    for _ in 0..GC_STEP.min(n) {
        if sh.gc_cursor >= n {
            sh.gc_cursor = 0;
        }
        let i = sh.gc_cursor;
        sh.gc_cursor += 1;
        if sh.table.slots()[i].is_live() && sh.table.slots()[i].is_dead(w) {
            sh.table.remove(i);
        }
    }
    sh.table.purge_tombs(&mut sh.dirty);
}

#[inline]
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Approximate memory per tracked key: the slot and its stable hash in the table at its
/// maximum load (7/8; down to half that load right after the table doubled), a dirty-list
/// entry and the ghost entry (one per slot of the cap once the shard evicts).
pub fn approx_bytes_per_key() -> usize {
    let table =
        (std::mem::size_of::<Slot>() + std::mem::size_of::<u128>()) * MAX_LOAD_DEN / MAX_LOAD_NUM;
    table + std::mem::size_of::<Ghost>() + std::mem::size_of::<u32>()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::table::empty_slot;
    use super::*;

    const WMS: u64 = 60_000;
    const W: u64 = 10;

    /// A live slot for `id` in window [`W`], limit 100, with `cur` admissions.
    fn slot(id: u64, cur: u32) -> Slot {
        Slot {
            id,
            win: W,
            limit: 100,
            l_cur: cur,
            ..empty_slot()
        }
    }

    /// Every queued slot's position (live or tombstone) is in the dirty list, once.
    fn check_dirty(sh: &Shard) {
        let mut got = sh.dirty.clone();
        got.sort_unstable();
        let n = got.len();
        got.dedup();
        assert_eq!(got.len(), n, "a position queued twice");
        let want: Vec<u32> = (0..sh.table.capacity())
            .filter(|&i| sh.table.slots()[i].queued())
            .map(|i| i as u32)
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn eviction_when_full() {
        let mut sh = Shard::default();
        let cap = 7; // a full table of 8 positions
        for id in 1..=cap as u64 {
            // Key 1 is near its limit; key 2 is queued.
            let i = sh
                .table
                .insert(slot(id, if id == 1 { 60 } else { 1 }), 0, &mut sh.dirty);
            if id == 2 {
                sh.queue(i);
            }
        }
        assert_eq!(sh.table.capacity(), 8);
        check_dirty(&sh);
        // A flood of new keys through the full shard, as `Limiter::insert` does it.
        for n in 0..200u64 {
            assert_eq!(sh.table.len(), cap);
            let i = sh.victim(W, WMS, 0).unwrap();
            assert!(sh.table.slots()[i].is_live());
            assert_ne!(
                sh.table.slots()[i].id,
                1,
                "the key near its limit was evicted"
            );
            sh.bury(i, W, WMS, 0, cap);
            sh.table.remove(i);
            let j = sh.table.insert(slot(1_000 + n, 1), 0, &mut sh.dirty);
            if n % 5 == 0 {
                sh.queue(j);
            }
            check_dirty(&sh);
            assert_eq!(sh.table.capacity(), 8, "grew past the cap");
        }
        assert!(sh.find(1).is_some());
        // Evicted keys left ghosts (their counts matter).
        assert!(sh.ghosts.iter().any(|g| g.used));
        // When every key is near its limit, one is evicted all the same.
        for s in sh.table.slots_mut().iter_mut().filter(|s| s.is_live()) {
            s.l_cur = 90;
        }
        assert!(sh.victim(W, WMS, 0).is_some());
    }

    #[test]
    fn the_collector_frees_dead_keys_and_purges_tombstones() {
        let mut sh = Shard::default();
        for id in 1..=100u64 {
            let mut s = slot(id.wrapping_mul(0x9e37_79b9_7f4a_7c15), 1);
            if id % 2 == 0 {
                s.win = W + 2;
            }
            sh.table.insert(s, 0, &mut sh.dirty);
        }
        // Two windows later the odd keys are dead.
        gc_step(&mut sh, W + 2, WMS, 0, 1_000);
        assert_eq!(sh.table.len(), 50);
        assert_eq!(sh.table.tombs(), 0, "tombstones not purged");
        for id in 1..=100u64 {
            let found = sh.find(id.wrapping_mul(0x9e37_79b9_7f4a_7c15)).is_some();
            assert_eq!(found, id % 2 == 0, "key {id}");
        }
        // A lowered cap: evicted down to it.
        gc_step(&mut sh, W + 2, WMS, 0, 10);
        assert_eq!(sh.table.len(), 10);
        check_dirty(&sh);
    }
}
