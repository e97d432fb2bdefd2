//! A plain token bucket shared by the fleet (the watchdog's restart budget): the trait its
//! holder uses (`Arc<dyn FleetBucket>`), implemented in the store crate by the Redis bucket
//! and the in-process one, with the same arithmetic (one conformance table runs both).

use async_trait::async_trait;

use crate::StoreError;

/// What [`FleetBucket::take`] got.
#[derive(Debug, Clone, PartialEq)]
pub enum Take {
    /// A token was taken; `tokens_left` remain.
    Granted { tokens_left: f64 },
    /// Empty; the next token in `retry_after_ms` (`u64::MAX`: never).
    Empty { retry_after_ms: u64 },
}

/// A token bucket of capacity `cap`, refilled continuously at `cap` per `period_ms`; a
/// bucket never written is full. Each call reads the store's own clock.
#[async_trait]
pub trait FleetBucket: Send + Sync + std::fmt::Debug {
    /// Take one token if the bucket (capacity `cap`, refilled over `period_ms`) has one.
    async fn take(&self, cap: u32, period_ms: u64) -> Result<Take, StoreError>;
}
