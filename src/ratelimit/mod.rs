//! Per-API-key sliding-window rate limiting, shared between instances through a counter
//! store (Redis, or an in-process store when there is no `[redis]` section).
//!
//! * Decisions ([`Limiter::check`]) are purely in-memory, never await and never touch the
//!   store. Only admitted requests are counted.
//! * A background task ([`run_flusher`]) periodically sends every touched key's unflushed
//!   admissions to the store in one batch and receives the global counts of the key's
//!   current and previous windows back. Each key's estimate is
//!   `last known global counts + own in-flight + own unflushed admissions`.
//! * If the store fails, decisions continue on the last known global counts plus the local
//!   admissions; unflushed deltas are kept (bounded by the tracked-key cap) and delivered when
//!   the store is back.
//!
//! Window math: see [`window`]. Key hashing for the store: see [`hash`].

mod flusher;
pub mod hash;
mod key;
mod limiter;
mod redis_store;
mod store;
pub mod window;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod redis_tests;

use std::collections::HashMap;

pub use flusher::{now_ms, run_flusher};
pub use key::{extract_key, KeyOutcome, KeySource, MissingKey};
pub use limiter::{approx_bytes_per_key, FlushOutcome, Limiter, SHARDS};
pub use redis_store::{RedisSettings, RedisStore};
pub use store::{CounterStore, Delta, GlobalCounts, LocalStore, StoreError};

/// Default cap on the number of keys a [`Limiter`] tracks.
pub const DEFAULT_MAX_TRACKED_KEYS: usize = 100_000;

/// Limiter parameters; hot-reloadable through [`Limiter::set_params`].
#[derive(Debug, Clone)]
pub struct RateLimitParams {
    /// Window length in seconds (>= 1; 0 is treated as 1).
    pub window_secs: u64,
    /// Admitted requests per key per sliding window.
    pub limit: u64,
    /// Per-key limits overriding `limit`, by raw API key.
    pub overrides: HashMap<String, u64>,
    /// Longest key accepted by [`extract_key`] (the limiter itself does not check it).
    pub max_key_bytes: usize,
    /// Approximate cap on tracked keys (rounded up to a multiple of [`SHARDS`]).
    pub max_tracked_keys: usize,
}

impl Default for RateLimitParams {
    fn default() -> Self {
        Self {
            window_secs: 60,
            limit: 600,
            overrides: HashMap::new(),
            max_key_bytes: 256,
            max_tracked_keys: DEFAULT_MAX_TRACKED_KEYS,
        }
    }
}

/// Outcome of [`Limiter::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Admitted (and counted).
    Allowed {
        /// The key's limit.
        limit: u64,
        /// Whole requests still admissible after this one (`r` of the `RateLimit` field).
        remaining: u64,
        /// Seconds until the quota is fully restored if no more requests come (`t`).
        reset_secs: u64,
    },
    /// Refused (not counted).
    Limited {
        /// The key's limit.
        limit: u64,
        /// Whole seconds (>= 1, rounded up) until this key is admitted again.
        retry_after_secs: u64,
        /// Same as `retry_after_secs`: seconds until `r` becomes >= 1 again (`t` of the
        /// `RateLimit` field on a 429).
        reset_secs: u64,
    },
}

impl Decision {
    /// Whether the request was admitted.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed { .. })
    }
}

/// `RateLimit-Policy` field value: `"<name>";q=<limit>;w=<window>`.
pub fn policy_header(name: &str, limit: u64, window: u64) -> String {
    format!("{};q={limit};w={window}", sf_string(name))
}

/// `RateLimit` field value: `"<name>";r=<remaining>;t=<seconds>`.
pub fn ratelimit_header(name: &str, remaining: u64, t: u64) -> String {
    format!("{};r={remaining};t={t}", sf_string(name))
}

/// Structured-field sf-string: printable ASCII only, `"` and `\` escaped; anything else is
/// replaced by `_` so the header is always valid.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn header_formatting() {
        assert_eq!(policy_header("default", 600, 60), "\"default\";q=600;w=60");
        assert_eq!(ratelimit_header("default", 0, 7), "\"default\";r=0;t=7");
        assert_eq!(
            ratelimit_header("a\"b\\c\u{e9}", 3, 1),
            "\"a\\\"b\\\\c_\";r=3;t=1"
        );
        // Valid HTTP header values.
        assert!(http::HeaderValue::from_str(&policy_header("x y", 1, 2)).is_ok());
    }
}
