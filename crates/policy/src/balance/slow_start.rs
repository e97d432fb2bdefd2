//! Slow start (HAProxy's `slowstart`, Envoy's slow start mode): a backend that comes
//! back (its health check passes again, readmitted after a cull, a drain or maintenance
//! released, a new address) takes a share that grows from [`FLOOR`] of its weight and
//! `max_conn` to all of it over `slow_start_seconds`, so a cold cache or a JIT that is
//! still warming does not take a full share at once and fall over again.
//!
//! Plain Rust that takes `now`: the pool asks [`ramp`] at selection, only while a
//! backend is ramping.
//!
//! Across a fleet every instance ramps a backend from one start, recorded in the store
//! ([`RampStore`]): each instance publishes when it saw the backend come back, and
//! [`fleet_start`] merges that with the start the store holds: sightings within
//! [`SAME_COMEBACK_MS`] of each other are one comeback, which starts at the earliest;
//! sightings further apart are two, and the later one wins. Times cross the wire as ages
//! (how long ago), so instances whose clocks disagree still agree on the start.

use std::time::Duration;

use async_trait::async_trait;

use crate::StoreError;

/// The share a backend takes the moment it comes back.
pub const FLOOR: f64 = 0.1;

/// The fraction of its weight (and `max_conn`) a backend back since `since_ms` takes at
/// `now_ms`, over `window`: `FLOOR` at once, rising linearly to 1 at `since + window`.
/// 1 when it never went away (`since_ms` 0) or without a window.
pub fn ramp(since_ms: u64, now_ms: u64, window: Duration) -> f64 {
    let window_ms = window.as_millis() as u64;
    if since_ms == 0 || window_ms == 0 {
        return 1.0;
    }
    let elapsed = now_ms.saturating_sub(since_ms);
    if elapsed >= window_ms {
        return 1.0;
    }
    FLOOR + (1.0 - FLOOR) * (elapsed as f64 / window_ms as f64)
}

/// `max_conn` while ramping: at least 1 (0, no limit, stays 0).
pub fn ramped_max_conn(max_conn: u64, ramp: f64) -> u64 {
    if max_conn == 0 || ramp >= 1.0 {
        return max_conn;
    }
    // (less a hair: 100 × 0.55 is 55.000…01 in floating point)
    ((max_conn as f64 * ramp - 1e-9).ceil() as u64).clamp(1, max_conn)
}

/// Whether a ramping backend is a candidate for this pick: with probability `ramp`
/// (`draw` uniform in `[0, 1)`). Over many picks it gets `ramp` × the share its weight
/// gives it, the rest going to the others.
pub fn admits(ramp: f64, draw: f64) -> bool {
    ramp >= 1.0 || draw < ramp
}

/// Instances of a fleet see one comeback within this of each other (a health check's
/// interval and rise, one fleet sync): sightings closer than this are the same comeback.
pub const SAME_COMEBACK_MS: u64 = 5_000;

/// The fleet's start of a backend's ramp, from the start the store holds (`stored`, 0:
/// none) and this instance's sighting (`mine`), both in the store's clock: the same
/// comeback (within [`SAME_COMEBACK_MS`]) starts at the earlier sighting; another (a
/// backend that went away and came back again) at the later one.
pub fn fleet_start(stored: u64, mine: u64) -> u64 {
    if stored == 0 {
        mine
    } else if stored.abs_diff(mine) <= SAME_COMEBACK_MS {
        stored.min(mine)
    } else {
        stored.max(mine)
    }
}

/// How long the store keeps an upstream's ramp starts after the last exchange: the
/// window, the slack of one comeback, and a minute.
pub fn ramp_ttl_ms(window: Duration) -> u64 {
    u64::try_from(window.as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(SAME_COMEBACK_MS)
        .saturating_add(60_000)
}

/// One instance's exchange of an upstream's ramping backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RampPublish {
    pub upstream: String,
    /// How long the store keeps the starts ([`ramp_ttl_ms`]).
    pub ttl_ms: u64,
    /// Each ramping backend and how long ago (ms) this instance saw it come back.
    pub backends: Vec<(String, u64)>,
}

/// The fleet's ramp starts, in Redis and in process with the same semantics.
#[async_trait]
pub trait RampStore: Send + Sync + std::fmt::Debug {
    /// Merges each backend's sighting with the start the store holds ([`fleet_start`],
    /// in the store's clock) and returns how long ago (ms) the fleet's ramp of each
    /// started, in the order given: one round trip.
    async fn exchange(&self, req: &RampPublish) -> Result<Vec<u64>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_comeback_starts_at_the_earliest_sighting_and_another_at_the_later() {
        assert_eq!(fleet_start(0, 10_000), 10_000, "the first sighting");
        // Seen 800 ms apart by two instances: one comeback, from the first sighting,
        // whichever publishes first.
        assert_eq!(fleet_start(10_000, 10_800), 10_000);
        assert_eq!(fleet_start(10_800, 10_000), 10_000);
        assert_eq!(fleet_start(10_000, 10_000 + SAME_COMEBACK_MS), 10_000);
        // Back again 30 s later: a new ramp, whoever saw the old one.
        assert_eq!(fleet_start(10_000, 40_000), 40_000);
        // An instance still publishing an old comeback does not restart the new ramp.
        assert_eq!(fleet_start(40_000, 10_000), 40_000);
        assert_eq!(ramp_ttl_ms(Duration::from_secs(10)), 75_000);
        assert_eq!(ramp_ttl_ms(Duration::MAX), u64::MAX);
    }

    #[test]
    fn ramps_from_a_tenth_to_all_over_the_window() {
        let w = Duration::from_secs(10);
        assert_eq!(ramp(0, 5_000, w), 1.0);
        assert_eq!(ramp(1_000, 5_000, Duration::ZERO), 1.0);
        assert!((ramp(1_000, 1_000, w) - 0.1).abs() < 1e-9);
        assert!((ramp(1_000, 6_000, w) - 0.55).abs() < 1e-9);
        assert_eq!(ramp(1_000, 11_000, w), 1.0);
        // A clock behind the mark reads as just back.
        assert!((ramp(5_000, 1_000, w) - 0.1).abs() < 1e-9);
    }

    #[test]
    fn max_conn_ramps_with_at_least_one() {
        assert_eq!(ramped_max_conn(0, 0.1), 0);
        assert_eq!(ramped_max_conn(100, 0.1), 10);
        assert_eq!(ramped_max_conn(3, 0.1), 1);
        assert_eq!(ramped_max_conn(100, 0.55), 55);
        assert_eq!(ramped_max_conn(100, 1.0), 100);
    }

    #[test]
    fn a_ramping_backend_is_a_candidate_in_proportion() {
        let mut rng = 0x1234_5678_u64;
        let mut hits = 0;
        for _ in 0..100_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let draw = (rng >> 11) as f64 / (1u64 << 53) as f64;
            if admits(0.25, draw) {
                hits += 1;
            }
        }
        assert!((24_000..26_000).contains(&hits), "{hits}");
        assert!(admits(1.0, 0.999));
    }
}
