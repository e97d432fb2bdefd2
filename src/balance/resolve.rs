//! Backends given as hostnames: resolution (IPv4 addresses when there are
//! any, else IPv6, all of them, in order) and the loop that re-resolves every
//! `resolve_interval_seconds` and applies a change the way a reload does
//! (backends that stay keep their state).

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, Upstream};
use crate::state::Shared;

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

/// The backend list and weights of `u` from freshly resolved entries; `None`
/// when an entry does not resolve now (keep what we have) or nothing changed.
pub fn re_resolve(u: &Upstream) -> Option<(Vec<SocketAddr>, Vec<u32>)> {
    let mut backends = Vec::new();
    let mut weights = Vec::new();
    for (entry, w) in &u.entries {
        match resolve_entry(entry) {
            Ok(addrs) if !addrs.is_empty() => {
                for a in addrs {
                    if !backends.contains(&a) {
                        backends.push(a);
                        weights.push(*w);
                    }
                }
            }
            Ok(_) | Err(_) => {
                tracing::warn!(upstream = %u.name, backend = %entry, "backend does not resolve; keeping the last addresses");
                return None;
            }
        }
    }
    let weighted = !u.balance.weights.is_empty();
    let same = backends == u.backends && (!weighted || weights == u.balance.weights);
    (!same).then_some((backends, if weighted { weights } else { Vec::new() }))
}

/// The config with every hostname re-resolved, or `None` when nothing changed. The
/// config (all its routes too) is copied only when an address changed.
pub fn refreshed(config: &Config) -> Option<Config> {
    let changes: Vec<_> = config
        .upstreams
        .iter()
        .enumerate()
        .filter(|(_, u)| !u.entries.iter().all(|(e, _)| is_literal(e)))
        .filter_map(|(i, u)| re_resolve(u).map(|change| (i, change)))
        .collect();
    if changes.is_empty() {
        return None;
    }
    let mut next = config.clone();
    for (i, (backends, weights)) in changes {
        let u = &mut next.upstreams[i];
        tracing::info!(upstream = %u.name, before = ?u.backends, after = ?backends, "backend addresses changed (DNS)");
        u.backends = backends;
        u.balance.weights = weights;
    }
    Some(next)
}

/// The shortest `resolve_interval` of upstreams with hostnames, if any.
pub fn interval(config: &Config) -> Option<Duration> {
    config
        .upstreams
        .iter()
        .filter(|u| u.entries.iter().any(|(e, _)| !is_literal(e)))
        .map(|u| u.balance.resolve_interval)
        .min()
}

/// Re-resolve hostnames forever (a background task of the proxy).
pub async fn run(shared: Arc<Shared>) {
    loop {
        // the runtime as it is now, shared, not a copy of its config (every route in it)
        let rt = shared.runtime.load_full();
        let wait = interval(&rt.config).unwrap_or(Duration::from_secs(5));
        tokio::time::sleep(wait).await;
        if interval(&rt.config).is_none() {
            continue;
        }
        let found = tokio::task::spawn_blocking(move || refreshed(&rt.config)).await;
        if let Ok(Some(next)) = found {
            // Only if no reload happened meanwhile (it resolved afresh itself).
            let current = shared.runtime.load();
            let unchanged = current
                .config
                .upstreams
                .iter()
                .zip(&next.upstreams)
                .all(|(a, b)| a.entries == b.entries);
            if unchanged {
                shared.apply(next);
            }
        }
    }
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

#[cfg(test)]
mod refresh_tests {
    use super::*;

    fn config(backends: &str) -> Config {
        let text = format!("[[upstreams]]\nname = \"app\"\nbackends = [{backends}]\nweights = [3, 1]\nresolve_interval_seconds = 7\n");
        match crate::config::parse("t.toml", &text) {
            Ok(c) => c,
            Err(e) => panic!("{e:?}"),
        }
    }

    #[test]
    fn a_changed_address_is_picked_up_and_literals_are_left_alone() {
        let literal = config("\"127.0.0.1:9001\", \"127.0.0.1:9002\"");
        assert_eq!(interval(&literal), None);
        assert!(refreshed(&literal).is_none());

        let mut named = config("\"localhost:9001\", \"127.0.0.1:9002\"");
        assert_eq!(interval(&named), Some(Duration::from_secs(7)));
        assert!(refreshed(&named).is_none(), "nothing changed yet");
        // As if localhost had resolved elsewhere at the last resolution.
        named.upstreams[0].backends[0] =
            "127.0.0.2:9001".parse().unwrap_or_else(|_| unreachable!());
        let next = refreshed(&named).unwrap_or_else(|| panic!("change not seen"));
        let u = &next.upstreams[0];
        assert_eq!(u.backends[0].to_string(), "127.0.0.1:9001");
        assert_eq!(u.backends[1].to_string(), "127.0.0.1:9002");
        assert_eq!(u.balance.weights, vec![3, 1]);
    }
}
