//! Validation of the observability sections (CONTRACT §8, §16): `[access_log]`,
//! `[tracing]` and `[log]`.

use super::check::{err, range, VResult};
use super::schema::*;
use super::settings::*;
use std::path::PathBuf;

pub(super) fn validate_access_log(a: &AccessLogSection) -> VResult<AccessLogSettings> {
    if !(0.0..=1.0).contains(&a.sample) {
        return err("access_log.sample", "must be between 0.0 and 1.0");
    }
    range(
        "access_log.queue_lines",
        a.queue_lines as u64,
        1,
        1 << 24,
        "lines",
    )?;
    let syslog = match a.syslog.trim() {
        "" => None,
        s => match crate::observe::syslog::SyslogTarget::parse(s) {
            Ok(t) => Some(t),
            Err(why) => return err("access_log.syslog", &why),
        },
    };
    if syslog.is_some() && !a.path.is_empty() {
        return err(
            "access_log.syslog",
            "set either syslog or path (the lines go to one of them), not both",
        );
    }
    Ok(AccessLogSettings {
        enabled: a.enabled,
        path: (!a.path.is_empty()).then(|| PathBuf::from(&a.path)),
        sample: a.sample,
        queue_lines: a.queue_lines,
        syslog,
    })
}

pub(super) fn validate_tracing(t: &TracingSection) -> VResult<TracingSettings> {
    if !(0.0..=1.0).contains(&t.sample) {
        return err("tracing.sample", "must be between 0.0 and 1.0");
    }
    let endpoint = t.otlp_endpoint.trim();
    if endpoint.is_empty() {
        return Ok(TracingSettings {
            otlp_endpoint: None,
            sample: t.sample,
        });
    }
    let uri: http::Uri = match endpoint.parse() {
        Ok(u) => u,
        Err(e) => return err("tracing.otlp_endpoint", format!("not a URL ({e})")),
    };
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return err(
            "tracing.otlp_endpoint",
            "must be an http:// or https:// URL with a host, e.g. \"http://127.0.0.1:4318\" \
             (OTLP/HTTP; /v1/traces is appended unless the path already ends with it)",
        );
    }
    if uri.query().is_some() {
        return err("tracing.otlp_endpoint", "must not have a query string");
    }
    Ok(TracingSettings {
        otlp_endpoint: Some(endpoint.to_string()),
        sample: t.sample,
    })
}

/// `[log]`: `format` is one of the names serde already checked (a bad one is an error at
/// `log.format` with its line); nothing else to check.
pub(super) fn validate_log(l: &LogSection) -> VResult<LogSettings> {
    Ok(LogSettings { format: l.format })
}
