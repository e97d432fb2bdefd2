//! Validation of `[[upstreams]]` (backends, balancing, retries, shards) and
//! `[[routes]]` into settings; the rest of the file is in `validate.rs`.

use super::check::{err, host_port, range, VResult, DAY, DAY_MS, HOUR, MINUTE_MS};
use super::schema::*;
use super::settings::*;
use portcullis_policy::shed::Priority;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

pub(super) fn validate_upstreams(ups: &[UpstreamSection]) -> VResult<Vec<Upstream>> {
    if ups.is_empty() {
        return err("upstreams", "at least one [[upstreams]] entry is required");
    }
    let mut names = HashSet::new();
    let mut out = Vec::with_capacity(ups.len());
    for (i, u) in ups.iter().enumerate() {
        out.push(validate_upstream(i, u, &mut names)?);
    }
    Ok(out)
}

/// One `[[upstreams]]` entry, the `i`th; `names` holds the names seen before it.
fn validate_upstream<'a>(
    i: usize,
    u: &'a UpstreamSection,
    names: &mut HashSet<&'a str>,
) -> VResult<Upstream> {
    let p = |k: &str| format!("upstreams[{i}].{k}");
    if u.name.is_empty() {
        return err(p("name"), "must not be empty");
    }
    if !names.insert(u.name.as_str()) {
        return err(p("name"), format!("duplicate upstream name {:?}", u.name));
    }
    let (backends, weights, entries) = validate_backends(i, u)?;
    let meta = validate_meta(i, u)?;
    // Names are resolved by the runtime, which checks `shard_size` against what they give.
    let resolved = (backends.len() == entries.len()).then_some(backends.len());
    let balance = validate_balance(i, u, weights, resolved)?;
    validate_health_and_timeouts(u, &p)?;
    let health = super::health::validate_health_check(u, &p)?;
    let transport = validate_transport(u, &p)?;
    let hosts = if backends.len() == entries.len() {
        entries.iter().map(|(e, _)| e.clone()).collect()
    } else {
        Vec::new()
    };
    Ok(Upstream {
        name: u.name.clone(),
        backends,
        hosts,
        health_check_path: health.as_ref().map(|h| h.path.clone()).unwrap_or_default(),
        health_check_interval: health
            .as_ref()
            .map_or(Duration::from_secs(u.health_check_interval_seconds), |h| {
                Duration::from_millis(h.thresholds.interval_ms)
            }),
        health,
        connect_timeout: Duration::from_millis(u.connect_timeout_ms),
        read_timeout: Duration::from_millis(u.read_timeout_ms),
        groups: validate_groups(i, u)?,
        entries,
        meta,
        weighted: !u.weights.is_empty()
            || u.backends
                .iter()
                .any(|b| matches!(b, BackendEntrySection::Table(t) if t.weight.is_some())),
        transport,
        balance,
    })
}

/// The addresses of an upstream's backends, their weights (empty when `weights` is not
/// set) and the entries as written with their weight. With any entry a DNS name, the
/// addresses and weights are empty: the runtime fills them (`state::resolve`).
type Backends = (Vec<SocketAddr>, Vec<u32>, Vec<(String, u32)>);

/// `backends` and `weights`: at least one backend, one weight per backend or
/// none (or each table's own `weight`, not both), no address or name twice, at least
/// one backend that is not a backup.
fn validate_backends(i: usize, u: &UpstreamSection) -> VResult<Backends> {
    if u.backends.is_empty() {
        return err(
            format!("upstreams[{i}].backends"),
            "at least one backend is required",
        );
    }
    if !u.weights.is_empty() && u.weights.len() != u.backends.len() {
        return err(
            format!("upstreams[{i}].weights"),
            format!(
                "has {} entries for {} backends: give one weight per backend (or none)",
                u.weights.len(),
                u.backends.len()
            ),
        );
    }
    for (j, w) in u.weights.iter().enumerate() {
        range(&format!("upstreams[{i}].weights[{j}]"), *w, 1, 1000, "")?;
    }
    let table_weights = table_weights(i, u)?;
    let mut backends = Vec::with_capacity(u.backends.len());
    let mut weights = Vec::new();
    let mut entries = Vec::with_capacity(u.backends.len());
    for (j, entry) in u.backends.iter().enumerate() {
        let b = entry.address();
        let path = format!("upstreams[{i}].backends[{j}]");
        let path = if matches!(entry, BackendEntrySection::Table(_)) {
            format!("{path}.address")
        } else {
            path
        };
        let w = u
            .weights
            .get(j)
            .map(|w| *w as u32)
            .or(table_weights.as_ref().map(|t| t[j]))
            .unwrap_or(1);
        if let Some(a) = parse_backend(&path, b)? {
            if backends.contains(&a) {
                return err(path, format!("duplicate backend {b}"));
            }
            backends.push(a);
            weights.push(w);
        } else if entries
            .iter()
            .any(|(e, _): &(String, u32)| e.eq_ignore_ascii_case(b))
        {
            return err(path, format!("duplicate backend {b}"));
        }
        entries.push((b.to_string(), w));
    }
    let weighted = !u.weights.is_empty() || table_weights.is_some();
    if !weighted || backends.len() < entries.len() {
        weights.clear();
    }
    if backends.len() < entries.len() {
        backends.clear();
    }
    Ok((backends, weights, entries))
}

