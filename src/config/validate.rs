//! Validation of the file schema into runtime types. Errors are
//! `(key_path, reason)`; the caller adds file and line:column.

use super::schema::*;
use super::settings::*;
use super::store::validate_redis;
use crate::ratelimit::{KeySource, MissingKey, PolicyKey, RateLimitParams};
use portcullis_policy::cull::CullParams;
use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

pub(super) type VResult<T> = Result<T, (String, String)>;

pub(super) fn err<T>(path: impl Into<String>, reason: impl Into<String>) -> VResult<T> {
    Err((path.into(), reason.into()))
}

/// Validate the file schema into typed settings.
pub fn validate(raw: FileConfig) -> VResult<Config> {
    let server = validate_server(&raw.server)?;
    let store = raw.redis.as_ref().map(validate_redis).transpose()?;
    let upstreams = super::upstreams::validate_upstreams(&raw.upstreams)?;
    let routes = super::upstreams::validate_routes(&raw.routes, &upstreams)?;
    let shedding = validate_shedding(&raw.shedding)?;
    let rate_limit = validate_rate_limit(&raw.rate_limit)?;
    let culling = validate_culling(&raw.culling)?;
    let watchdog = validate_watchdog(&raw.watchdog)?;
    let tls = raw.tls.as_ref().map(validate_tls).transpose()?;
    if let Some(t) = &tls {
        for (i, a) in t.listen.iter().enumerate() {
            if server.listen.contains(a) || *a == server.admin_listen {
                return err(
                    format!("tls.listen[{i}]"),
                    "must differ from every server.listen address and admin_listen",
                );
            }
        }
    }
    let access_log = validate_access_log(&raw.access_log)?;
    let tracing = validate_tracing(&raw.tracing)?;
    Ok(Config {
        tls,
        server,
        store,
        upstreams,
        routes,
        shedding,
        rate_limit,
        culling,
        watchdog,
        access_log,
        tracing,
    })
}

pub(super) fn parse_addr(path: &str, s: &str) -> VResult<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => (h, p),
        _ => return err(path, format!("invalid address {s:?}: expected host:port")),
    };
    match (host, port.parse::<u16>().unwrap_or(0)).to_socket_addrs() {
        Ok(mut addrs) => match addrs.next() {
            Some(a) => Ok(a),
            None => err(path, format!("address {s:?} resolves to nothing")),
        },
        Err(e) => err(path, format!("invalid address {s:?}: {e}")),
    }
}

/// `lo <= v <= hi`, else an error naming the range and the unit.
pub(super) fn range(path: &str, v: u64, lo: u64, hi: u64, unit: &str) -> VResult<()> {
    if v < lo || v > hi {
        let unit = if unit.is_empty() {
            String::new()
        } else {
            format!(" {unit}")
        };
        return err(
            path,
            format!("{v} is out of range: must be between {lo} and {hi}{unit}"),
        );
    }
    Ok(())
}

/// Upper bounds: far above any sensible setting, far below where a duration or
/// a count would overflow (`Instant + Duration`, `u64` sums, Redis TTLs).
pub(super) const HOUR: u64 = 3600;
pub(super) const DAY: u64 = 24 * HOUR;
pub(super) const WEEK: u64 = 7 * DAY;
pub(super) const MINUTE_MS: u64 = 60_000;
pub(super) const DAY_MS: u64 = DAY * 1000;
pub(super) const MAX_COUNT: u64 = 1_000_000_000_000;

