//! Combinatorial shuffle sharding: each hash-key value gets a stable set of
//! `k` of the `n` backends. The set is the top `k` by rendezvous score
//! (`hash(value, backend)`), so two values share all `k` backends only with
//! probability 1 / C(n, k), every instance computes the same shard without
//! coordination, and a backend leaving changes only the shards it was in.

/// Fill `out` with the indices (into `ids`) of the shard of `key_hash`,
/// highest score first. `ids` are stable per-backend hashes (of the address).
pub fn shard_of(key_hash: u64, ids: &[u64], k: usize, out: &mut Vec<usize>) {
    out.clear();
    let k = k.min(ids.len());
    if k == 0 {
        return;
    }
    // Keep the k best in `out` (k is small: insertion into a sorted list).
    let score = |i: usize| super::mix(key_hash ^ ids[i]);
    for i in 0..ids.len() {
        let s = score(i);
        let pos = out.iter().position(|&j| s > score(j)).unwrap_or(out.len());
        if pos < k {
            out.insert(pos, i);
            out.truncate(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::stable_hash;

    fn ids(n: usize) -> Vec<u64> {
        (0..n)
            .map(|i| stable_hash(&[format!("10.0.0.{i}:80").as_bytes()]))
            .collect()
    }

    #[test]
    fn shard_is_stable_and_of_size_k() {
        let ids = ids(8);
        let mut a = Vec::new();
        let mut b = Vec::new();
        shard_of(stable_hash(&[b"key-1"]), &ids, 2, &mut a);
        shard_of(stable_hash(&[b"key-1"]), &ids, 2, &mut b);
        assert_eq!(a, b);
        assert_eq!(a.len(), 2);
        assert_ne!(a[0], a[1]);
        shard_of(1, &ids, 20, &mut a);
        assert_eq!(a.len(), 8);
    }

    #[test]
    fn shards_spread_over_combinations() {
        let ids = ids(8);
        let mut seen = std::collections::HashSet::new();
        let mut per_backend = [0u32; 8];
        let mut out = Vec::new();
        for k in 0..2000u32 {
            shard_of(stable_hash(&[&k.to_le_bytes()]), &ids, 2, &mut out);
            let mut s = out.clone();
            s.sort_unstable();
            for &i in &s {
                per_backend[i] += 1;
            }
            seen.insert(s);
        }
        // C(8,2) = 28 possible shards: nearly all are used.
        assert!(seen.len() >= 26, "{}", seen.len());
        for c in per_backend {
            assert!((350..650).contains(&c), "{per_backend:?}");
        }
    }

    #[test]
    fn removing_a_backend_changes_only_its_shards() {
        let all = ids(6);
        let fewer: Vec<u64> = all.iter().copied().filter(|&x| x != all[2]).collect();
        let mut a = Vec::new();
        let mut b = Vec::new();
        for k in 0..500u32 {
            let h = stable_hash(&[&k.to_le_bytes()]);
            shard_of(h, &all, 3, &mut a);
            shard_of(h, &fewer, 3, &mut b);
            let a_ids: Vec<u64> = a.iter().map(|&i| all[i]).collect();
            let b_ids: Vec<u64> = b.iter().map(|&i| fewer[i]).collect();
            if !a_ids.contains(&all[2]) {
                assert_eq!(a_ids, b_ids);
            }
        }
    }
}
