//! The primitives every section's validation shares: the error type (`(key_path,
//! reason)`; the caller adds file and line:column), ranges with their units, addresses,
//! and the upper bounds of durations and counts.

use std::net::{SocketAddr, ToSocketAddrs};

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
