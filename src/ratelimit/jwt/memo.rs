//! What the verifier remembers between requests, each bounded and sharded: the tokens that
//! verified ([`Cache`]), the refused tokens' hashes ([`Refused`]) and the failures per client
//! address ([`Failures`]).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use super::{
    Claims, Invalid, ADDRESSES_PER_SHARD, CACHE_PER_SHARD, CACHE_SHARDS, FAILURE_WINDOW_SECS,
    MAX_FAILURES_PER_ADDRESS, REFUSED_PER_SHARD, REFUSED_TTL_SECS,
};

/// Tokens that verified, whole, with their claims, until `exp` + leeway: sharded by a
/// keyed hash of the token, at most [`CACHE_PER_SHARD`] per shard (a full shard first drops
/// its expired entries, then all of them).
pub(super) struct Cache {
    pub(super) hasher: RandomState,
    pub(super) shards: [Mutex<HashMap<Box<[u8]>, Entry>>; CACHE_SHARDS],
}

pub(super) struct Entry {
    /// Unix seconds from which the token is expired.
    until: u64,
    claims: Arc<Claims>,
}

impl Cache {
    pub(super) fn new() -> Self {
        Self {
            hasher: RandomState::new(),
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        }
    }

    fn shard(&self, token: &[u8]) -> std::sync::MutexGuard<'_, HashMap<Box<[u8]>, Entry>> {
        let i = (self.hasher.hash_one(token) % CACHE_SHARDS as u64) as usize;
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn get(&self, token: &[u8], now: u64) -> Option<Arc<Claims>> {
        let mut shard = self.shard(token);
        match shard.get(token) {
            Some(e) if now < e.until => Some(Arc::clone(&e.claims)),
            Some(_) => {
                shard.remove(token);
                None
            }
            None => None,
        }
    }

    pub(super) fn put(&self, token: &[u8], until: u64, claims: Arc<Claims>, now: u64) {
        let mut shard = self.shard(token);
        if shard.len() >= CACHE_PER_SHARD {
            shard.retain(|_, e| now < e.until);
            if shard.len() >= CACHE_PER_SHARD {
                shard.clear();
            }
        }
        shard.insert(token.into(), Entry { until, claims });
    }

    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}

/// Tokens refused lately: a keyed 64-bit hash of each (the positive cache's hasher, whose
/// key is random per process, so no client can aim at a collision) with the reason, until
/// [`REFUSED_TTL_SECS`] after the refusal; at most [`REFUSED_PER_SHARD`] per shard (a full
/// shard first drops its expired entries, then all of them). It only refuses: a collision
/// with a valid token could at worst refuse that token for the TTL, never admit a token.
pub(super) struct Refused {
    pub(super) shards: [Mutex<HashMap<u64, (u64, Invalid)>>; CACHE_SHARDS],
}

impl Refused {
    pub(super) fn new() -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        }
    }

    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, HashMap<u64, (u64, Invalid)>> {
        // The low bits pick the positive cache's shard; these are independent of them.
        let i = ((hash >> 32) % CACHE_SHARDS as u64) as usize;
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn get(&self, hash: u64, now: u64) -> Option<Invalid> {
        let mut shard = self.shard(hash);
        match shard.get(&hash) {
            Some(&(until, reason)) if now < until => Some(reason),
            Some(_) => {
                shard.remove(&hash);
                None
            }
            None => None,
        }
    }

    pub(super) fn put(&self, hash: u64, reason: Invalid, now: u64) {
        let mut shard = self.shard(hash);
        if shard.len() >= REFUSED_PER_SHARD {
            shard.retain(|_, (until, _)| now < *until);
            if shard.len() >= REFUSED_PER_SHARD {
                shard.clear();
            }
        }
        shard.insert(hash, (now.saturating_add(REFUSED_TTL_SECS), reason));
    }

    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}

/// Tokens that failed their check, by client address (an IPv6 address by its /64, which
/// one client commonly holds whole), in fixed windows of [`FAILURE_WINDOW_SECS`]. At most
/// [`ADDRESSES_PER_SHARD`] addresses per shard: a full shard drops the addresses whose
/// window has ended, and while still full tracks no new one (an address already over the
/// limit stays over it until its window ends).
pub(super) struct Failures {
    pub(super) hasher: RandomState,
    pub(super) shards: [Mutex<HashMap<u128, Window>>; CACHE_SHARDS],
}

#[derive(Clone, Copy)]
pub(super) struct Window {
    start: u64,
    failures: u32,
}

impl Window {
    fn current(&self, now: u64) -> bool {
        now < self.start.saturating_add(FAILURE_WINDOW_SECS)
    }
}

impl Failures {
    pub(super) fn new() -> Self {
        Self {
            hasher: RandomState::new(),
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        }
    }

    /// The address as counted: IPv4 whole (as its mapped IPv6 form), IPv6 by its /64.
    fn key(ip: IpAddr) -> u128 {
        match ip {
            IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => u128::from(v4.to_ipv6_mapped()),
                None => u128::from(v6) & !((1u128 << 64) - 1),
            },
        }
    }

    fn shard(&self, key: u128) -> std::sync::MutexGuard<'_, HashMap<u128, Window>> {
        let i = (self.hasher.hash_one(key) % CACHE_SHARDS as u64) as usize;
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `ip` has had [`MAX_FAILURES_PER_ADDRESS`] failures in its current window.
    pub(super) fn over(&self, ip: IpAddr, now: u64) -> bool {
        let key = Self::key(ip);
        let shard = self.shard(key);
        shard
            .get(&key)
            .is_some_and(|w| w.current(now) && w.failures >= MAX_FAILURES_PER_ADDRESS)
    }

    /// One more failure from `ip`.
    pub(super) fn add(&self, ip: IpAddr, now: u64) {
        let key = Self::key(ip);
        let mut shard = self.shard(key);
        if let Some(w) = shard.get_mut(&key) {
            if w.current(now) {
                w.failures = w.failures.saturating_add(1);
            } else {
                *w = Window {
                    start: now,
                    failures: 1,
                };
            }
            return;
        }
        if shard.len() >= ADDRESSES_PER_SHARD {
            shard.retain(|_, w| w.current(now));
            if shard.len() >= ADDRESSES_PER_SHARD {
                return;
            }
        }
        shard.insert(
            key,
            Window {
                start: now,
                failures: 1,
            },
        );
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}
