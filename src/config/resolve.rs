//! Backend entries given as hostnames: resolution to addresses (IPv4 addresses when there
//! are any, else IPv6, all of them, in order). Loading a config resolves them; the runtime
//! re-resolves them every `resolve_interval_seconds` (`state::resolve`).

use std::net::{SocketAddr, ToSocketAddrs};

/// True for `ip:port` / `[v6]:port`: nothing to re-resolve.
pub fn is_literal(entry: &str) -> bool {
    entry.parse::<SocketAddr>().is_ok()
}

/// Keep one address family: IPv4 when present (`localhost` must not also
/// become `[::1]`), else IPv6; duplicates dropped, order kept.
pub fn pick_family(addrs: impl IntoIterator<Item = SocketAddr>) -> Vec<SocketAddr> {
    let all: Vec<SocketAddr> = addrs.into_iter().collect();
    let v4 = all.iter().any(SocketAddr::is_ipv4);
    let mut out: Vec<SocketAddr> = Vec::new();
    for a in all {
        if a.is_ipv4() == v4 && !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

/// Resolve one `host:port` entry (blocking; call off the request path).
pub fn resolve_entry(entry: &str) -> std::io::Result<Vec<SocketAddr>> {
    if let Ok(a) = entry.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    Ok(pick_family(entry.to_socket_addrs()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_and_family() {
        assert!(is_literal("127.0.0.1:80"));
        assert!(is_literal("[::1]:80"));
        assert!(!is_literal("localhost:80"));
        let v6: SocketAddr = "[::1]:80".parse().unwrap_or_else(|_| unreachable!());
        let v4: SocketAddr = "127.0.0.1:80".parse().unwrap_or_else(|_| unreachable!());
        assert_eq!(pick_family([v6, v4, v4]), vec![v4]);
        assert_eq!(pick_family([v6]), vec![v6]);
        assert_eq!(
            resolve_entry("localhost:81").ok(),
            Some(vec!["127.0.0.1:81"
                .parse()
                .unwrap_or_else(|_| unreachable!())])
        );
    }
}