/// The tables' `weight`s, one per backend (1 for a plain entry), when any table has one;
/// with `weights` too it is an error.
fn table_weights(i: usize, u: &UpstreamSection) -> VResult<Option<Vec<u32>>> {
    let mut any = false;
    let mut out = Vec::with_capacity(u.backends.len());
    for (j, entry) in u.backends.iter().enumerate() {
        let w = match entry {
            BackendEntrySection::Table(t) => t.weight,
            BackendEntrySection::Address(_) => None,
        };
        if let Some(w) = w {
            let path = format!("upstreams[{i}].backends[{j}].weight");
            if !u.weights.is_empty() {
                return err(path, "weights is set too: give each weight in one place");
            }
            range(&path, w, 1, 1000, "")?;
            any = true;
        }
        out.push(w.map_or(1, |w| w as u32));
    }
    Ok(any.then_some(out))
}

/// Each entry's name, `max_conn` and `backup` (aligned with `backends`): names of
/// letters, digits, `_`, `-`, `.` and `:`, unique in the upstream and not another
/// backend's address; at least one backend that is not a backup.
fn validate_meta(i: usize, u: &UpstreamSection) -> VResult<Vec<BackendMeta>> {
    let mut out: Vec<BackendMeta> = Vec::with_capacity(u.backends.len());
    for (j, entry) in u.backends.iter().enumerate() {
        let BackendEntrySection::Table(t) = entry else {
            out.push(BackendMeta::default());
            continue;
        };
        let path = |k: &str| format!("upstreams[{i}].backends[{j}].{k}");
        if !t.name.is_empty() {
            let ok = t.name.len() <= 64
                && t.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
            if !ok {
                return err(
                    path("name"),
                    "a backend's name is 1 to 64 letters, digits, '_', '-', '.' or ':'",
                );
            }
            let clash = out
                .iter()
                .any(|m| m.name.as_deref() == Some(t.name.as_str()))
                || u.backends
                    .iter()
                    .enumerate()
                    .any(|(k, e)| k != j && e.address() == t.name);
            if clash {
                return err(
                    path("name"),
                    format!("{:?} names another backend of this upstream", t.name),
                );
            }
        }
        range(&path("max_conn"), t.max_conn, 0, 10_000_000, "")?;
        out.push(BackendMeta {
            name: (!t.name.is_empty()).then(|| t.name.clone()),
            max_conn: t.max_conn,
            backup: t.backup,
        });
    }
    if out.iter().all(|m| m.backup) {
        return err(
            format!("upstreams[{i}].backends"),
            "every backend is a backup: at least one must not be",
        );
    }
    Ok(out)
}

/// `groups`: names of letters, digits, `_`, `-` and `.` (not `global`, nor starting with
/// `upstream:`), each member one of the upstream's `backends` as written.
fn validate_groups(i: usize, u: &UpstreamSection) -> VResult<Vec<(String, Vec<String>)>> {
    let mut out = Vec::with_capacity(u.groups.len());
    for (name, members) in &u.groups {
        let path = format!("upstreams[{i}].groups.{name}");
        let ok = (1..=64).contains(&name.len())
            && name != "global"
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !ok {
            return err(
                path,
                "a group's name is 1 to 64 letters, digits, '_', '-' or '.', and not \"global\"",
            );
        }
        for (j, m) in members.iter().enumerate() {
            let named = |e: &BackendEntrySection| match e {
                BackendEntrySection::Table(t) => !t.name.is_empty() && t.name == *m,
                BackendEntrySection::Address(_) => false,
            };
            if !u.backends.iter().any(|b| b.address() == m || named(b)) {
                return err(
                    format!("{path}[{j}]"),
                    format!(
                        "{m:?} is not one of this upstream's backends (write it as in backends)"
                    ),
                );
            }
        }
        // a member given by name is kept as its address, as the budget compares them
        let members = members
            .iter()
            .map(|m| {
                u.backends
                    .iter()
                    .find(|b| matches!(b, BackendEntrySection::Table(t) if t.name == *m && !t.name.is_empty()))
                    .map_or_else(|| m.clone(), |b| b.address().to_string())
            })
            .collect();
        out.push((name.clone(), members));
    }
    Ok(out)
}

