//! Balancing policy (CONTRACT §10): smooth weighted round robin and power of two choices
//! ([`select`]), combinatorial shuffle shards ([`shard`]) and Envoy's retry budget
//! ([`retry_budget`]). No sockets: the app's upstream pool wires them to its backends.

pub mod retry_budget;
pub mod select;
pub mod shard;
pub mod slow_start;

/// A stable 64-bit hash (FNV-1a then a finaliser): the same on every instance
/// and every restart, so shards and rings agree across the fleet.
pub fn stable_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix(h)
}

/// splitmix64's finaliser: spreads FNV's weak low bits.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
