//! Validation of `[upstreams.health_check]`, and the two keys it replaces
//! (`health_check_path`, `health_check_interval_seconds`: their probes keep their
//! meaning, a GET with 2xx = healthy that flips on one result, and get the new `Host`
//! default).

use super::check::{err, range, VResult, DAY_MS, MINUTE_MS};
use super::schema::{HealthCheckSection, UpstreamSection};
use super::settings::HealthCheck;
use portcullis_policy::health::{ExpectStatus, Thresholds};
use std::time::Duration;

/// Request headers a probe's `headers` may not set: the probe frames its own request.
const FRAMING: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "keep-alive",
];

/// The check of upstream `u` (`p` gives a key's path), `None` without one.
pub(super) fn validate_health_check(
    u: &UpstreamSection,
    p: &dyn Fn(&str) -> String,
) -> VResult<Option<HealthCheck>> {
    let Some(h) = &u.health_check else {
        return Ok(legacy(u));
    };
    if !u.health_check_path.is_empty() {
        return err(
            p("health_check_path"),
            "[upstreams.health_check] is set too: give the path there (path = ...) and remove \
             health_check_path",
        );
    }
    let hp = |k: &str| p(&format!("health_check.{k}"));
    section(h, &hp)
}

/// The old keys as a check: one result flips, 2xx passes, the connect timeout and then
/// as long again (at least 1 s) for the answer bound the probe, as before.
fn legacy(u: &UpstreamSection) -> Option<HealthCheck> {
    if u.health_check_path.is_empty() {
        return None;
    }
    let interval_ms = u.health_check_interval_seconds.saturating_mul(1000);
    Some(HealthCheck {
        path: u.health_check_path.clone(),
        method: "GET".into(),
        host: String::new(),
        headers: Vec::new(),
        expect_status: ExpectStatus::parse("200-299").unwrap_or_else(|_| unreachable!()),
        expect_body: String::new(),
        thresholds: Thresholds {
            rise: 1,
            fall: 1,
            interval_ms,
            fast_interval_ms: interval_ms,
        },
        // as before: the connect timeout, then as long again (at least 1 s) to answer
        timeout: Duration::from_millis(
            u.connect_timeout_ms
                .saturating_add(u.connect_timeout_ms.max(1000)),
        ),
        port: None,
        shared: false,
        probers: 3,
    })
}

fn section(h: &HealthCheckSection, p: &dyn Fn(&str) -> String) -> VResult<Option<HealthCheck>> {
    if h.path.is_empty() {
        return Ok(None);
    }
    if !h.path.starts_with('/') || !h.path.bytes().all(|b| b.is_ascii_graphic()) {
        return err(
            p("path"),
            "must start with '/' and hold no space or control character",
        );
    }
    let method = h.method.to_ascii_uppercase();
    if !matches!(method.as_str(), "GET" | "HEAD" | "OPTIONS") {
        return err(p("method"), "must be GET, HEAD or OPTIONS");
    }
    if !h.host.bytes().all(|b| b.is_ascii_graphic()) || h.host.len() > 255 {
        return err(
            p("host"),
            "a Host value: at most 255 visible characters, no space",
        );
    }
    let mut headers = Vec::with_capacity(h.headers.len());
    for (name, value) in &h.headers {
        let path = p(&format!("headers.{name}"));
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return err(path, "not a valid header name");
        }
        if FRAMING.contains(&name.to_ascii_lowercase().as_str()) {
            return err(
                path,
                "the probe sets this header itself (use `host` for the Host header)",
            );
        }
        if http::HeaderValue::from_str(value).is_err() {
            return err(path, "not a valid header value");
        }
        headers.push((name.clone(), value.clone()));
    }
    let expect_status = ExpectStatus::parse(&h.expect_status).map_err(|why| {
        (
            p("expect_status"),
            format!("{why}: write codes and ranges, e.g. \"200,204,300-399\""),
        )
    })?;
    if h.expect_body.len() > 64 * 1024 {
        return err(
            p("expect_body"),
            "at most 64 KiB (it is looked for in the body's first 64 KiB)",
        );
    }
    range(&p("interval_ms"), h.interval_ms, 100, DAY_MS, "ms")?;
    range(
        &p("fast_interval_ms"),
        h.fast_interval_ms,
        100,
        DAY_MS,
        "ms",
    )?;
    range(&p("timeout_ms"), h.timeout_ms, 1, 10 * MINUTE_MS, "ms")?;
    range(&p("rise"), u64::from(h.rise), 1, 1000, "")?;
    range(&p("fall"), u64::from(h.fall), 1, 1000, "")?;
    range(&p("probers"), u64::from(h.probers), 1, 64, "")?;
    Ok(Some(HealthCheck {
        path: h.path.clone(),
        method,
        host: h.host.clone(),
        headers,
        expect_status,
        expect_body: h.expect_body.clone(),
        thresholds: Thresholds {
            rise: h.rise,
            fall: h.fall,
            interval_ms: h.interval_ms,
            fast_interval_ms: h.fast_interval_ms,
        },
        timeout: Duration::from_millis(h.timeout_ms),
        port: (h.port != 0).then_some(h.port),
        shared: h.shared,
        probers: h.probers,
    }))
}
