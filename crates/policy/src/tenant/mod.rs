//! Tenants (CONTRACT §14): the cost quota over UTC calendar periods ([`quota`]) and each
//! instance's share of a tenant's fleet-wide concurrency cap ([`concurrency_allowance`]).
//! Plain Rust that takes `now`; the app keeps the registry and drives these.

pub mod quota;

pub use quota::{Period, QuotaBook, QuotaExceeded};

/// The largest quota a tier may have, and so the most one request or one flush charges:
/// 2^50 cost units. The store counts in Lua numbers (IEEE doubles, whole numbers exact up
/// to 2^53, and Redis refuses an `INCRBY` by anything written as `1e+17`): every value
/// sent stays well under that, with room for a fleet overshooting a quota.
pub const MAX_QUOTA: u64 = 1 << 50;

/// A request's cost from its backend's cost header (`value`), charged against a quota of
/// `quota` units: a whole number (ASCII digits, an optional `+`, surrounding spaces) is
/// that many units but at most the quota (a cost over the quota spends the whole quota,
/// a number past 64 bits too; and never more than [`MAX_QUOTA`]); absent, negative,
/// fractional or anything else is 1. 0 is a free request. Integer arithmetic only.
pub fn cost_of(value: Option<&[u8]>, quota: u64) -> u64 {
    let most = quota.min(MAX_QUOTA);
    let Some(v) = value else {
        return 1.min(most);
    };
    let v = v.trim_ascii();
    let digits = v.strip_prefix(b"+").unwrap_or(v);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return 1.min(most);
    }
    let n = digits.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    });
    n.unwrap_or(u64::MAX).min(most)
}

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
    fn a_cost_is_a_whole_number_else_one_and_never_over_the_quota() {
        let c = |v: &str, quota: u64| cost_of(Some(v.as_bytes()), quota);
        assert_eq!(c("42", 1000), 42);
        assert_eq!(c(" 7 ", 1000), 7);
        assert_eq!(c("+7", 1000), 7);
        assert_eq!(c("0", 1000), 0);
        for bad in ["-3", "1.5", "", " ", "abc", "1e3", "0x10", "++1", "4 2"] {
            assert_eq!(c(bad, 1000), 1, "{bad:?}");
        }
        assert_eq!(cost_of(None, 1000), 1);
        // A cost over the quota spends the whole quota, however large it is written.
        assert_eq!(c("1001", 1000), 1000);
        assert_eq!(c("18446744073709551615", 1000), 1000);
        assert_eq!(c("18446744073709551616", 1000), 1000);
        assert_eq!(c("99999999999999999999999", 1000), 1000);
        // Exact, with no round trip through a double: 2^53 + 1 stays odd.
        let big = (1u64 << 53) + 1;
        assert_eq!(c(&big.to_string(), u64::MAX), MAX_QUOTA);
        assert_eq!(c(&(MAX_QUOTA - 1).to_string(), MAX_QUOTA), MAX_QUOTA - 1);
        assert_eq!(c("9007199254740993", 9_007_199_254_740_993), MAX_QUOTA);
        assert_eq!(c("1125899906842623", MAX_QUOTA), 1_125_899_906_842_623);
        // A quota of 1 unit: one request spends it.
        assert_eq!(c("5", 1), 1);
    }

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