fn validate_server(s: &ServerSection) -> VResult<ServerSettings> {
    if s.listen.is_empty() {
        return err("server.listen", "at least one listen address is required");
    }
    let mut out = Vec::with_capacity(s.listen.len());
    for (i, l) in s.listen.iter().enumerate() {
        let a = parse_addr(&format!("server.listen[{i}]"), l)?;
        if out.contains(&a) {
            return err(
                format!("server.listen[{i}]"),
                format!("duplicate listen address {l}"),
            );
        }
        out.push(a);
    }
    range("server.threads", s.threads as u64, 1, 1024, "")?;
    range("server.drain_seconds", s.drain_seconds, 0, HOUR, "seconds")?;
    range(
        "server.shutdown_timeout_seconds",
        s.shutdown_timeout_seconds,
        0,
        HOUR,
        "seconds",
    )?;
    range(
        "server.keepalive_timeout_seconds",
        s.keepalive_timeout_seconds,
        0,
        HOUR,
        "seconds",
    )?;
    let token = s.admin_token.expose();
    if token.len() > 1024 || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return err(
            "server.admin_token",
            "must be at most 1024 visible ASCII characters (no spaces)",
        );
    }
    if s.upgrade_sock.is_empty() {
        return err("server.upgrade_sock", "must not be empty");
    }
    range(
        "server.max_request_header_bytes",
        s.max_request_header_bytes as u64,
        1024,
        1_048_575,
        "bytes",
    )?;
    range(
        "server.max_response_buffer_bytes",
        s.max_response_buffer_bytes as u64,
        4096,
        1 << 30,
        "bytes",
    )?;
    let edge = crate::config::edge::validate_server_edge(s)?;
    let admin_listen = parse_addr("server.admin_listen", &s.admin_listen)?;
    if out.contains(&admin_listen) {
        return err(
            "server.admin_listen",
            "must differ from every server.listen address",
        );
    }
    Ok(ServerSettings {
        listen: out,
        admin_listen,
        threads: s.threads,
        drain: Duration::from_secs(s.drain_seconds),
        shutdown_timeout: Duration::from_secs(s.shutdown_timeout_seconds),
        upgrade_sock: PathBuf::from(&s.upgrade_sock),
        max_request_header_bytes: s.max_request_header_bytes,
        keepalive_seconds: s.keepalive_timeout_seconds,
        h2c: s.h2c,
        preserve_header_case: s.preserve_header_case,
        admin_token: s.admin_token.clone(),
        trusted_proxies: edge.trusted_proxies,
        proxy_protocol: s.proxy_protocol,
        max_request_body_bytes: s.max_request_body_bytes,
        client_header_timeout: edge.client_header_timeout,
        client_body_timeout: edge.client_body_timeout,
        max_connections: s.max_connections,
        max_response_buffer_bytes: s.max_response_buffer_bytes,
        idle_timeout: edge.idle_timeout,
        tls_handshake_timeout: edge.tls_handshake_timeout,
        admin_max_connections: s.admin_max_connections,
        tunnel_idle_timeout: edge.tunnel_idle_timeout,
        h2_max_glitches: s.h2_max_glitches,
    })
}

fn validate_shedding(s: &SheddingSection) -> VResult<SheddingSettings> {
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
    Ok(SheddingSettings {
        max_concurrency: s.max_concurrency,
        retry_after_secs: s.retry_after_seconds,
        adaptive: s.adaptive,
        min_concurrency: s.min_concurrency,
        max_tunnels: s.max_tunnels,
    })
}

fn validate_tls(t: &TlsSection) -> VResult<TlsSettings> {
    if t.listen.is_empty() {
        return err("tls.listen", "at least one listen address is required");
    }
    let mut listen = Vec::with_capacity(t.listen.len());
    for (i, l) in t.listen.iter().enumerate() {
        let a = parse_addr(&format!("tls.listen[{i}]"), l)?;
        if listen.contains(&a) {
            return err(
                format!("tls.listen[{i}]"),
                format!("duplicate listen address {l}"),
            );
        }
        listen.push(a);
    }
    let min_version = match t.min_version.as_str() {
        "1.2" => crate::config::certs::MinVersion::Tls12,
        "1.3" => crate::config::certs::MinVersion::Tls13,
        other => {
            return err(
                "tls.min_version",
                format!("unknown TLS version {other:?}: expected \"1.2\" or \"1.3\""),
            )
        }
    };
    if t.certificates.is_empty() {
        return err(
            "tls.certificates",
            "at least one [[tls.certificates]] entry is required",
        );
    }
    let mut pairs = Vec::with_capacity(t.certificates.len());
    for (i, c) in t.certificates.iter().enumerate() {
        if c.cert.is_empty() {
            return err(format!("tls.certificates[{i}].cert"), "must not be empty");
        }
        if c.key.is_empty() {
            return err(format!("tls.certificates[{i}].key"), "must not be empty");
        }
        pairs.push((PathBuf::from(&c.cert), PathBuf::from(&c.key)));
    }
    let certificates = crate::config::certs::CertSet::load(&pairs)
        .map_err(|(i, field, reason)| (format!("tls.certificates[{i}].{field}"), reason))?;
    Ok(TlsSettings {
        listen,
        min_version,
        certificates,
    })
}

fn key_source(path: &str, key: &str, client_ip: bool) -> VResult<PolicyKey> {
    Ok(PolicyKey::Source(match key.split_once(':') {
        Some(("header", name)) => match http::HeaderName::from_bytes(name.as_bytes()) {
            Ok(h) => KeySource::Header(h),
            Err(_) => return err(path, format!("invalid header name {name:?}")),
        },
        Some(("query", name)) if !name.is_empty() => KeySource::Query(name.to_string()),
        None if key == "bearer" => KeySource::Bearer,
        None if client_ip && key == "client_ip" => return Ok(PolicyKey::ClientIp),
        _ => {
            let also = if client_ip { ", client_ip" } else { "" };
            return err(
                path,
                format!("invalid key {key:?}: expected header:NAME, query:NAME, bearer{also}"),
            );
        }
    }))
}

