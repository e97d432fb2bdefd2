//! Validation of the protective sections: `[shedding]` (overload shedding),
//! `[culling]` (removing failing backends) and `[watchdog]` (the process watchdog).

use super::check::{err, range, VResult, DAY, HOUR, MAX_COUNT, MINUTE_MS, WEEK};
use super::schema::*;
use super::settings::*;
use portcullis_policy::cull::{CullParams, CullingSettings, OutlierParams, OutlierRule};
use portcullis_policy::shed::SheddingSettings;

pub(super) fn validate_shedding(s: &SheddingSection) -> VResult<SheddingSettings> {
    range(
        "shedding.max_concurrency",
        s.max_concurrency,
        0,
        10_000_000,
        "requests",
    )?;
    range(
        "shedding.retry_after_seconds",
        s.retry_after_seconds,
        1,
        DAY,
        "seconds",
    )?;
    range(
        "shedding.max_tunnels",
        s.max_tunnels,
        0,
        10_000_000,
        "tunnels",
    )?;
    if s.adaptive {
        if s.max_concurrency == 0 {
            return err(
                "shedding.adaptive",
                "needs a max_concurrency above 0 (the ceiling of the learned cap)",
            );
        }
        range(
            "shedding.min_concurrency",
            s.min_concurrency,
            1,
            s.max_concurrency,
            "requests (at most max_concurrency)",
        )?;
    }
    validate_queue(s)?;
    range(
        "shedding.fleet_max_concurrency",
        s.fleet_max_concurrency,
        0,
        100_000_000,
        "requests",
    )?;
    if s.fleet_max_concurrency > 0 && s.max_concurrency == 0 {
        return err(
            "shedding.fleet_max_concurrency",
            "needs a max_concurrency above 0 (what each instance takes without the store)",
        );
    }
    Ok(SheddingSettings {
        max_concurrency: s.max_concurrency,
        queue_timeout: std::time::Duration::from_millis(s.queue_timeout_ms),
        max_queue: s.max_queue,
        queue_target: std::time::Duration::from_millis(s.queue_target_ms),
        fleet_max_concurrency: s.fleet_max_concurrency,
        retry_after_secs: s.retry_after_seconds,
        adaptive: s.adaptive,
        min_concurrency: s.min_concurrency,
        max_tunnels: s.max_tunnels,
        shadow: s.shadow,
    })
}

/// `[shedding]`'s queue at the cap: how long and how many may wait, and CoDel's target.
fn validate_queue(s: &SheddingSection) -> VResult<()> {
    range(
        "shedding.queue_timeout_ms",
        s.queue_timeout_ms,
        0,
        HOUR * 1000,
        "ms",
    )?;
    range("shedding.max_queue", s.max_queue, 1, 1_000_000, "requests")?;
    range(
        "shedding.queue_target_ms",
        s.queue_target_ms,
        0,
        MINUTE_MS,
        "ms",
    )?;
    if s.queue_target_ms > 0 && s.queue_timeout_ms == 0 {
        return err(
            "shedding.queue_target_ms",
            "needs a queue (queue_timeout_ms above 0)",
        );
    }
    Ok(())
}

pub(super) fn validate_culling(c: &CullingSection) -> VResult<CullingSettings> {
    range(
        "culling.window_seconds",
        c.window_seconds,
        1,
        DAY,
        "seconds",
    )?;
    range(
        "culling.error_threshold",
        c.error_threshold,
        1,
        MAX_COUNT,
        "errors",
    )?;
    range(
        "culling.check_interval_seconds",
        c.check_interval_seconds,
        1,
        HOUR,
        "seconds",
    )?;
    range("culling.tokens", u64::from(c.tokens), 0, 1_000_000, "")?;
    range(
        "culling.token_period_seconds",
        c.token_period_seconds,
        1,
        WEEK,
        "seconds",
    )?;
    range(
        "culling.cooldown_seconds",
        c.cooldown_seconds,
        1,
        DAY,
        "seconds",
    )?;
    if !(0.0..=1.0).contains(&c.max_culled_fraction) {
        return err("culling.max_culled_fraction", "must be between 0.0 and 1.0");
    }
    if !c.webhook_url.is_empty() && !c.webhook_url.starts_with("http://") {
        return err("culling.webhook_url", "must be empty or an http:// URL");
    }
    let outlier = validate_outlier(c)?;
    Ok(CullingSettings {
        enabled: c.enabled,
        params: CullParams {
            window_secs: c.window_seconds,
            error_threshold: c.error_threshold,
            check_interval_secs: c.check_interval_seconds,
            tokens: c.tokens,
            token_period_secs: c.token_period_seconds,
            max_culled_fraction: c.max_culled_fraction,
            cooldown_secs: c.cooldown_seconds,
            dry_run: c.dry_run,
            outlier,
        },
        webhook_url: c.webhook_url.clone(),
        blame_tenants: c.blame_tenants,
    })
}