/// `health_check_path`, `health_check_interval_seconds` and the connect and read
/// timeouts.
fn validate_health_and_timeouts(u: &UpstreamSection, p: &dyn Fn(&str) -> String) -> VResult<()> {
    if !u.health_check_path.is_empty() && !u.health_check_path.starts_with('/') {
        return err(p("health_check_path"), "must be empty or start with '/'");
    }
    range(
        &p("health_check_interval_seconds"),
        u.health_check_interval_seconds,
        1,
        DAY,
        "seconds",
    )?;
    range(
        &p("connect_timeout_ms"),
        u.connect_timeout_ms,
        1,
        10 * MINUTE_MS,
        "ms",
    )?;
    range(&p("read_timeout_ms"), u.read_timeout_ms, 1, DAY_MS, "ms")
}

/// A backend entry: an address (`Some`), or a `host:port` whose host is a DNS name
/// (`None`: checked as written; the runtime resolves it, `state::resolve`).
fn parse_backend(path: &str, s: &str) -> VResult<Option<SocketAddr>> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(Some(a));
    }
    host_port(path, s).map(|_| None)
}

/// `shard_size`'s bound for an upstream whose backends are names (not resolved yet).
const MAX_SHARD: u64 = 10_000;

fn validate_balance(
    i: usize,
    u: &UpstreamSection,
    weights: Vec<u32>,
    n_backends: Option<usize>,
) -> VResult<crate::balance::BalanceSettings> {
    use crate::balance::{BalanceSettings, Policy};
    let hash_key = hash_key_of(i, u)?;
    validate_limits(i, u, n_backends)?;
    Ok(BalanceSettings {
        policy: match u.balance {
            BalanceSection::RoundRobin => Policy::RoundRobin,
            BalanceSection::LeastRequests => Policy::LeastRequests,
            BalanceSection::ConsistentHash => Policy::ConsistentHash,
            BalanceSection::Random => Policy::Random,
        },
        hash_key,
        weights,
        retries: u.retries as u32,
        retry_budget_ratio: u.retry_budget_ratio,
        max_inflight: u.max_inflight,
        adaptive: u.adaptive,
        resolve_interval: Duration::from_secs(u.resolve_interval_seconds),
        shard_size: u.shard_size as usize,
        slow_start: Duration::from_secs(u.slow_start_seconds),
        queue_timeout: Duration::from_millis(u.queue_timeout_ms),
        max_queue: u.max_queue,
        fleet_max_inflight: u.fleet_max_inflight,
    })
}

/// `hash_key`: `header:NAME`, `query:NAME`, `bearer`, `client_ip` or `path`.
fn hash_key_of(i: usize, u: &UpstreamSection) -> VResult<crate::balance::HashKey> {
    use crate::balance::HashKey;
    let p = |k: &str| format!("upstreams[{i}].{k}");
    let hash_key = match u.hash_key.split_once(':') {
        Some(("header", name)) => match http::HeaderName::from_bytes(name.as_bytes()) {
            Ok(h) => HashKey::Header(h),
            Err(_) => return err(p("hash_key"), format!("invalid header name {name:?}")),
        },
        Some(("query", name)) if !name.is_empty() => HashKey::Query(name.to_string()),
        None if u.hash_key == "bearer" => HashKey::Bearer,
        None if u.hash_key == "client_ip" => HashKey::ClientIp,
        None if u.hash_key == "path" => HashKey::Path,
        _ => {
            return err(
                p("hash_key"),
                format!(
                    "invalid hash key {:?}: expected header:NAME, query:NAME, bearer, client_ip or path",
                    u.hash_key
                ),
            )
        }
    };
    Ok(hash_key)
}

