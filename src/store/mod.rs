//! The shared-state layer: everything the fleet shares goes through here.
//!
//! * [`RedisClient`] owns every Redis connection of the process: timeouts,
//!   reconnect backoff, the key prefix. It is built once in `server.rs` and
//!   handed to the rate limiter's flusher, to culling and to the watchdog.
//! * Without `[redis]` each of them uses its in-process twin with the same
//!   semantics (`ratelimit::LocalStore`, `cull::LocalBudget`, [`LocalBucket`]).
//! * [`StoreError`] is the one error type; [`clock`] the one wall clock.
//! * [`bucket`] holds the token-bucket arithmetic, in Rust and in Lua.

pub mod bucket;
pub mod clock;
mod endpoint;
mod redis;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod cluster_tests;
#[cfg(test)]
mod conformance_tests;

use std::sync::Arc;
use std::time::Duration;

pub use self::redis::{RedisClient, StoreConn, CLUSTER_SLOTS};
pub use bucket::{FleetBucket, LocalBucket, Take};
pub use endpoint::{probe, probe_blocking, Endpoint, Mode};
pub use portcullis_policy::StoreError;

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
