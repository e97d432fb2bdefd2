//! Upstream balancing (CONTRACT §10): how a request picks its backend, when it
//! may try another, and which backends a hash key may reach.
//!
//! Policy only, no sockets: [`select`] (smooth weighted round robin, power of
//! two choices), [`shard`] (combinatorial shuffle shards), [`retry_budget`]
//! (Envoy's retry budget) and [`key`] (the request's hash key). The pool in
//! [`crate::upstream`] wires them to Pingora's backend sets; consistent
//! hashing and random use `pingora-load-balancing`'s Ketama and random
//! selectors (see [`crate::upstream`] for where its algorithms did not fit).

pub mod key;

pub mod selector;

use std::time::Duration;

/// `upstreams[].balance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Smooth weighted round robin (plain round robin without `weights`).
    #[default]
    RoundRobin,
    /// The less loaded of two random eligible backends.
    LeastRequests,
    /// Ketama ring on the request's `hash_key`.
    ConsistentHash,
    Random,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round_robin",
            Policy::LeastRequests => "least_requests",
            Policy::ConsistentHash => "consistent_hash",
            Policy::Random => "random",
        }
    }
}

/// `upstreams[].hash_key`: what consistent hashing and shuffle sharding hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    Header(http::HeaderName),
    Query(String),
    Bearer,
    ClientIp,
    Path,
}

/// The balancing settings of one upstream.
#[derive(Debug, Clone, PartialEq)]
pub struct BalanceSettings {
    pub policy: Policy,
    pub hash_key: HashKey,
    /// One weight per configured backend entry; empty = all 1.
    pub weights: Vec<u32>,
    /// Retries on another backend after a 502/503/reset (idempotent requests).
    pub retries: u32,
    /// Retries stay under this share of the upstream's recent requests.
    pub retry_budget_ratio: f64,
    /// Per-upstream in-flight cap (bulkhead); 0 = none. With `adaptive`, the ceiling of
    /// the learned cap.
    pub max_inflight: u64,
    /// The upstream learns its cap from its own latency (CONTRACT §15).
    pub adaptive: bool,
    /// How often backends given as hostnames are re-resolved.
    pub resolve_interval: Duration,
    /// > 0: each hash-key value is served by this many backends.
    pub shard_size: usize,
    /// A backend that comes back ramps its weight and `max_conn` over this time.
    pub slow_start: Duration,
    /// Above 0: a request that finds no backend with room (or the bulkhead full) waits
    /// this long for one.
    pub queue_timeout: Duration,
    /// Requests waiting for this upstream at most; 0 = derived (see the config key).
    pub max_queue: u64,
    /// Above 0: `max_inflight` for the whole fleet (each instance takes its traffic's
    /// share).
    pub fleet_max_inflight: u64,
}

impl Default for BalanceSettings {
    fn default() -> Self {
        Self {
            policy: Policy::RoundRobin,
            hash_key: HashKey::Header(http::HeaderName::from_static("x-api-key")),
            weights: Vec::new(),
            retries: 1,
            retry_budget_ratio: 0.2,
            max_inflight: 0,
            adaptive: false,
            resolve_interval: Duration::from_secs(30),
            shard_size: 0,
            slow_start: Duration::ZERO,
            queue_timeout: Duration::ZERO,
            max_queue: 0,
            fleet_max_inflight: 0,
        }
    }
}

impl BalanceSettings {
    /// Whether requests need their hash key computed.
    pub fn needs_key(&self) -> bool {
        self.policy == Policy::ConsistentHash || self.shard_size > 0
    }
}

pub use portcullis_policy::balance::{mix, retry_budget, select, shard, stable_hash};
