//! Backends given as DNS names, resolved by the runtime (validation only checks how they
//! are written): once when a config is loaded (start, `--check`, reload: [`load`]), then
//! every `resolve_interval_seconds` ([`run`]), a change applied the way a reload does
//! (backends that stay keep their state). A name gives all its addresses of one family:
//! IPv4 when there are any, else IPv6, in order.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, ConfigError, Upstream};
use crate::state::Shared;

/// True for `ip:port` / `[v6]:port`: nothing to resolve.
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

/// Read and validate the config file, then resolve its backend names: what the proxy
/// starts, checks (`--check`) and reloads with. A name that does not resolve, two
/// entries giving one address, or a `shard_size` over the addresses is an error at
/// the entry's key path and line.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let config = crate::config::load(path)?;
    resolve(config).map_err(|(key, why)| crate::config::error_at(path, &key, &why))
}

/// `config` with the addresses of every upstream that has names; an error is
/// `(key_path, reason)`.
pub fn resolve(mut config: Config) -> Result<Config, (String, String)> {
    for (i, u) in config.upstreams.iter_mut().enumerate() {
        if u.entries.iter().all(|(e, _)| is_literal(e)) {
            continue;
        }
        let (backends, weights, hosts) = addresses(i, u)?;
        if u.balance.shard_size > backends.len() {
            return Err((
                format!("upstreams[{i}].shard_size"),
                format!(
                    "{} is out of range: must be between 0 and {} backends (the addresses its entries resolve to)",
                    u.balance.shard_size,
                    backends.len()
                ),
            ));
        }
        u.backends = backends;
        u.hosts = hosts;
        u.balance.weights = if u.weighted { weights } else { Vec::new() };
    }
    Ok(config)
}

/// Addresses, their weights and the entries they came from (aligned).
type Resolved = (Vec<SocketAddr>, Vec<u32>, Vec<String>);

/// Every address of the `i`th upstream's entries with its entry's weight and the entry;
/// no address twice.
fn addresses(i: usize, u: &Upstream) -> Result<Resolved, (String, String)> {
    let mut backends = Vec::new();
    let mut weights = Vec::new();
    let mut hosts = Vec::new();
    for (j, (entry, w)) in u.entries.iter().enumerate() {
        let path = || format!("upstreams[{i}].backends[{j}]");
        let addrs = match resolve_entry(entry) {
            Ok(a) if !a.is_empty() => a,
            Ok(_) => return Err((path(), format!("{entry} resolves to no address"))),
            Err(e) => return Err((path(), format!("{entry} does not resolve: {e}"))),
        };
        for a in addrs {
            if backends.contains(&a) {
                return Err((
                    path(),
                    format!("duplicate backend {a} ({entry} resolves to an address given before)"),
                ));
            }
            backends.push(a);
            weights.push(*w);
            hosts.push(entry.clone());
        }
    }
    Ok((backends, weights, hosts))
}

/// The backend list, weights and entries of `u` from freshly resolved entries; `None`
/// when an entry does not resolve now (keep what we have) or nothing changed.
pub fn re_resolve(u: &Upstream) -> Option<Resolved> {
    let mut backends = Vec::new();
    let mut weights = Vec::new();
    let mut hosts = Vec::new();
    for (entry, w) in &u.entries {
        match resolve_entry(entry) {
            Ok(addrs) if !addrs.is_empty() => {
                for a in addrs {
                    if !backends.contains(&a) {
                        backends.push(a);
                        weights.push(*w);
                        hosts.push(entry.clone());
                    }
                }
            }
            Ok(_) | Err(_) => {
                tracing::warn!(upstream = %u.name, backend = %entry, "backend does not resolve; keeping the last addresses");
                return None;
            }
        }
    }
    let same = backends == u.backends && (!u.weighted || weights == u.balance.weights);
    (!same).then_some((
        backends,
        if u.weighted { weights } else { Vec::new() },
        hosts,
    ))
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
    for (i, (backends, weights, hosts)) in changes {
        let u = &mut next.upstreams[i];
        tracing::info!(upstream = %u.name, before = ?u.backends, after = ?backends, "backend addresses changed (DNS)");
        u.backends = backends;
        u.hosts = hosts;
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
        // Not held across the wait: a reload meanwhile must be able to free the table it
        // replaces (every route in it) at once.
        let wait = interval(&shared.runtime.load().config).unwrap_or(Duration::from_secs(5));
        tokio::time::sleep(wait).await;
        // the runtime as it is now, shared, not a copy of its config (every route in it)
        let rt = shared.runtime.load_full();
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
        match crate::config::parse("t.toml", &text).map_err(|e| e.to_string()) {
            Ok(c) => resolve(c).unwrap_or_else(|e| panic!("{e:?}")),
            Err(e) => panic!("{e}"),
        }
    }

    fn resolve_err(text: &str) -> (String, String) {
        match crate::config::parse("t.toml", text) {
            Ok(c) => resolve(c)
                .err()
                .unwrap_or_else(|| panic!("resolved: {text}")),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn literal_and_family() {
        assert!(is_literal("127.0.0.1:80"));
        assert!(is_literal("[::1]:80"));
        assert!(!is_literal("localhost:80"));
        let v6: SocketAddr = "[::1]:80".parse().unwrap_or_else(|_| unreachable!());
        let v4: SocketAddr = "127.0.0.1:80".parse().unwrap_or_else(|_| unreachable!());
        assert_eq!(pick_family([v6, v4, v4]), vec![v4]);
        assert_eq!(pick_family([v6]), vec![v6]);
        assert_eq!(resolve_entry("localhost:81").ok(), Some(vec![v4_81()]));
    }

    fn v4_81() -> SocketAddr {
        "127.0.0.1:81".parse().unwrap_or_else(|_| unreachable!())
    }

    #[test]
    fn validation_leaves_names_to_the_runtime_which_resolves_them() {
        let text =
            "[[upstreams]]\nname = \"app\"\nbackends = [\"localhost:81\", \"127.0.0.1:82\"]\n";
        let parsed = crate::config::parse("t.toml", text).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            parsed.upstreams[0].backends.is_empty(),
            "validation asked DNS"
        );
        let c = resolve(parsed).unwrap_or_else(|e| panic!("{e:?}"));
        let got: Vec<String> = c.upstreams[0]
            .backends
            .iter()
            .map(|a| a.to_string())
            .collect();
        assert_eq!(got, ["127.0.0.1:81", "127.0.0.1:82"]);
        assert!(
            c.upstreams[0].balance.weights.is_empty(),
            "no weights were set"
        );
    }

    #[test]
    fn resolution_errors_name_the_entry() {
        let up = |b: &str, extra: &str| {
            format!("[[upstreams]]\nname = \"app\"\nbackends = [{b}]\n{extra}")
        };
        let (key, why) = resolve_err(&up("\"127.0.0.1:81\", \"no-such-host.invalid:80\"", ""));
        assert_eq!(key, "upstreams[0].backends[1]");
        assert!(why.contains("no-such-host.invalid:80"), "{why}");
        let (key, why) = resolve_err(&up("\"127.0.0.1:81\", \"localhost:81\"", ""));
        assert_eq!(key, "upstreams[0].backends[1]");
        assert!(why.contains("duplicate backend 127.0.0.1:81"), "{why}");
        let (key, why) = resolve_err(&up("\"localhost:81\"", "shard_size = 2\n"));
        assert_eq!(key, "upstreams[0].shard_size");
        assert!(why.contains("between 0 and 1"), "{why}");
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
