//! Stable (cross-process, cross-version) hashing of API keys.
//!
//! The raw API key never leaves the process: Redis only ever sees the 128-bit FNV-1a hash of
//! it, in hex. FNV-1a is not cryptographic; API keys are expected to be high-entropy secrets,
//! so the hash cannot be inverted by brute force in practice, and an attacker who does not know
//! a victim's key cannot aim a collision at it.

const FNV128_OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const FNV128_PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

/// 128-bit FNV-1a of the bytes of `key`; identical in every instance and every build. Keys
/// are bytes: two keys that differ in any byte (valid UTF-8 or not) hash differently, and a
/// UTF-8 key hashes as its bytes, so the Redis keys of UTF-8 API keys are unchanged.
pub fn stable_hash(key: impl AsRef<[u8]>) -> u128 {
    let mut h = FNV128_OFFSET;
    for b in key.as_ref() {
        h ^= u128::from(*b);
        h = h.wrapping_mul(FNV128_PRIME);
    }
    h
}

/// 128-bit FNV-1a of `namespace` followed by `key` (without concatenating them): the
/// store hash of a key of a named rate-limit policy.
pub fn stable_hash_in(namespace: &[u8], key: &[u8]) -> u128 {
    let mut h = FNV128_OFFSET;
    for b in namespace.iter().chain(key) {
        h ^= u128::from(*b);
        h = h.wrapping_mul(FNV128_PRIME);
    }
    h
}

/// Lower-case hex of a stable hash (32 characters).
pub fn hash_hex(h: u128) -> String {
    format!("{h:032x}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_distinct() {
        // Known FNV-1a 128 value of the empty string is the offset basis.
        assert_eq!(stable_hash(""), FNV128_OFFSET);
        assert_eq!(
            hash_hex(stable_hash("a")),
            "d228cb696f1a8caf78912b704e4a8964"
        );
        assert_ne!(stable_hash("key-1"), stable_hash("key-2"));
        assert_eq!(hash_hex(stable_hash("x")).len(), 32);
        // Bytes, not text: invalid UTF-8 keys stay distinct, and a UTF-8 key hashes as its
        // bytes.
        assert_ne!(stable_hash(b"a\xff"), stable_hash(b"a\xfe"));
        assert_eq!(stable_hash("a"), stable_hash(b"a"));
        assert_eq!(stable_hash_in(b"ns:", b"k"), stable_hash("ns:k"));
    }
}
