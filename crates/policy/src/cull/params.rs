//! Culling parameters (the `[culling]` config section) and the derived lease TTL.

/// Parameters of the culling policy, mirroring the `[culling]` config section.
#[derive(Debug, Clone, PartialEq)]
pub struct CullParams {
    /// Errors are counted over this sliding window.
    pub window_secs: u64,
    /// Errors in the window that make a backend a cull candidate.
    pub error_threshold: u64,
    /// Period of the check loop.
    pub check_interval_secs: u64,
    /// Fleet-wide culls allowed per `token_period_secs` (bucket capacity).
    pub tokens: u32,
    /// Time for an empty bucket to refill completely (refill is continuous).
    pub token_period_secs: u64,
    /// Per upstream, at most `floor(max_culled_fraction × backends)` are out,
    /// and never the last one.
    pub max_culled_fraction: f64,
    /// A culled backend is probed again after this.
    pub cooldown_secs: u64,
    /// Decide and report, but commit nothing and eject nothing.
    pub dry_run: bool,
    /// Outliers by comparison with peers (CONTRACT §15).
    pub outlier: super::OutlierParams,
}

impl Default for CullParams {
    fn default() -> Self {
        Self {
            window_secs: 60,
            error_threshold: 5,
            check_interval_secs: 10,
            tokens: 10,
            token_period_secs: 600,
            max_culled_fraction: 0.5,
            cooldown_secs: 60,
            dry_run: false,
            outlier: super::OutlierParams::default(),
        }
    }
}

impl CullParams {
    /// The parameters the budget tests use: `tokens` per 10 minutes, at most
    /// `fraction` of an upstream out, 10 s checks and a 60 s cooldown.
    #[doc(hidden)]
    pub fn for_tests(tokens: u32, fraction: f64) -> Self {
        Self {
            tokens,
            token_period_secs: 600,
            max_culled_fraction: fraction,
            check_interval_secs: 10,
            cooldown_secs: 60,
            ..Self::default()
        }
    }

    /// Lease TTL of a claim, in milliseconds:
    /// `max(3 × check_interval, cooldown + 2 × check_interval)`.
    ///
    /// * `cooldown + 2 × interval`: a freshly granted lease alone covers the whole
    ///   cooldown plus the tick that probes and the tick that releases, so a Redis
    ///   blip during cooldown cannot drop the backend back into rotation early.
    /// * `3 × interval`: the holder renews every tick; two consecutive missed
    ///   renewals are tolerated before the lease lapses.
    /// * If every proxy dies, the cull ends by itself after at most this long.
    pub fn lease_ttl_ms(&self) -> u64 {
        let interval = self.check_interval_secs.max(1);
        let secs = (3 * interval).max(self.cooldown_secs.saturating_add(2 * interval));
        secs.saturating_mul(1000)
    }

    /// Token period in milliseconds (at least 1).
    pub fn token_period_ms(&self) -> u64 {
        self.token_period_secs.saturating_mul(1000).max(1)
    }

    /// Cooldown in milliseconds.
    pub fn cooldown_ms(&self) -> u64 {
        self.cooldown_secs.saturating_mul(1000)
    }
}

/// Most backends of an upstream of `total` that may be culled at once:
/// `floor(fraction × total)`, capped at `total − 1` (the last backend always
/// stays), and 0 when `total ≤ 1`. Non-finite or negative fractions give 0.
pub fn max_out(total: u32, fraction: f64) -> u32 {
    if total <= 1 || !fraction.is_finite() || fraction <= 0.0 {
        return 0;
    }
    // The epsilon keeps e.g. 0.29 × 100 = 28.999999999999996 at 29.
    let raw = (fraction.min(1.0) * f64::from(total) + 1e-9).floor();
    // `raw` is in [0, total] here, so the cast cannot truncate.
    let raw = raw as u32;
    raw.min(total - 1)
}

/// `[culling]`.
#[derive(Debug, Clone, PartialEq)]
pub struct CullingSettings {
    pub enabled: bool,
    pub params: CullParams,
    /// `""`: no webhook.
    pub webhook_url: String,
    /// Limit a tenant (or key) that causes most of the errors instead of culling backends.
    pub blame_tenants: bool,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn max_out_rules() {
        assert_eq!(max_out(4, 0.5), 2);
        assert_eq!(max_out(5, 0.5), 2);
        assert_eq!(max_out(10, 0.5), 5);
        assert_eq!(max_out(1, 1.0), 0, "never the last of one");
        assert_eq!(max_out(2, 1.0), 1, "never the last of two");
        assert_eq!(max_out(0, 1.0), 0);
        assert_eq!(max_out(4, 0.2), 0);
        assert_eq!(max_out(100, 0.29), 29);
        assert_eq!(max_out(10, 0.3), 3);
        assert_eq!(max_out(10, f64::NAN), 0);
        assert_eq!(max_out(10, -1.0), 0);
        assert_eq!(max_out(10, 7.0), 9);
    }

    #[test]
    fn lease_ttl() {
        let p = CullParams::default(); // interval 10, cooldown 60
        assert_eq!(p.lease_ttl_ms(), 80_000);
        let p = CullParams {
            cooldown_secs: 5,
            check_interval_secs: 10,
            ..CullParams::default()
        };
        assert_eq!(p.lease_ttl_ms(), 30_000);
    }
}