/// The balancing section's bounds: retries and their budget, the bulkhead and its fleet
/// total, the queue, resolution, shards and slow start.
fn validate_limits(i: usize, u: &UpstreamSection, n_backends: Option<usize>) -> VResult<()> {
    let p = |k: &str| format!("upstreams[{i}].{k}");
    range(&p("retries"), u.retries, 0, 10, "")?;
    if !(0.0..=1.0).contains(&u.retry_budget_ratio) {
        return err(
            p("retry_budget_ratio"),
            format!(
                "{} is out of range: must be between 0 and 1",
                u.retry_budget_ratio
            ),
        );
    }
    range(
        &p("max_inflight"),
        u.max_inflight,
        0,
        10_000_000,
        "requests",
    )?;
    if u.adaptive && u.max_inflight == 0 {
        return err(
            p("adaptive"),
            "needs a max_inflight above 0 (the ceiling of the learned cap)",
        );
    }
    range(
        &p("resolve_interval_seconds"),
        u.resolve_interval_seconds,
        1,
        DAY,
        "seconds",
    )?;
    // With names, the runtime's resolution checks the bound against their addresses.
    let most = n_backends.map_or(MAX_SHARD, |n| n as u64);
    range(&p("shard_size"), u.shard_size, 0, most, "backends")?;
    range(
        &p("slow_start_seconds"),
        u.slow_start_seconds,
        0,
        HOUR,
        "seconds",
    )?;
    range(
        &p("queue_timeout_ms"),
        u.queue_timeout_ms,
        0,
        HOUR * 1000,
        "ms",
    )?;
    range(&p("max_queue"), u.max_queue, 0, 1_000_000, "requests")?;
    range(
        &p("fleet_max_inflight"),
        u.fleet_max_inflight,
        0,
        100_000_000,
        "requests",
    )?;
    if u.fleet_max_inflight > 0 && u.max_inflight == 0 {
        return err(
            p("fleet_max_inflight"),
            "needs a max_inflight above 0 (what each instance takes without the store)",
        );
    }
    Ok(())
}

pub(super) fn validate_routes(
    routes: &[RouteSection],
    ups: &[Upstream],
    rate_limit: &super::RateLimitSettings,
) -> VResult<Vec<Route>> {
    let mut out = Vec::with_capacity(routes.len().max(1));
    for (i, r) in routes.iter().enumerate() {
        let action = crate::config::edge::validate_action(i, r)?;
        let upstream = match ups.iter().position(|u| u.name == r.upstream) {
            Some(idx) => idx,
            // A route that answers itself needs no upstream.
            None if r.upstream.is_empty() && action != RouteAction::Proxy => 0,
            None => {
                return err(
                    format!("routes[{i}].upstream"),
                    format!("names unknown upstream {:?}", r.upstream),
                )
            }
        };
        if !r.path_prefix.starts_with('/') {
            return err(format!("routes[{i}].path_prefix"), "must start with '/'");
        }
        if r.host.contains(['/', ' ']) {
            return err(format!("routes[{i}].host"), "must be a bare host name");
        }
        let host = (!r.host.is_empty()).then(|| r.host.to_ascii_lowercase());
        let headers = crate::config::edge::validate_header_rules(i, r)?;
        let (methods, client_cidrs) = crate::config::edge::validate_conditions(i, r)?;
        let policy_mask = crate::config::edge::validate_route_policies(i, r, rate_limit)?;
        out.push(Route {
            headers,
            host,
            path_prefix: r.path_prefix.clone(),
            upstream,
            priority: match r.priority {
                PrioritySection::Critical => Priority::Critical,
                PrioritySection::Normal => Priority::Normal,
                PrioritySection::Low => Priority::Low,
            },
            methods,
            client_cidrs,
            action,
            policy_mask,
        });
    }
    if out.is_empty() {
        out.push(Route {
            host: None,
            path_prefix: "/".into(),
            upstream: 0,
            priority: Priority::Normal,
            headers: crate::edge::HeaderRules::new(),
            methods: Vec::new(),
            client_cidrs: None,
            action: RouteAction::Proxy,
            policy_mask: u64::MAX,
        });
    }
    // First match wins: longest prefix, then host-specific before any-host, then (among
    // routes of one host and prefix) those with more of `methods` / `client_cidrs` set,
    // then file order.
    out.sort_by(|a, b| {
        b.path_prefix
            .len()
            .cmp(&a.path_prefix.len())
            .then(b.host.is_some().cmp(&a.host.is_some()))
            .then(b.conditions().cmp(&a.conditions()))
    });
    Ok(out)
}

/// `tls`, `sni`, `verify`, `ca_file`, `http2` (CONTRACT §6).
fn validate_transport(
    u: &UpstreamSection,
    p: &dyn Fn(&str) -> String,
) -> VResult<UpstreamTransport> {
    if !u.tls && (!u.sni.is_empty() || !u.ca_file.is_empty()) {
        return err(
            p(if u.sni.is_empty() { "ca_file" } else { "sni" }),
            "only meaningful with tls = true",
        );
    }
    let ca = if u.ca_file.is_empty() {
        None
    } else {
        match crate::config::certs::CaBundle::load(std::path::Path::new(&u.ca_file)) {
            Ok(c) => Some(c),
            Err(e) => return err(p("ca_file"), e),
        }
    };
    Ok(UpstreamTransport {
        tls: u.tls,
        sni: u.sni.clone(),
        verify: u.verify,
        ca,
        http2: u.http2,
    })
}
