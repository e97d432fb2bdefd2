//! The sharded key cache: [`SHARDS`] mutex-protected shards, each a vector of slots with
//! an identity-hashed index, a dirty list for the flusher, CLOCK eviction that spares keys
//! near their limit, ghosts of evicted keys and an incremental idle-key collector.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard};

use super::slot::{Ghost, Slot, QUEUED, SHARED};

/// Number of shards (a power of two; the top bits of the key's hash select the shard).
pub const SHARDS: usize = 64;
pub(super) const SHARD_BITS: u32 = SHARDS.trailing_zeros();
/// Saturation of the per-key reference counter of the CLOCK eviction.
pub(super) const MAX_REFS: u8 = 3;
/// Slots examined per shard per flush by the idle-key collector.
pub(super) const GC_STEP: usize = 512;

/// Identity hasher for keys that already are uniformly distributed 64-bit hashes.
#[derive(Default)]
pub(super) struct IdHasher(u64);

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

pub(super) type IdMap = HashMap<u64, u32, BuildHasherDefault<IdHasher>>;

#[derive(Default)]
pub(super) struct Shard {
    pub(super) index: IdMap,
    pub(super) slots: Vec<Slot>,
    /// Stable hash of each slot's key (same positions as `slots`).
    pub(super) hashes: Vec<u128>,
    /// Slot indexes to send at a coming flush (each at most once: [`QUEUED`]).
    pub(super) dirty: Vec<u32>,
    /// CLOCK hand.
    pub(super) hand: usize,
    /// Idle-key collector cursor.
    pub(super) gc_cursor: usize,
    /// Ghosts of evicted keys (empty until the first eviction).
    pub(super) ghosts: Vec<Ghost>,
    /// Window of the last eviction, if any.
    pub(super) evicted_win: Option<u64>,
}

impl Shard {
    /// CLOCK victim: the first slot at or after the hand that is dead or has no reference
    /// left; slots passed over lose one reference. Keys hit repeatedly survive a flood of
    /// one-shot keys, which have no reference at all. Keys at or near their limit
    /// ([`Slot::near_limit`]) are passed over without losing a reference: they are evicted
    /// only when every live slot of the shard is near its limit (an attacker needs half a
    /// limit of admitted requests per such slot).
    pub(super) fn victim(&mut self, w: u64, wms: u64, e: u64) -> usize {
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
    pub(super) fn remove_at(&mut self, i: usize) {
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
    pub(super) fn queue(&mut self, i: usize) {
        if !self.slots[i].queued() {
            self.slots[i].flags |= QUEUED;
            self.dirty.push(i as u32);
        }
    }
}

pub(super) fn gc_step(sh: &mut Shard, w: u64, wms: u64, e: u64, cap: usize) {
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

#[inline]
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
