//! The primitives every section's validation shares: the error type (`(key_path,
//! reason)`; the caller adds file and line:column), ranges with their units, addresses,
//! and the upper bounds of durations and counts.

use std::net::SocketAddr;

pub(super) type VResult<T> = Result<T, (String, String)>;

pub(super) fn err<T>(path: impl Into<String>, reason: impl Into<String>) -> VResult<T> {
    Err((path.into(), reason.into()))
}

/// A list of listen addresses at `path` (`server.listen`, `tls.listen`): at
/// least one, no duplicates.
pub(super) fn listen_addrs(path: &str, list: &[String]) -> VResult<Vec<SocketAddr>> {
    if list.is_empty() {
        return err(path, "at least one listen address is required");
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, l) in list.iter().enumerate() {
        let a = parse_addr(&format!("{path}[{i}]"), l)?;
        if out.contains(&a) {
            return err(
                format!("{path}[{i}]"),
                format!("duplicate listen address {l}"),
            );
        }
        out.push(a);
    }
    Ok(out)
}

/// A listen address: `ip:port`, `[v6]:port` or `localhost:port` (the loopback address,
/// RFC 6761). No other name: validation never asks DNS (resolution belongs to the
/// runtime, and a listener bound to whatever a name resolved to at start is a surprise).
pub(super) fn parse_addr(path: &str, s: &str) -> VResult<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let (host, port) = host_port(path, s)?;
    if host.eq_ignore_ascii_case("localhost") {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    err(
        path,
        format!(
            "invalid address {s:?}: a listen address is an IP address and a port \
             (0.0.0.0:8080, [::]:8080, 127.0.0.1:8080) or localhost:PORT"
        ),
    )
}

/// `host:port` as written: a port from 1 to 65535 and a host name of DNS labels
/// (letters, digits, `-`, `_`), checked without asking DNS.
pub(super) fn host_port<'a>(path: &str, s: &'a str) -> VResult<(&'a str, u16)> {
    let bad = |why: &str| err(path, format!("invalid address {s:?}: {why}"));
    let Some((host, port)) = s.rsplit_once(':') else {
        return bad("expected host:port");
    };
    let port = match port.parse::<u16>() {
        Ok(p) if p > 0 => p,
        _ => return bad("the port must be a number from 1 to 65535"),
    };
    let name = host.strip_suffix('.').unwrap_or(host);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return bad("expected host:port, the host an IP address or a DNS name");
    }
    Ok((host, port))
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
