//! Blame the tenant (CONTRACT §15, `[culling] blame_tenants`): who a request is, for the
//! blame ledger, and the check loop's part. The rule is
//! [`portcullis_policy::cull::find_blamed`].
//!
//! Identity is the request's tenant (CONTRACT §14: every key of a tenant is one identity),
//! else its rate-limit key (`[rate_limit] key`), else its client address, hashed to 64
//! bits: raw keys are never kept or shown. `portcullis_blamed_total{tenant}` is labelled
//! with the tenant's name, `"unknown"` for a key no tenant holds (each upstream's
//! [`BlameNames`](crate::upstream::BlameNames)).
//!
//! Scope: per upstream (the key is limited for requests to the upstream it failed on), and
//! fleet-wide through the budget store (`BudgetStore::exchange_blame`); per instance
//! without Redis.

use std::net::IpAddr;

use crate::config::RateLimitSettings;
use crate::ratelimit::{extract_key, KeyOutcome};
use crate::tenants::TenantRt;

/// The blame identity of a request: a 64-bit hash of its tenant (CONTRACT §14: all the
/// tenant's keys are one identity), else of its rate-limit key, else of its client address;
/// `None` for a key the rate limiter refuses anyway.
pub fn identity(
    rl: &RateLimitSettings,
    tenant: Option<&TenantRt>,
    headers: &http::HeaderMap,
    uri: &http::Uri,
    client: Option<IpAddr>,
) -> Option<u64> {
    if let Some(t) = tenant {
        return Some(portcullis_policy::balance::stable_hash(&[
            b"tenant:", &t.ident,
        ]));
    }
    match extract_key(&rl.source, headers, uri, rl.params.max_key_bytes) {
        KeyOutcome::Key(k) => Some(portcullis_policy::balance::stable_hash(&[b"key:", &k])),
        KeyOutcome::Missing => {
            let ip = client.map(|ip| ip.to_string()).unwrap_or_default();
            Some(portcullis_policy::balance::stable_hash(&[
                b"ip:",
                ip.as_bytes(),
            ]))
        }
        KeyOutcome::TooLong | KeyOutcome::Duplicate | KeyOutcome::Invalid => None,
    }
}

/// A short, stable, non-reversible tag of a key for logs and the journal.
pub fn tag(key: u64) -> String {
    format!("#{:08x}", key >> 32)
}
