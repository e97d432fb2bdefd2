//! Validation of `[redis]` (CONTRACT §5, §9): the store's mode and addresses, AUTH and TLS,
//! the key prefix and the timings. Errors are `(key_path, reason)` as in `validate`.

use super::check::{err, range, VResult, MINUTE_MS};
use super::schema::*;
use super::settings::*;
use std::time::Duration;

/// `[redis]` addresses: `host:port` entries, at least one.
fn host_ports(path: &str, list: &[String], what: &str) -> VResult<()> {
    if list.is_empty() {
        return err(
            path,
            format!("at least one {what} \"host:port\" is required"),
        );
    }
    for (i, n) in list.iter().enumerate() {
        let ok = n.rsplit_once(':').is_some_and(|(h, p)| {
            !h.is_empty() && !h.contains('/') && p.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !ok {
            return err(
                format!("{path}[{i}]"),
                format!("invalid address {n:?}: expected host:port"),
            );
        }
    }
    Ok(())
}

/// `[redis] mode` and the keys that go with it (CONTRACT §9).
fn validate_endpoint(r: &RedisSection) -> VResult<portcullis_store::Endpoint> {
    use portcullis_store::Endpoint;
    let ca_pem = load_ca_pem(r)?;
    keys_of_other_modes(r)?;
    let standalone = r.mode == "standalone";
    let mode = validate_mode(r, ca_pem.is_some())?;
    if !standalone && ca_pem.is_some() && !r.tls {
        return err("redis.ca_file", "ca_file needs tls = true");
    }
    // `password_file` wins over `password` (and over a password in a standalone `url`).
    let password = if r.password_file.is_empty() {
        r.password.expose().to_string()
    } else {
        super::read_secret_file("redis.password_file", &r.password_file)?
    };
    Ok(Endpoint {
        mode,
        password,
        tls: r.tls,
        ca_pem,
    })
}

/// `ca_file`: a CA bundle that loads, read as PEM bytes; `None` when empty.
fn load_ca_pem(r: &RedisSection) -> VResult<Option<Vec<u8>>> {
    if r.ca_file.is_empty() {
        return Ok(None);
    }
    let path = std::path::Path::new(&r.ca_file);
    if let Err(e) = crate::config::certs::CaBundle::load(path) {
        return err("redis.ca_file", e);
    }
    match super::read_regular_file(path, super::FileKind::Pem) {
        Ok(b) => Ok(Some(b)),
        Err(e) => err("redis.ca_file", format!("cannot read {}: {e}", r.ca_file)),
    }
}

/// `url`, `nodes` and `sentinels` are refused outside their own mode.
fn keys_of_other_modes(r: &RedisSection) -> VResult<()> {
    if r.mode != "standalone" && r.url.is_some() {
        return err(
            "redis.url",
            format!(
                "url is for mode = \"standalone\"; mode = \"{}\" takes {}",
                r.mode,
                if r.mode == "cluster" {
                    "nodes"
                } else {
                    "sentinels and master_name"
                }
            ),
        );
    }
    if r.mode != "cluster" && !r.nodes.is_empty() {
        return err("redis.nodes", "nodes are for mode = \"cluster\"");
    }
    if r.mode != "sentinel" && !r.sentinels.is_empty() {
        return err("redis.sentinels", "sentinels are for mode = \"sentinel\"");
    }
    Ok(())
}

/// `mode` and its addresses.
fn validate_mode(r: &RedisSection, has_ca: bool) -> VResult<portcullis_store::Mode> {
    use portcullis_store::Mode;
    Ok(match r.mode.as_str() {
        "standalone" => standalone_mode(r, has_ca)?,
        "cluster" => {
            host_ports("redis.nodes", &r.nodes, "seed node")?;
            Mode::Cluster {
                nodes: r.nodes.clone(),
            }
        }
        "sentinel" => sentinel_mode(r)?,
        other => {
            return err(
                "redis.mode",
                format!("unknown mode {other:?}: expected standalone, cluster or sentinel"),
            )
        }
    })
}

/// `mode = "standalone"`: one URL, which carries the password and TLS.
fn standalone_mode(r: &RedisSection, has_ca: bool) -> VResult<portcullis_store::Mode> {
    let url = r
        .url
        .as_ref()
        .map_or("redis://127.0.0.1:6379", |u| u.expose());
    if let Err(e) = portcullis_store::check_url(url) {
        return err(
            "redis.url",
            format!(
                // Shown redacted of its password by `ConfigError` (after the values from
                // the environment are hidden: a URL from it is shown as its variable).
                "invalid Redis URL {url:?} ({e}): expected redis[s]://[user:password@]host:port[/db]"
            ),
        );
    }
    if !r.password.is_empty() {
        return err(
            "redis.password",
            "password is for cluster/sentinel nodes; in standalone mode put it in the url (redis://:password@host:port)",
        );
    }
    if r.tls && !url.starts_with("rediss://") {
        return err(
            "redis.tls",
            "tls is for cluster/sentinel nodes; in standalone mode use a rediss:// url",
        );
    }
    if has_ca && !url.starts_with("rediss://") {
        return err("redis.ca_file", "ca_file needs a rediss:// url");
    }
    Ok(portcullis_store::Mode::Standalone {
        url: url.to_string(),
    })
}

/// `mode = "sentinel"`: the sentinels and the master's name.
fn sentinel_mode(r: &RedisSection) -> VResult<portcullis_store::Mode> {
    host_ports("redis.sentinels", &r.sentinels, "sentinel")?;
    if r.master_name.is_empty() || r.master_name.contains(char::is_whitespace) {
        return err(
            "redis.master_name",
            "must be a non-empty name without spaces",
        );
    }
    Ok(portcullis_store::Mode::Sentinel {
        sentinels: r.sentinels.clone(),
        master_name: r.master_name.clone(),
    })
}

pub(super) fn validate_redis(r: &RedisSection) -> VResult<StoreSettings> {
    let endpoint = validate_endpoint(r)?;
    if r.key_prefix.is_empty() || r.key_prefix.contains(['{', '}', ' ']) {
        return err(
            "redis.key_prefix",
            "must be non-empty and contain no spaces or braces",
        );
    }
    range(
        "redis.flush_interval_ms",
        r.flush_interval_ms,
        1,
        MINUTE_MS,
        "ms",
    )?;
    range("redis.timeout_ms", r.timeout_ms, 1, MINUTE_MS, "ms")?;
    Ok(StoreSettings {
        endpoint,
        key_prefix: r.key_prefix.clone(),
        flush_interval: Duration::from_millis(r.flush_interval_ms),
        timeout: Duration::from_millis(r.timeout_ms),
    })
}
