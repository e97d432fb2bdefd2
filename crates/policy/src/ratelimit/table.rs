//! One shard's key table: the [`Slot`]s stored inline in an open-addressed hash table
//! (power-of-two capacity, linear probing on the key's process-local id, which the slot
//! already holds), so that deciding for a tracked key reads one 64-byte line (plus the next
//! one when it is not at its home position) instead of an index bucket and then the slot.
//!
//! * Empty positions hold [`EMPTY`] as id; ids are remapped by [`key_id`] so no key has it.
//! * Removal leaves a tombstone ([`TOMB`]) instead of moving the slots after it (backward
//!   shift): positions are held across removals (the shard's dirty list, the CLOCK hand,
//!   the idle-key collector's cursor), so slots move only in [`Table::rehash`], which
//!   rebuilds the dirty list from the slots' [`QUEUED`] flags. A tombstone keeps the
//!   removed slot's `QUEUED` flag (its position may be in the dirty list) and hands it on to
//!   the slot that reuses the position, so a position is in the dirty list at most once
//!   and every queued slot is in it (the flush drops positions whose slot is not shared).
//! * Live slots plus tombstones stay at most [`MAX_LOAD_NUM`]/[`MAX_LOAD_DEN`] of the
//!   capacity: an insertion beyond it doubles the table (more live slots) or rehashes it
//!   at the same size (mostly tombstones). So there is always an empty position and every
//!   probe ends.

use super::slot::{Slot, QUEUED};

/// Id of an empty position.
pub(super) const EMPTY: u64 = 0;
/// Id of a removed slot's position (a tombstone): probes go on past it.
pub(super) const TOMB: u64 = u64::MAX;
/// Smallest non-zero capacity.
pub(super) const MIN_CAPACITY: usize = 8;
/// Maximum load (live slots plus tombstones) of the table: 7/8.
pub(super) const MAX_LOAD_NUM: usize = 7;
pub(super) const MAX_LOAD_DEN: usize = 8;

/// The table id of a key whose process-local hash is `h`: `h`, except that the two
/// sentinels [`EMPTY`] and [`TOMB`] become their neighbours (the top bits, which select the
/// shard, are unchanged).
#[inline]
pub(super) fn key_id(h: u64) -> u64 {
    h.clamp(EMPTY + 1, TOMB - 1)
}

/// Positions that a table of `capacity` may fill (live slots plus tombstones).
fn max_load(capacity: usize) -> usize {
    capacity / MAX_LOAD_DEN * MAX_LOAD_NUM
}

/// An empty position.
pub(super) const fn empty_slot() -> Slot {
    Slot {
        id: EMPTY,
        win: 0,
        g_prev: 0,
        g_cur: 0,
        l_prev: 0,
        l_cur: 0,
        p_prev: 0,
        p_cur: 0,
        est: 0,
        blocked_until: 0,
        limit: 0,
        generation: 0,
        refs: 0,
        flags: 0,
    }
}

impl Slot {
    /// Whether this position holds a tracked key (not empty, not a tombstone).
    #[inline]
    pub(super) fn is_live(&self) -> bool {
        self.id != EMPTY && self.id != TOMB
    }
}

/// Open-addressed table of slots (see the module doc).
#[derive(Default)]
pub(super) struct Table {
    /// The positions: 0 or a power of two of them.
    slots: Vec<Slot>,
    /// Stable hash of each live slot's key, for the store (same positions as `slots`; read
    /// only when flushing, so it stays off the decision's cache lines).
    hashes: Vec<u128>,
    /// Live slots.
    len: usize,
    /// Tombstones.
    tombs: usize,
}

