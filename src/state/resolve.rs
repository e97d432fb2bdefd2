//! The runtime's re-resolution of backends given as hostnames: every
//! `resolve_interval_seconds`, a change is applied the way a reload does (backends that
//! stay keep their state).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::resolve::{is_literal, resolve_entry};
use crate::config::{Config, Upstream};
use crate::state::Shared;

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
