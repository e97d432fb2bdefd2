//! Blame the tenant (CONTRACT §15, `[culling] blame_tenants`): who a request is, for the
//! blame ledger, and the check loop's part. The rule is
//! [`portcullis_policy::cull::find_blamed`].
//!
//! Identity is the rate-limit key's (`[rate_limit] key`: its bytes, or the client address
//! when the request has none), hashed to 64 bits: raw keys are never kept or shown. Tenants
//! (named customers) can plug in here through [`tenant_label`], which names a blamed key
//! for `portcullis_blamed_total{tenant}`; until then every key is `"unknown"` (a bounded
//! label).
//!
//! Scope: per upstream (the key is limited for requests to the upstream it failed on), and
//! fleet-wide through the budget store (`BudgetStore::exchange_blame`); per instance
//! without Redis.

use std::net::IpAddr;

use crate::ratelimit::{extract_key, KeyOutcome};
use crate::state::Runtime;

/// The blame identity of a request: a 64-bit hash of its rate-limit key (or of its client
/// address without one); `None` for a key the rate limiter refuses anyway.
pub fn identity(
    rt: &Runtime,
    headers: &http::HeaderMap,
    uri: &http::Uri,
    client: Option<IpAddr>,
) -> Option<u64> {
    let rl = &rt.config.rate_limit;
    match extract_key(&rl.source, headers, uri, rl.params.max_key_bytes) {
        KeyOutcome::Key(k) => Some(portcullis_policy::balance::stable_hash(&[b"key:", &k])),
        KeyOutcome::Missing => {
            let ip = client.map(|ip| ip.to_string()).unwrap_or_default();
            Some(portcullis_policy::balance::stable_hash(&[
                b"ip:",
                ip.as_bytes(),
            ]))
        }
        KeyOutcome::TooLong | KeyOutcome::Duplicate => None,
    }
}

/// The `tenant` label of a blamed key. The plug-in point for named tenants: a bounded set
/// of names, never the key itself.
pub fn tenant_label(_key: u64) -> &'static str {
    "unknown"
}

/// A short, stable, non-reversible tag of a key for logs and the journal.
pub fn tag(key: u64) -> String {
    format!("#{:08x}", key >> 32)
}
