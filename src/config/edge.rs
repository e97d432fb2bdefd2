//! Validation of the edge keys (CONTRACT §7): `server.trusted_proxies`,
//! `proxy_protocol`, the client limits and the per-route header rules.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

use super::check::{err, range, VResult};
use super::schema::{ActionSection, HeaderRulesSection, RouteSection, ServerSection};
use super::settings::{RateLimitSettings, RouteAction};
use crate::edge::rules::Location;
use crate::edge::{
    headers::{is_managed, FieldRules},
    HeaderRules, TrustedProxies,
};

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
    let mut request = FieldRules {
        set: set(i, "request_headers_set", &r.request_headers_set)?,
        add: Vec::new(),
        remove: remove(i, "request_headers_remove", &r.request_headers_remove)?,
    };
    let mut response = FieldRules {
        set: set(i, "response_headers_set", &r.response_headers_set)?,
        add: Vec::new(),
        remove: remove(i, "response_headers_remove", &r.response_headers_remove)?,
    };
    table(i, "request_headers", &r.request_headers, &mut request)?;
    table(i, "response_headers", &r.response_headers, &mut response)?;
    Ok(HeaderRules { request, response })
}

/// The `request_headers` / `response_headers` table, after the older keys' rules.
fn table(i: usize, key: &str, t: &HeaderRulesSection, into: &mut FieldRules) -> VResult<()> {
    into.set.extend(set(i, &format!("{key}.set"), &t.set)?);
    into.add.extend(set(i, &format!("{key}.add"), &t.add)?);
    into.remove
        .extend(remove(i, &format!("{key}.remove"), &t.remove)?);
    Ok(())
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

/// `action`, `status` and `location` of the `i`th route.
pub(super) fn validate_action(i: usize, r: &RouteSection) -> VResult<RouteAction> {
    let at = |k: &str| format!("routes[{i}].{k}");
    match r.action {
        ActionSection::Proxy => {
            if r.status != 0 {
                return err(at("status"), "only for action = \"deny\" or \"redirect\"");
            }
            if !r.location.is_empty() {
                return err(at("location"), "only for action = \"redirect\"");
            }
            Ok(RouteAction::Proxy)
        }
        ActionSection::Deny => {
            if !r.location.is_empty() {
                return err(at("location"), "only for action = \"redirect\"");
            }
            let status = if r.status == 0 { 403 } else { r.status };
            if !(400..=599).contains(&status) {
                return err(
                    at("status"),
                    format!("{status} is not an error status (400 to 599)"),
                );
            }
            Ok(RouteAction::Deny(status))
        }
        ActionSection::Redirect => {
            let status = if r.status == 0 { 302 } else { r.status };
            if ![301, 302, 303, 307, 308].contains(&status) {
                return err(
                    at("status"),
                    format!("{status} is not a redirect status (301, 302, 303, 307 or 308)"),
                );
            }
            if r.location.is_empty() {
                return err(at("location"), "action = \"redirect\" needs a location");
            }
            match Location::parse(&r.location) {
                Ok(l) => Ok(RouteAction::Redirect(status, l)),
                Err(why) => err(at("location"), format!("{:?} {why}", r.location)),
            }
        }
    }
}

/// `methods` (upper-case tokens) and `client_cidrs` of the `i`th route.
pub(super) fn validate_conditions(
    i: usize,
    r: &RouteSection,
) -> VResult<(Vec<http::Method>, Option<TrustedProxies>)> {
    let mut methods = Vec::with_capacity(r.methods.len());
    for (j, m) in r.methods.iter().enumerate() {
        let ok = !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase() || b == b'-');
        match http::Method::from_bytes(m.as_bytes()) {
            Ok(method) if ok => methods.push(method),
            _ => {
                return err(
                    format!("routes[{i}].methods[{j}]"),
                    format!("{m:?} is not a method (upper case, as GET or POST)"),
                )
            }
        }
    }
    for (j, e) in r.client_cidrs.iter().enumerate() {
        if let Err(why) = TrustedProxies::parse(&[e]) {
            return err(format!("routes[{i}].client_cidrs[{j}]"), why);
        }
    }
    let cidrs = if r.client_cidrs.is_empty() {
        None
    } else {
        TrustedProxies::parse(&r.client_cidrs)
            .map_err(|why| (format!("routes[{i}].client_cidrs"), why))
            .map(Some)?
    };
    Ok((methods, cidrs))
}

/// `rate_limit_policies` of the `i`th route as a mask over the runtime's policies: bit 0
/// the `[rate_limit]` policy, bit `k + 1` `[[rate_limit.policies]]`'s `k`th.
pub(super) fn validate_route_policies(
    i: usize,
    r: &RouteSection,
    rl: &RateLimitSettings,
) -> VResult<u64> {
    if r.rate_limit_policies.is_empty() {
        return Ok(u64::MAX);
    }
    let mut mask = 0u64;
    for (j, name) in r.rate_limit_policies.iter().enumerate() {
        let bit = if rl.enabled && *rl.policy_name == **name {
            Some(0)
        } else {
            rl.policies
                .iter()
                .position(|p| *p.name == **name)
                .map(|k| k + 1)
        };
        match bit {
            Some(b) => mask |= 1u64.checked_shl(b as u32).unwrap_or(0),
            None => {
                return err(
                    format!("routes[{i}].rate_limit_policies[{j}]"),
                    format!("{name:?} names no [[rate_limit.policies]] entry (nor the [rate_limit] policy_name)"),
                )
            }
        }
    }
    Ok(mask)
}