/// `[culling]`'s outlier keys (CONTRACT §15).
fn validate_outlier(c: &CullingSection) -> VResult<OutlierParams> {
    let Some(rule) = OutlierRule::parse(&c.outlier) else {
        return err(
            "culling.outlier",
            format!("must be none, success_rate or latency, not {:?}", c.outlier),
        );
    };
    range(
        "culling.outlier_min_requests",
        c.outlier_min_requests,
        1,
        MAX_COUNT,
        "requests",
    )?;
    if !(c.outlier_stdev_factor.is_finite() && c.outlier_stdev_factor > 0.0)
        || c.outlier_stdev_factor > 100.0
    {
        return err(
            "culling.outlier_stdev_factor",
            "must be above 0 and at most 100",
        );
    }
    if !(c.latency_factor.is_finite() && c.latency_factor > 1.0) || c.latency_factor > 1000.0 {
        return err(
            "culling.latency_factor",
            "must be above 1.0 (slower than the peers) and at most 1000",
        );
    }
    Ok(OutlierParams {
        rule,
        min_requests: c.outlier_min_requests,
        stdev_factor: c.outlier_stdev_factor,
        latency_factor: c.latency_factor,
    })
}

pub(super) fn validate_watchdog(w: &WatchdogSection) -> VResult<WatchdogSettings> {
    if !(0.0..=1.0).contains(&w.max_error_rate) {
        return err("watchdog.max_error_rate", "must be between 0.0 and 1.0");
    }
    range("watchdog.max_rss_mb", w.max_rss_mb, 0, 1 << 20, "MiB")?;
    range(
        "watchdog.max_stall_ms",
        w.max_stall_ms,
        1,
        10 * MINUTE_MS,
        "ms",
    )?;
    range(
        "watchdog.min_requests",
        w.min_requests,
        1,
        MAX_COUNT,
        "requests",
    )?;
    range(
        "watchdog.check_interval_seconds",
        w.check_interval_seconds,
        1,
        HOUR,
        "seconds",
    )?;
    range("watchdog.tokens", u64::from(w.tokens), 0, 1_000_000, "")?;
    range(
        "watchdog.token_period_seconds",
        w.token_period_seconds,
        1,
        WEEK,
        "seconds",
    )?;
    Ok(w.clone())
}

/// `[budget]` (CONTRACT §12): counts and grace periods within their bounds.
pub(super) fn validate_budget(
    b: &BudgetSection,
) -> VResult<portcullis_policy::cull::claims::BudgetPolicy> {
    range(
        "budget.max_concurrent",
        b.max_concurrent,
        0,
        1_000_000,
        "operations",
    )?;
    range(
        "budget.min_seconds_between_claims",
        b.min_seconds_between_claims,
        0,
        super::check::WEEK,
        "seconds",
    )?;
    range(
        "budget.min_seconds_after_release",
        b.min_seconds_after_release,
        0,
        super::check::WEEK,
        "seconds",
    )?;
    Ok(portcullis_policy::cull::claims::BudgetPolicy {
        max_concurrent: b.max_concurrent as u32,
        min_between_claims_ms: b.min_seconds_between_claims * 1000,
        min_after_release_ms: b.min_seconds_after_release * 1000,
        one_group_at_a_time: b.one_group_at_a_time,
        refuse_when_failing: b.refuse_when_failing,
    })
}
