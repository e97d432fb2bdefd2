//! portcullis's shared-state layer: everything the fleet shares goes through here.
//!
//! * [`RedisClient`] owns every Redis connection of the process (standalone, cluster or
//!   sentinel, TLS, AUTH: [`Endpoint`]): timeouts, reconnect backoff, the key prefix. It is
//!   built once by the app and handed to the rate limiter's flusher, to culling and to the
//!   watchdog.
//! * One trait per need, each defined by the policy crate beside the values it carries,
//!   each implemented twice, in Redis and in process, with the same semantics:
//!
//!   | need | trait | Redis | in process |
//!   |---|---|---|---|
//!   | rate-limit counters | [`CounterStore`] | [`RedisStore`] | [`LocalStore`] |
//!   | culling's disruption budget | [`BudgetStore`] | [`RedisBudget`] | [`LocalBudget`] |
//!   | a plain fleet token bucket | [`FleetBucket`] | [`RedisBucket`] | [`LocalBucket`] |
//!
//!   Callers hold `Arc<dyn Trait>`; [`Store`] builds the right twin. One conformance table
//!   per need (`conformance_tests.rs`) runs the same cases against both twins, the Redis one
//!   on a real `redis-server`. ([`LocalStore`] lives in the policy crate, whose limiter
//!   tests use it; it is re-exported here.)
//! * [`StoreError`] is the one error type; [`clock`] the one wall clock.
//! * [`bucket`] holds the token-bucket arithmetic, in Rust and in Lua.

pub mod bucket;
pub mod budget;
pub mod clock;
pub mod counter;
mod endpoint;
pub mod probes;
pub mod ramp;
mod redis;
pub mod tenants;
pub mod traffic;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod claims_conformance_tests;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod cluster_tests;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod conformance_tests;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod ops_conformance_tests;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod probes_conformance_tests;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod ramp_conformance_tests;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod traffic_conformance_tests;

use std::sync::Arc;
use std::time::Duration;

pub use self::redis::{RedisClient, StoreConn, CLUSTER_SLOTS};
pub use bucket::{LocalBucket, RedisBucket};
pub use budget::{LocalBudget, RedisBudget};
pub use counter::RedisStore;
pub use endpoint::{probe, probe_blocking, Endpoint, Mode};
pub use portcullis_policy::bucket::{FleetBucket, Take};
pub use portcullis_policy::cull::BudgetStore;
pub use portcullis_policy::health::shared::ProbeStore;
pub use portcullis_policy::ratelimit::{CounterStore, LocalStore};
pub use portcullis_policy::StoreError;
pub use probes::{LocalProbes, RedisProbes};
pub use ramp::{LocalRamp, RedisRamp};
pub use traffic::{LocalTraffic, RedisTraffic};

/// Where the fleet's shared state lives.
#[derive(Debug, Clone)]
pub enum Store {
    /// Shared through Redis by every instance with the same key prefix.
    Redis(Arc<RedisClient>),
    /// In this process only (no `[redis]` section).
    Local,
}

impl Store {
    /// A Redis store (connects lazily; fails only on an invalid URL).
    pub fn redis(url: &str, key_prefix: &str, timeout: Duration) -> Result<Self, StoreError> {
        Ok(Store::Redis(Arc::new(RedisClient::new(
            url, key_prefix, timeout,
        )?)))
    }

    /// A Redis store of any mode (connects lazily; fails only on invalid settings).
    pub fn with_endpoint(
        endpoint: &Endpoint,
        key_prefix: &str,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        Ok(Store::Redis(Arc::new(RedisClient::with_endpoint(
            endpoint, key_prefix, timeout,
        )?)))
    }

    /// `"redis"` or `"local"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Redis(_) => "redis",
            Store::Local => "local",
        }
    }

    /// The rate limiter's counter store on this store.
    pub fn counter_store(&self) -> Arc<dyn CounterStore> {
        match self {
            Store::Redis(client) => Arc::new(RedisStore::new(Arc::clone(client))),
            Store::Local => Arc::new(LocalStore::new()),
        }
    }

    /// Culling's disruption budget on this store.
    pub fn budget(&self) -> Arc<dyn BudgetStore> {
        match self {
            Store::Redis(client) => Arc::new(RedisBudget::new(Arc::clone(client))),
            Store::Local => Arc::new(LocalBudget::new()),
        }
    }

    /// The fleet's traffic counts (caps as fleet totals).
    pub fn traffic(&self) -> Arc<dyn portcullis_policy::fleet_cap::TrafficStore> {
        match self {
            Store::Redis(client) => Arc::new(RedisTraffic::new(Arc::clone(client))),
            Store::Local => Arc::new(LocalTraffic::default()),
        }
    }

    /// The fleet's slow-start ramp starts.
    pub fn ramp(&self) -> Arc<dyn portcullis_policy::balance::slow_start::RampStore> {
        match self {
            Store::Redis(client) => Arc::new(RedisRamp::new(Arc::clone(client))),
            Store::Local => Arc::new(LocalRamp::default()),
        }
    }

    /// Shared probing's leases and verdicts on this store.
    pub fn probes(&self) -> Arc<dyn ProbeStore> {
        match self {
            Store::Redis(client) => Arc::new(RedisProbes::new(Arc::clone(client))),
            Store::Local => Arc::new(LocalProbes::default()),
        }
    }

    /// The token bucket `name` on this store (its own keyspace `<prefix>-<name>` in Redis).
    pub fn bucket(&self, name: &str) -> Arc<dyn FleetBucket> {
        match self {
            Store::Redis(client) => Arc::new(RedisBucket::new(Arc::clone(client), name)),
            Store::Local => Arc::new(LocalBucket::default()),
        }
    }
}

/// A Redis client error as the store's one error type: a timeout, a lost or refused
/// connection, or a command the server rejected.
pub fn from_redis(e: ::redis::RedisError) -> StoreError {
    if e.is_timeout() {
        StoreError::Timeout
    } else if e.is_connection_refusal() || e.is_connection_dropped() || e.is_io_error() {
        StoreError::Connect(e.to_string())
    } else {
        StoreError::Command(e.to_string())
    }
}

/// Whether `url` is a Redis URL the client accepts (`redis[s]://[user:password@]host:port[/db]`),
/// parsed only: no client is made and nothing is connected, so validating a config needs no
/// Redis. The error is the client's reason.
pub fn check_url(url: &str) -> Result<(), String> {
    use ::redis::IntoConnectionInfo;
    url.into_connection_info()
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod url_tests {
    #[test]
    fn urls_are_parsed_not_connected() {
        assert!(super::check_url("redis://127.0.0.1:1").is_ok());
        assert!(super::check_url("rediss://user:pw@example.invalid:6380/2").is_ok());
        assert!(super::check_url("http://127.0.0.1:6379").is_err());
        assert!(super::check_url("redis://").is_err());
    }
}
