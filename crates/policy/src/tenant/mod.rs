//! Tenants (CONTRACT §14): the cost quota over UTC calendar periods ([`quota`]) and each
//! instance's share of a tenant's fleet-wide concurrency cap ([`concurrency_allowance`]).
//! Plain Rust that takes `now`; the app keeps the registry and drives these.

pub mod quota;

pub use quota::{Period, QuotaBook, QuotaExceeded};

/// How many of a tenant's requests this instance may have in flight, for a fleet-wide
/// `cap`: the cap times this instance's share of the tenant's traffic, read from the
/// rate-limit counts the flusher keeps (`own` admissions here and `fleet` admissions in
/// the whole fleet over the same sliding window), among `instances` live instances.
///
/// - One instance (or an unshared store): the whole cap.
/// - No fleet view yet (the tenant's counts were never synced, or nothing counted):
///   `cap / instances`.
/// - Otherwise `cap × own / fleet`, whose fractional part is granted as one more request
///   with that probability (`draw` in `[0, 1)`), so that the fleet's allowances add up
///   to the cap in expectation rather than to `cap + instances − 1`.
///
/// Every instance may always run one request of the tenant (an idle instance's share is
/// 0 and only grows once it admits): the fleet's total is bounded by
/// `cap + instances − 1`, and by the cap once each instance's share is a whole number of
/// requests. Shares move as the flusher syncs (every flush interval).
pub fn concurrency_allowance(
    cap: u64,
    own: u64,
    fleet: Option<u64>,
    instances: u64,
    draw: f64,
) -> u64 {
    if cap == 0 {
        return u64::MAX;
    }
    let n = instances.max(1);
    if n == 1 {
        return cap;
    }
    let exact = match fleet {
        Some(f) if f > 0 => cap as f64 * (own.min(f) as f64 / f as f64),
        _ => cap as f64 / n as f64,
    };
    let whole = exact.floor();
    let extra = if draw < exact - whole { 1.0 } else { 0.0 };
    ((whole + extra) as u64).clamp(1, cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_instance_has_the_whole_cap() {
        assert_eq!(concurrency_allowance(10, 0, None, 1, 0.0), 10);
        assert_eq!(concurrency_allowance(10, 5, Some(100), 1, 0.99), 10);
        assert_eq!(concurrency_allowance(0, 5, Some(100), 3, 0.5), u64::MAX);
    }

    #[test]
    fn shares_follow_the_traffic_and_add_up_to_the_cap() {
        // Two instances, even traffic: half each.
        assert_eq!(concurrency_allowance(4, 50, Some(100), 2, 0.0), 2);
        // Three quarters of the traffic here.
        assert_eq!(concurrency_allowance(8, 75, Some(100), 2, 0.0), 6);
        assert_eq!(concurrency_allowance(8, 25, Some(100), 2, 0.0), 2);
        // No fleet view yet: an equal share.
        assert_eq!(concurrency_allowance(9, 0, None, 3, 0.0), 3);
        // Own counts ahead of the fleet's (not synced yet): at most the whole cap.
        assert_eq!(concurrency_allowance(5, 80, Some(40), 2, 0.0), 5);
    }

    #[test]
    fn the_remainder_is_granted_at_random_so_the_expected_total_is_the_cap() {
        // 3 instances with equal traffic, cap 10: 3.33 each. Over many draws the fleet's
        // total averages 10, never below 9 nor above 12.
        let mut total = 0u64;
        let runs = 3_000u64;
        for i in 0..runs {
            let mut sum = 0;
            for k in 0..3u64 {
                let draw = (((i * 3 + k) * 2_654_435_761) % 1_000) as f64 / 1_000.0;
                sum += concurrency_allowance(10, 1, Some(3), 3, draw);
            }
            assert!((9..=12).contains(&sum), "{sum}");
            total += sum;
        }
        let mean = total as f64 / runs as f64;
        assert!((mean - 10.0).abs() < 0.1, "mean {mean}");
    }

    #[test]
    fn an_idle_instance_may_always_run_one() {
        assert_eq!(concurrency_allowance(4, 0, Some(100), 2, 0.0), 1);
        assert_eq!(concurrency_allowance(4, 1, Some(1_000), 2, 0.0), 1);
    }
}
