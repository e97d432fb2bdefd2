//! Rate limiting's metrics: the counter store's health and the decisions per policy.

use super::registered;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Registry};

pub struct RateLimitMetrics {
    /// Copied from the limiter at each scrape (the limiter owns the count).
    pub store_errors: IntCounter,
    /// Copied from the limiter at each scrape (the limiter owns the count).
    pub store_late_answers: IntCounter,
    pub store_healthy: IntGauge,
    pub tracked_keys: IntGauge,
    /// Per rate-limit policy, by `result` = allowed | limited | refused_by_other (handles
    /// resolved per reload: see [`crate::ratelimit::DecisionCounters`]).
    pub policy_decisions: IntCounterVec,
    /// Bearer JWTs refused under a `jwt:CLAIM` key, by `reason` (counted by the verifier).
    pub jwt_refusals: IntCounterVec,
}

impl RateLimitMetrics {
    /// Define rate limiting's series and register them in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let store_errors = registered(
            registry,
            IntCounter::new(
                "portcullis_ratelimit_store_errors_total",
                "Failed or timed-out rate-limit store round trips",
            ),
        );
        let store_late_answers = registered(
            registry,
            IntCounter::new(
                "portcullis_ratelimit_store_late_answers_total",
                "Rate-limit store answers that came back a flush interval or more after their batch was sent (the fleet share may then admit past the limit)",
            ),
        );
        let store_healthy = registered(
            registry,
            IntGauge::new(
                "portcullis_ratelimit_store_healthy",
                "1 while the last rate-limit store round trip succeeded",
            ),
        );
        store_healthy.set(1);
        let tracked_keys = registered(
            registry,
            IntGauge::new(
                "portcullis_ratelimit_tracked_keys",
                "API keys tracked in memory",
            ),
        );
        let policy_decisions = super::counter_vec(
            registry,
            "portcullis_ratelimit_policy_decisions_total",
            "Rate-limit decisions per policy: allowed (admitted by every policy and counted), limited (refused by this policy), refused_by_other (admitted here, refused by another policy; not counted)",
            &["policy", "result"],
        );
        let jwt_refusals = super::counter_vec(
            registry,
            "portcullis_ratelimit_jwt_refusals_total",
            "Bearer JWTs refused under a jwt:CLAIM key (401 invalid_token), by reason: malformed, algorithm, unknown_key, signature, expired, not_yet_valid, issuer, audience (a token refused lately is refused again from a cache, counted under its reason), address_limited (not checked: its client address sent too many tokens that failed lately)",
            &["reason"],
        );
        Self {
            jwt_refusals,
            store_errors,
            store_late_answers,
            store_healthy,
            tracked_keys,
            policy_decisions,
        }
    }
}
