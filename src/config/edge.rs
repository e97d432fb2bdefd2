//! Validation of the edge keys (CONTRACT §7): `server.trusted_proxies`,
//! `proxy_protocol`, the client limits and the per-route header rules.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

use super::check::{err, range, VResult};
use super::schema::{RouteSection, ServerSection};
use crate::edge::{headers::is_managed, HeaderRules, TrustedProxies};

const HOUR_MS: u64 = 3_600_000;

pub(super) struct ServerEdge {
    pub trusted_proxies: TrustedProxies,
    pub client_header_timeout: Duration,
    pub client_body_timeout: Duration,
    pub idle_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    pub tunnel_idle_timeout: Duration,
}

pub(super) fn validate_server_edge(s: &ServerSection) -> VResult<ServerEdge> {
    let trusted_proxies = trusted_peers(s)?;
    client_limits(s)?;
    connection_limits(s)?;
    Ok(ServerEdge {
        tunnel_idle_timeout: Duration::from_secs(s.tunnel_idle_timeout_seconds),
        trusted_proxies,
        client_header_timeout: Duration::from_millis(s.client_header_timeout_ms),
        client_body_timeout: Duration::from_millis(s.client_body_timeout_ms),
        idle_timeout: Duration::from_millis(s.idle_timeout_ms),
        tls_handshake_timeout: Duration::from_millis(s.tls_handshake_timeout_ms),
    })
}

/// `trusted_proxies`, each entry checked on its own, and `proxy_protocol`, which
/// needs them.
fn trusted_peers(s: &ServerSection) -> VResult<TrustedProxies> {
    let mut trusted = Vec::with_capacity(s.trusted_proxies.len());
    for (i, e) in s.trusted_proxies.iter().enumerate() {
        match TrustedProxies::parse(&[e]) {
            Ok(_) => trusted.push(e.as_str()),
            Err(why) => return err(format!("server.trusted_proxies[{i}]"), why),
        }
    }
    let trusted_proxies = TrustedProxies::parse(&trusted).map_err(|why| {
        (
            "server.trusted_proxies".to_string(),
            why, // unreachable: every entry parsed above
        )
    })?;
    if s.proxy_protocol && trusted_proxies.is_empty() {
        return err(
            "server.proxy_protocol",
            "needs server.trusted_proxies: a PROXY header is accepted only from a trusted peer",
        );
    }
    Ok(trusted_proxies)
}

/// The client limits: request body size, header and body timeouts, connections.
fn client_limits(s: &ServerSection) -> VResult<()> {
    range(
        "server.max_request_body_bytes",
        s.max_request_body_bytes,
        1,
        1 << 40,
        "bytes",
    )?;
    range(
        "server.client_header_timeout_ms",
        s.client_header_timeout_ms,
        1,
        HOUR_MS,
        "ms",
    )?;
    range(
        "server.client_body_timeout_ms",
        s.client_body_timeout_ms,
        1,
        HOUR_MS,
        "ms",
    )?;
    range(
        "server.max_connections",
        s.max_connections as u64,
        1,
        10_000_000,
        "",
    )
}

/// Issue 40, connections (CONTRACT §17): idle and handshake timeouts, admin
/// connections, HTTP/2 glitches, idle tunnels.
fn connection_limits(s: &ServerSection) -> VResult<()> {
    range(
        "server.idle_timeout_ms",
        s.idle_timeout_ms,
        1,
        HOUR_MS,
        "ms",
    )?;
    range(
        "server.tls_handshake_timeout_ms",
        s.tls_handshake_timeout_ms,
        1,
        HOUR_MS,
        "ms",
    )?;
    range(
        "server.admin_max_connections",
        s.admin_max_connections as u64,
        1,
        1_000_000,
        "",
    )?;
    range(
        "server.h2_max_glitches",
        u64::from(s.h2_max_glitches),
        1,
        1_000_000,
        "",
    )?;
    range(
        "server.tunnel_idle_timeout_seconds",
        s.tunnel_idle_timeout_seconds,
        1,
        7 * 24 * 3600,
        "seconds",
    )
}

pub(super) fn validate_header_rules(i: usize, r: &RouteSection) -> VResult<HeaderRules> {
    Ok(HeaderRules {
        request_set: set(i, "request_headers_set", &r.request_headers_set)?,
        request_remove: remove(i, "request_headers_remove", &r.request_headers_remove)?,
        response_set: set(i, "response_headers_set", &r.response_headers_set)?,
        response_remove: remove(i, "response_headers_remove", &r.response_headers_remove)?,
    })
}

fn name(path: String, n: &str) -> VResult<HeaderName> {
    let Ok(h) = HeaderName::from_bytes(n.as_bytes()) else {
        return err(path, format!("{n:?} is not a header name"));
    };
    if is_managed(&h) {
        return err(
            path,
            format!("{n:?} is managed by the proxy (framing or hop-by-hop)"),
        );
    }
    Ok(h)
}

fn set(
    i: usize,
    key: &str,
    m: &BTreeMap<String, String>,
) -> VResult<Vec<(HeaderName, HeaderValue)>> {
    let mut out = Vec::with_capacity(m.len());
    for (n, v) in m {
        let path = format!("routes[{i}].{key}.{n}");
        let h = name(path.clone(), n)?;
        let Ok(value) = HeaderValue::from_str(v) else {
            return err(path, "value must be visible ASCII, spaces or tabs");
        };
        out.push((h, value));
    }
    Ok(out)
}

fn remove(i: usize, key: &str, names: &[String]) -> VResult<Vec<HeaderName>> {
    names
        .iter()
        .enumerate()
        .map(|(j, n)| name(format!("routes[{i}].{key}[{j}]"), n))
        .collect()
}