impl Table {
    /// Live slots (tracked keys).
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Positions (live, empty or tombstones).
    #[inline]
    pub(super) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Tombstones.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) fn tombs(&self) -> usize {
        self.tombs
    }

    /// Every position; callers test [`Slot::is_live`]. Callers may change anything in a
    /// slot but its `id`.
    #[inline]
    pub(super) fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// As [`Table::slots`], mutable (the `id` must not be changed).
    #[inline]
    pub(super) fn slots_mut(&mut self) -> &mut [Slot] {
        &mut self.slots
    }

    /// The stable hash of the key at position `i` (0 for a position out of range).
    #[inline]
    pub(super) fn hash_at(&self, i: usize) -> u128 {
        self.hashes.get(i).copied().unwrap_or_default()
    }

    /// Home position of `id` in a table of `capacity` (a power of two). The low bits: the
    /// top ones select the shard.
    #[inline]
    fn home(id: u64, capacity: usize) -> usize {
        // Truncation intended: only the low bits are kept.
        (id as usize) & (capacity - 1)
    }

    /// Position of the live slot of `id`, if any.
    #[inline]
    pub(super) fn find(&self, id: u64) -> Option<usize> {
        let cap = self.slots.len();
        if cap == 0 {
            return None;
        }
        let mut i = Self::home(id, cap);
        // Bounded for safety: there is always an empty position (see `max_load`).
        for _ in 0..cap {
            let s = self.slots.get(i)?;
            if s.id == id {
                return Some(i);
            }
            if s.id == EMPTY {
                return None;
            }
            i = (i + 1) & (cap - 1);
        }
        None
    }

    /// Adds `slot` (a key not in the table, `slot.id` from [`key_id`]) with its stable
    /// `hash`; returns its position. May grow or rehash the table first: then `dirty` is
    /// rebuilt from the slots' [`QUEUED`] flags. The slot inherits the `QUEUED` flag of a
    /// tombstone it replaces.
    pub(super) fn insert(&mut self, mut slot: Slot, hash: u128, dirty: &mut Vec<u32>) -> usize {
        debug_assert!(slot.is_live() && self.find(slot.id).is_none());
        let cap = self.slots.len();
        if self.len + 1 > max_load(cap) {
            self.rehash((cap * 2).max(MIN_CAPACITY), dirty);
        } else if self.len + self.tombs + 1 > max_load(cap) {
            self.rehash(cap, dirty);
        }
        let cap = self.slots.len();
        let mut i = Self::home(slot.id, cap);
        // The first free position of the probe: the key is not further along it.
        while self.slots[i].is_live() {
            i = (i + 1) & (cap - 1);
        }
        let old = &self.slots[i];
        if old.id == TOMB {
            self.tombs -= 1;
            slot.flags |= old.flags & QUEUED;
        } else {
            slot.flags &= !QUEUED;
        }
        self.slots[i] = slot;
        self.hashes[i] = hash;
        self.len += 1;
        i
    }

    /// Removes the live slot at position `i`: leaves a tombstone with its [`QUEUED`] flag
    /// (the position may be in the dirty list). Nothing moves.
    pub(super) fn remove(&mut self, i: usize) {
        let Some(s) = self.slots.get_mut(i) else {
            return;
        };
        if !s.is_live() {
            return;
        }
        *s = Slot {
            id: TOMB,
            flags: s.flags & QUEUED,
            ..empty_slot()
        };
        self.hashes[i] = 0;
        self.len -= 1;
        self.tombs += 1;
    }

    /// Rehashes in place (same capacity, tombstones dropped) when tombstones fill an eighth
    /// of the table or more; `dirty` as for [`Table::rehash`].
    pub(super) fn purge_tombs(&mut self, dirty: &mut Vec<u32>) {
        if self.tombs > 0 && self.tombs >= self.slots.len() / 8 {
            self.rehash(self.slots.len(), dirty);
        }
    }

    /// Moves every live slot into a table of `capacity` positions (a power of two, large
    /// enough for them below the maximum load), dropping tombstones, and rebuilds `dirty`:
    /// the positions of the slots flagged [`QUEUED`] (a tombstone's flag goes with it: the
    /// flush would have dropped its position).
    pub(super) fn rehash(&mut self, capacity: usize, dirty: &mut Vec<u32>) {
        debug_assert!(capacity.is_power_of_two() && self.len < max_load(capacity).max(1));
        let old = std::mem::replace(&mut self.slots, vec![empty_slot(); capacity]);
        let old_hashes = std::mem::replace(&mut self.hashes, vec![0; capacity]);
        self.tombs = 0;
        dirty.clear();
        for (s, h) in old.into_iter().zip(old_hashes) {
            if !s.is_live() {
                continue;
            }
            let mut i = Self::home(s.id, capacity);
            while self.slots[i].id != EMPTY {
                i = (i + 1) & (capacity - 1);
            }
            if s.queued() {
                dirty.push(i as u32);
            }
            self.slots[i] = s;
            self.hashes[i] = h;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A live slot for `id`.
    fn slot(id: u64) -> Slot {
        Slot {
            id,
            win: 7,
            ..empty_slot()
        }
    }

    /// `n` ids sharing the home position `home` of a table of `cap` positions.
    fn colliding(home: u64, cap: u64, n: u64) -> Vec<u64> {
        (1..=n).map(|k| home + k * cap).collect()
    }

    /// Checks the table's invariants: counts, every live slot reachable from its home.
    fn check(t: &Table) {
        let live = t.slots.iter().filter(|s| s.is_live()).count();
        let tombs = t.slots.iter().filter(|s| s.id == TOMB).count();
        assert_eq!((t.len, t.tombs), (live, tombs));
        assert!(t.len + t.tombs <= max_load(t.capacity()));
        for (i, s) in t.slots.iter().enumerate() {
            if s.is_live() {
                assert_eq!(t.find(s.id), Some(i), "id {:x}", s.id);
            }
        }
    }

    #[test]
    fn key_ids_avoid_the_sentinels() {
        assert_eq!(key_id(EMPTY), 1);
        assert_eq!(key_id(TOMB), TOMB - 1);
        assert_eq!(key_id(12345), 12345);
        // The shard (top bits) is unchanged.
        assert_eq!(key_id(0) >> 58, 0);
        assert_eq!(key_id(u64::MAX) >> 58, u64::MAX >> 58);
    }

    #[test]
    fn probes_wrap_around_the_end() {
        let mut t = Table::default();
        let mut dirty = Vec::new();
        // Capacity 8 (up to 7 slots): three keys whose home is the last position.
        let ids = colliding(7, 8, 3);
        for (k, &id) in ids.iter().enumerate() {
            let i = t.insert(slot(id), u128::from(id), &mut dirty);
            assert_eq!(t.capacity(), 8);
            assert_eq!(i, (7 + k) % 8, "position of the {k}th");
        }
        for &id in &ids {
            let i = t.find(id).unwrap();
            assert_eq!(t.slots()[i].id, id);
            assert_eq!(t.hash_at(i), u128::from(id));
        }
        // A missing key with the same home: the probe wraps and ends at the empty position.
        assert_eq!(t.find(7 + 100 * 8), None);
        check(&t);
    }

    #[test]
    fn a_key_further_along_the_probe_survives_a_removal() {
        let mut t = Table::default();
        let mut dirty = Vec::new();
        let ids = colliding(6, 8, 4); // positions 6, 7, 0, 1
        for &id in &ids {
            t.insert(slot(id), 0, &mut dirty);
        }
        let first = t.find(ids[0]).unwrap();
        t.remove(first);
        assert_eq!(t.find(ids[0]), None);
        assert_eq!((t.len(), t.tombs()), (3, 1));
        for &id in &ids[1..] {
            assert!(t.find(id).is_some(), "{id} lost behind the tombstone");
        }
        // Remove one past the wrap as well; the last one is still found.
        t.remove(t.find(ids[2]).unwrap());
        assert!(t.find(ids[3]).is_some());
        // A new key with the same home reuses the first tombstone.
        let n = 6 + 50 * 8;
        assert_eq!(t.insert(slot(n), 0, &mut dirty), first);
        check(&t);
    }

    #[test]
    fn growth_keeps_queued_slots_in_the_dirty_list() {
        let mut t = Table::default();
        let mut dirty = Vec::new();
        let mut queued = Vec::new();
        for id in 1..=100u64 {
            let id = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let i = t.insert(slot(id), u128::from(id), &mut dirty);
            if id % 3 == 0 {
                // As `Shard::queue` does.
                t.slots_mut()[i].flags |= QUEUED;
                dirty.push(i as u32);
                queued.push(id);
            }
            // Whenever the lock would be released: the dirty list is exactly the queued
            // slots' positions.
            let mut want: Vec<u32> = t
                .slots()
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_live() && s.queued())
                .map(|(i, _)| i as u32)
                .collect();
            let mut got = dirty.clone();
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want);
        }
        assert_eq!(t.len(), 100);
        assert!(t.capacity() >= 128);
        for &id in &queued {
            let i = t.find(id).unwrap();
            assert!(t.slots()[i].queued());
            assert_eq!(t.hash_at(i), u128::from(id));
        }
        check(&t);
    }

    #[test]
    fn tombstones_keep_the_queued_flag_and_are_purged() {
        let mut t = Table::default();
        let mut dirty = Vec::new();
        let i = t.insert(slot(3), 0, &mut dirty);
        t.slots_mut()[i].flags |= QUEUED;
        dirty.push(i as u32);
        t.remove(i);
        // The position stays in the dirty list, flagged: no second entry for it later.
        assert!(t.slots()[i].queued() && !t.slots()[i].is_live());
        let j = t.insert(slot(3 + 8), 0, &mut dirty);
        assert_eq!(j, i);
        assert!(t.slots()[j].queued());
        assert_eq!(dirty, [i as u32]);
        // Removals and insertions at a steady size: rehashes keep the load bounded.
        for k in 0..1_000u64 {
            let id = 100 + k;
            t.insert(slot(id), 0, &mut dirty);
            t.remove(t.find(id).unwrap());
            check(&t);
        }
        assert_eq!(t.capacity(), 8);
        t.purge_tombs(&mut dirty);
        assert_eq!(t.tombs(), 0);
        assert_eq!(dirty, [t.find(3 + 8).unwrap() as u32]);
        check(&t);
    }
}
