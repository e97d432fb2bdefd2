//! The rate limiter's counter stores ([`CounterStore`], defined by the policy crate with the
//! limiter's flush protocol): [`RedisStore`], shared by the fleet, and [`LocalStore`], in
//! process (kept in the policy crate, whose limiter tests run on it).

mod redis;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod redis_tests;

pub use self::redis::{RedisStore, HEARTBEAT_BUCKET_MS, MAX_KEYS_PER_CALL};
pub use portcullis_policy::ratelimit::{CounterStore, LocalStore};
