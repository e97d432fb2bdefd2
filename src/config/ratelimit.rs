//! Validation of `[rate_limit]` and its `[[rate_limit.policies]]` (CONTRACT §9):
//! key sources, limits and windows, per-key overrides and policy names.

use super::check::{err, range, VResult, DAY, MAX_COUNT};
use super::schema::*;
use super::settings::*;
use crate::ratelimit::{KeySource, MissingKey, PolicyKey};
use portcullis_policy::ratelimit::RateLimitParams;
use std::collections::BTreeMap;

pub(super) fn validate_rate_limit(r: &RateLimitSection) -> VResult<RateLimitSettings> {
    let PolicyKey::Source(key) = key_source("rate_limit.key", &r.key, false)? else {
        return err(
            "rate_limit.key",
            "client_ip is a key of [[rate_limit.policies]] only",
        );
    };
    default_policy_bounds(r)?;
    policy_name("rate_limit.policy_name", &r.policy_name)?;
    key_overrides("rate_limit.keys", &r.keys, r.max_key_bytes)?;
    let policies = validate_policies(r)?;
    Ok(RateLimitSettings {
        enabled: r.enabled,
        source: key,
        missing_key: match r.missing_key {
            MissingKeySection::ClientIp => MissingKey::ClientIp,
            MissingKeySection::Reject => MissingKey::Reject,
            MissingKeySection::Allow => MissingKey::Allow,
        },
        headers: r.headers,
        policy_name: r.policy_name.as_str().into(),
        params: RateLimitParams {
            window_secs: r.window_seconds,
            limit: r.limit,
            overrides: r.keys.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            max_key_bytes: r.max_key_bytes,
            max_tracked_keys: r.max_tracked_keys,
        },
        keys: r.keys.clone(),
        policies,
        shadow: r.shadow,
        cost_header: cost_header(&r.cost_header)?,
        // Set from `[jwt]` by `validate` (src/config/jwt.rs).
        jwt: None,
    })
}

/// `rate_limit.cost_header`: "" or a header name.
fn cost_header(name: &str) -> VResult<Option<http::HeaderName>> {
    if name.is_empty() {
        return Ok(None);
    }
    match http::HeaderName::from_bytes(name.as_bytes()) {
        Ok(h) => Ok(Some(h)),
        Err(_) => err(
            "rate_limit.cost_header",
            format!("invalid header name {name:?}"),
        ),
    }
}

/// The window, limit and key bounds of the section's own (default) policy.
fn default_policy_bounds(r: &RateLimitSection) -> VResult<()> {
    range(
        "rate_limit.window_seconds",
        r.window_seconds,
        1,
        DAY,
        "seconds",
    )?;
    range("rate_limit.limit", r.limit, 1, MAX_COUNT, "requests")?;
    range(
        "rate_limit.max_key_bytes",
        r.max_key_bytes as u64,
        1,
        8192,
        "bytes",
    )?;
    range(
        "rate_limit.max_tracked_keys",
        r.max_tracked_keys as u64,
        16,
        100_000_000,
        "keys",
    )
}

fn key_source(path: &str, key: &str, client_ip: bool) -> VResult<PolicyKey> {
    Ok(PolicyKey::Source(match key.split_once(':') {
        Some(("header", name)) => match http::HeaderName::from_bytes(name.as_bytes()) {
            Ok(h) => KeySource::Header(h),
            Err(_) => return err(path, format!("invalid header name {name:?}")),
        },
        Some(("query", name)) if !name.is_empty() => KeySource::Query(name.to_string()),
        Some(("jwt", claim)) if !claim.is_empty() => KeySource::Jwt(claim.into()),
        None if key == "bearer" => KeySource::Bearer,
        None if client_ip && key == "client_ip" => return Ok(PolicyKey::ClientIp),
        _ => {
            let also = if client_ip { ", client_ip" } else { "" };
            return err(
                path,
                format!(
                    "invalid key {key:?}: expected header:NAME, query:NAME, bearer, jwt:CLAIM{also}"
                ),
            );
        }
    }))
}

/// A policy name for the `RateLimit-Policy` / `RateLimit` fields.
fn policy_name(path: &str, name: &str) -> VResult<()> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b'"') {
        return err(path, "must be printable ASCII without quotes or spaces");
    }
    Ok(())
}

/// Per-key overrides (`keys`) of a policy at `path`.
fn key_overrides(path: &str, keys: &BTreeMap<String, u64>, max_key_bytes: usize) -> VResult<()> {
    for (k, v) in keys {
        let path = format!("{path}.{k}");
        if k.is_empty() || k.len() > max_key_bytes {
            return err(path, "key must be 1..=max_key_bytes bytes long");
        }
        range(&path, *v, 1, MAX_COUNT, "requests")?;
    }
    Ok(())
}

fn validate_policies(r: &RateLimitSection) -> VResult<Vec<RatePolicySettings>> {
    if r.policies.len() > crate::ratelimit::MAX_POLICIES {
        return err(
            format!("rate_limit.policies[{}]", crate::ratelimit::MAX_POLICIES),
            format!("at most {} policies", crate::ratelimit::MAX_POLICIES),
        );
    }
    let mut out: Vec<RatePolicySettings> = Vec::with_capacity(r.policies.len());
    for (i, p) in r.policies.iter().enumerate() {
        let at = |k: &str| format!("rate_limit.policies[{i}].{k}");
        policy_name(&at("name"), &p.name)?;
        if out.iter().any(|o| *o.name == *p.name) || (r.enabled && p.name == r.policy_name) {
            return err(
                at("name"),
                format!(
                    "duplicate policy name {:?} (names must be unique, also against rate_limit.policy_name)",
                    p.name
                ),
            );
        }
        let key = key_source(&at("key"), &p.key, true)?;
        range(&at("limit"), p.limit, 1, MAX_COUNT, "requests")?;
        range(&at("window_seconds"), p.window_seconds, 1, DAY, "seconds")?;
        if !p.path_prefix.starts_with('/') {
            return err(at("path_prefix"), "must start with /");
        }
        key_overrides(&at("keys"), &p.keys, r.max_key_bytes)?;
        out.push(RatePolicySettings {
            name: p.name.as_str().into(),
            key,
            path_prefix: p.path_prefix.clone(),
            params: RateLimitParams {
                window_secs: p.window_seconds,
                limit: p.limit,
                overrides: p.keys.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                max_key_bytes: r.max_key_bytes,
                max_tracked_keys: r.max_tracked_keys,
            },
            shadow: p.shadow.unwrap_or(r.shadow),
        });
    }
    Ok(out)
}