/// A policy name for the `RateLimit-Policy` / `RateLimit` fields.
fn policy_name(path: &str, name: &str) -> VResult<()> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b'"') {
        return err(path, "must be printable ASCII without quotes or spaces");
    }
    Ok(())
}

/// Per-key overrides (`keys`) of a policy at `path`.
fn key_overrides(path: &str, keys: &BTreeMap<String, u64>, max_key_bytes: usize) -> VResult<()> {
    for (k, v) in keys {
        let path = format!("{path}.{k}");
        if k.is_empty() || k.len() > max_key_bytes {
            return err(path, "key must be 1..=max_key_bytes bytes long");
        }
        range(&path, *v, 1, MAX_COUNT, "requests")?;
    }
    Ok(())
}

fn validate_policies(r: &RateLimitSection) -> VResult<Vec<RatePolicySettings>> {
    if r.policies.len() > crate::ratelimit::MAX_POLICIES {
        return err(
            format!("rate_limit.policies[{}]", crate::ratelimit::MAX_POLICIES),
            format!("at most {} policies", crate::ratelimit::MAX_POLICIES),
        );
    }
    let mut out: Vec<RatePolicySettings> = Vec::with_capacity(r.policies.len());
    for (i, p) in r.policies.iter().enumerate() {
        let at = |k: &str| format!("rate_limit.policies[{i}].{k}");
        policy_name(&at("name"), &p.name)?;
        if out.iter().any(|o| *o.name == *p.name) || (r.enabled && p.name == r.policy_name) {
            return err(
                at("name"),
                format!(
                    "duplicate policy name {:?} (names must be unique, also against rate_limit.policy_name)",
                    p.name
                ),
            );
        }
        let key = key_source(&at("key"), &p.key, true)?;
        range(&at("limit"), p.limit, 1, MAX_COUNT, "requests")?;
        range(&at("window_seconds"), p.window_seconds, 1, DAY, "seconds")?;
        if !p.path_prefix.starts_with('/') {
            return err(at("path_prefix"), "must start with /");
        }
        key_overrides(&at("keys"), &p.keys, r.max_key_bytes)?;
        out.push(RatePolicySettings {
            name: p.name.as_str().into(),
            key,
            path_prefix: p.path_prefix.clone(),
            params: RateLimitParams {
                window_secs: p.window_seconds,
                limit: p.limit,
                overrides: p.keys.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                max_key_bytes: r.max_key_bytes,
                max_tracked_keys: r.max_tracked_keys,
            },
        });
    }
    Ok(out)
}

fn validate_rate_limit(r: &RateLimitSection) -> VResult<RateLimitSettings> {
    let PolicyKey::Source(key) = key_source("rate_limit.key", &r.key, false)? else {
        return err(
            "rate_limit.key",
            "client_ip is a key of [[rate_limit.policies]] only",
        );
    };
    range(
        "rate_limit.window_seconds",
        r.window_seconds,
        1,
        DAY,
        "seconds",
    )?;
    range("rate_limit.limit", r.limit, 1, MAX_COUNT, "requests")?;
    range(
        "rate_limit.max_key_bytes",
        r.max_key_bytes as u64,
        1,
        8192,
        "bytes",
    )?;
    range(
        "rate_limit.max_tracked_keys",
        r.max_tracked_keys as u64,
        16,
        100_000_000,
        "keys",
    )?;
    policy_name("rate_limit.policy_name", &r.policy_name)?;
    key_overrides("rate_limit.keys", &r.keys, r.max_key_bytes)?;
    let policies = validate_policies(r)?;
    Ok(RateLimitSettings {
        enabled: r.enabled,
        source: key,
        missing_key: match r.missing_key {
            MissingKeySection::ClientIp => MissingKey::ClientIp,
            MissingKeySection::Reject => MissingKey::Reject,
            MissingKeySection::Allow => MissingKey::Allow,
        },
        headers: r.headers,
        policy_name: r.policy_name.as_str().into(),
        params: RateLimitParams {
            window_secs: r.window_seconds,
            limit: r.limit,
            overrides: r.keys.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            max_key_bytes: r.max_key_bytes,
            max_tracked_keys: r.max_tracked_keys,
        },
        keys: r.keys.clone(),
        policies,
    })
}

fn validate_culling(c: &CullingSection) -> VResult<CullingSettings> {
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
        },
        webhook_url: c.webhook_url.clone(),
    })
}

fn validate_watchdog(w: &WatchdogSection) -> VResult<WatchdogSettings> {
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

fn validate_access_log(a: &AccessLogSection) -> VResult<AccessLogSettings> {
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
    Ok(AccessLogSettings {
        enabled: a.enabled,
        path: (!a.path.is_empty()).then(|| PathBuf::from(&a.path)),
        sample: a.sample,
        queue_lines: a.queue_lines,
    })
}

fn validate_tracing(t: &TracingSection) -> VResult<TracingSettings> {
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
