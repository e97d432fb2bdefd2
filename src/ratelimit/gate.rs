//! The rate-limit gate: which key a request is limited by (its API key, or its
//! client address when it has none and `missing_key = "client_ip"`), and the
//! local sliding-window decision, as a verdict. No I/O; the proxy answers a
//! refusal through `respond`.

use std::net::IpAddr;

use super::{extract_key, Decision, KeyOutcome, Limiter, MissingKey};
use crate::config::RateLimitSettings;
use crate::respond::{RateFields, Refusal};

/// Admit the request (with the `RateLimit` fields for its response when the
/// settings ask for them on admitted responses) or refuse it.
pub fn check(
    rl: &RateLimitSettings,
    limiter: &Limiter,
    headers: &http::HeaderMap,
    uri: &http::Uri,
    client_ip: Option<IpAddr>,
    now_ms: u64,
) -> Result<Option<RateFields>, Refusal> {
    if !rl.enabled {
        return Ok(None);
    }
    // Decide while the key is still borrowed from the request: no copy of it.
    let decision = match extract_key(&rl.source, headers, uri, rl.params.max_key_bytes) {
        KeyOutcome::Key(k) => limiter.check(k.as_ref(), now_ms),
        KeyOutcome::TooLong => return Err(Refusal::KeyTooLong),
        // The limiter would count one value while the backend may act on another.
        KeyOutcome::Duplicate => return Err(Refusal::KeyAmbiguous),
        KeyOutcome::Missing => match rl.missing_key {
            MissingKey::Allow => return Ok(None),
            MissingKey::Reject => return Err(Refusal::KeyMissing),
            MissingKey::ClientIp => {
                let key = match client_ip {
                    Some(ip) => format!("ip:{ip}"),
                    None => "ip:unknown".to_string(),
                };
                limiter.check(key.as_bytes(), now_ms)
            }
        },
    };
    let window_secs = rl.params.window_secs;
    match decision {
        Decision::Allowed {
            limit,
            remaining,
            reset_secs,
        } => Ok(rl.headers.then_some(RateFields {
            limit,
            window_secs,
            remaining,
            reset_secs,
        })),
        Decision::Limited {
            limit,
            retry_after_secs,
            reset_secs,
        } => Err(Refusal::RateLimited {
            retry_after: retry_after_secs,
            policy: rl.policy_name.clone(),
            fields: RateFields {
                limit,
                window_secs,
                remaining: 0,
                reset_secs: reset_secs.max(retry_after_secs),
            },
        }),
    }
}
