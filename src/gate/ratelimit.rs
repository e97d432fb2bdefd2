//! The rate-limit gate: which key a request is limited by under each policy (its API key,
//! or its client address), and the local sliding-window decisions of every policy that
//! applies, combined ([`crate::ratelimit::policy`]), as a verdict. No I/O; the proxy
//! answers a refusal through `respond`.

use std::borrow::Cow;
use std::net::IpAddr;

use super::caller::RequestKey;
use super::{Gate, RequestFacts, Who};
use crate::config::RateLimitSettings;
use crate::ratelimit::{
    extract_request_key, Combined, KeyOutcome, MissingKey, Policies, PolicyKey,
};
use crate::respond::{RateFields, Refusal};

/// The route's rate-limit policies under the config's `[rate_limit]` settings.
pub struct RateLimit<'a, 'k> {
    pub settings: &'a RateLimitSettings,
    pub policies: &'a Policies,
    /// Who the request is (its tenant counts as one key, under its tier's limit).
    pub who: Who<'a>,
    /// The request's `[rate_limit]` key, read once for every gate that needs it.
    pub key: &'a RequestKey<'k>,
}

/// What the rate-limit gate admitted a request with.
#[derive(Debug, Default, Clone, Copy)]
pub struct RateAdmit {
    /// The `RateLimit` fields of the admitted response, when the settings ask for them.
    pub fields: Option<RateFields>,
    /// The policies in shadow mode that would have refused the request: bit `i` for
    /// `Policies::list[i]` (at most 33 policies).
    pub shadow: u64,
}

impl Gate for RateLimit<'_, '_> {
    type Admit = RateAdmit;
    #[inline]
    fn check(&self, facts: &RequestFacts<'_>, now_ms: u64) -> Result<Self::Admit, Refusal> {
        let mut shadow = 0;
        let fields = check(
            self.settings,
            self.policies,
            facts,
            (self.who, self.key),
            now_ms,
            &mut shadow,
        )?;
        Ok(RateAdmit { fields, shadow })
    }
}

/// A refusal of policy `i`'s key checks (missing, too long, ambiguous): refused, or, for a
/// policy in shadow mode, recorded in `shadow` (the policy then does not apply).
#[inline]
fn key_refusal(
    policies: &Policies,
    i: usize,
    refusal: Refusal,
    shadow: &mut u64,
) -> Result<(), Refusal> {
    match &policies.list[i].shadow {
        None => Err(refusal),
        Some(counter) => {
            counter.inc();
            *shadow |= 1u64.checked_shl(i as u32).unwrap_or(0);
            Ok(())
        }
    }
}

fn ip_key(client_ip: Option<IpAddr>) -> String {
    match client_ip {
        Some(ip) => format!("ip:{ip}"),
        None => "ip:unknown".to_string(),
    }
}

/// Admit the request (with the `RateLimit` fields for its response when the settings ask
/// for them on admitted responses) or refuse it, naming the refusing policy.
fn check(
    rl: &RateLimitSettings,
    policies: &Policies,
    req: &RequestFacts<'_>,
    (who, key): (Who<'_>, &RequestKey<'_>),
    now_ms: u64,
    shadow: &mut u64,
) -> Result<Option<RateFields>, Refusal> {
    if policies.list.len() > 1 {
        return check_all(rl, policies, req, (who, key), now_ms, shadow);
    }
    let Some(policy) = policies
        .list
        .first()
        .filter(|_| policies.default_enabled && req.policies & 1 != 0)
    else {
        return Ok(None);
    };
    // One policy: decide while the key is still borrowed from the request (no copy of it).
    let limiter = &policy.limiter;
    let decision = match who {
        // The tenant's key (its tier's limit is that key's limit in the limiter).
        Who::Tenant(t) => limiter.check(&*t.ident, now_ms),
        Who::ClientIp => limiter.check(ip_key(req.client_ip).as_bytes(), now_ms),
        Who::Unresolved => {
            match key.get(rl, now_ms) {
                KeyOutcome::Key(k) => limiter.check(k.as_ref(), now_ms),
                KeyOutcome::Invalid => {
                    return key_refusal(policies, 0, Refusal::TokenInvalid, shadow).map(|()| None)
                }
                KeyOutcome::TooLong => {
                    return key_refusal(policies, 0, Refusal::KeyTooLong, shadow).map(|()| None)
                }
                // The limiter would count one value while the backend may act on another.
                KeyOutcome::Duplicate => {
                    return key_refusal(policies, 0, Refusal::KeyAmbiguous, shadow).map(|()| None)
                }
                KeyOutcome::Missing => match rl.missing_key {
                    MissingKey::Allow => return Ok(None),
                    MissingKey::Reject => {
                        return key_refusal(policies, 0, Refusal::KeyMissing, shadow).map(|()| None)
                    }
                    MissingKey::ClientIp => limiter.check(ip_key(req.client_ip).as_bytes(), now_ms),
                },
            }
        }
    };
    let combined = Combined::of(0, decision);
    match combined {
        Combined::Admitted { .. } => policy.counters.allowed.inc(),
        Combined::Refused { .. } => policy.counters.limited.inc(),
        Combined::Unlimited => {}
    }
    if let Some(counter) = &policy.shadow {
        // Shadow mode: decided and counted as enforcing would, never refused, and no
        // `RateLimit` fields (the client sees nothing of a shadow policy).
        if let Combined::Refused { .. } = combined {
            counter.inc();
            *shadow |= 1;
        }
        return Ok(None);
    }
    verdict(rl, policies, combined)
}

/// Several policies: the key of each that applies, then the combined decision.
fn check_all(
    rl: &RateLimitSettings,
    policies: &Policies,
    req: &RequestFacts<'_>,
    (who, key): (Who<'_>, &RequestKey<'_>),
    now_ms: u64,
    shadow: &mut u64,
) -> Result<Option<RateFields>, Refusal> {
    let path = req.uri.path();
    let max = rl.params.max_key_bytes;
    let mut keys: Vec<(usize, Cow<'_, [u8]>)> = Vec::with_capacity(policies.list.len());
    for (i, p) in policies.list.iter().enumerate() {
        let scoped_out = req.policies & 1u64.checked_shl(i as u32).unwrap_or(0) == 0;
        if (i == 0 && !policies.default_enabled) || scoped_out || !p.matches(path) {
            continue;
        }
        let source = match &p.key {
            PolicyKey::ClientIp => {
                keys.push((i, Cow::Owned(ip_key(req.client_ip).into_bytes())));
                continue;
            }
            PolicyKey::Source(s) => s,
        };
        // A policy keyed as `[rate_limit]` counts the tenant (or the address) as its key.
        if i == 0 || *source == rl.source {
            match who {
                Who::Tenant(t) => {
                    keys.push((i, Cow::Borrowed(&*t.ident)));
                    continue;
                }
                Who::ClientIp => {
                    keys.push((i, Cow::Owned(ip_key(req.client_ip).into_bytes())));
                    continue;
                }
                Who::Unresolved => {}
            }
        }
        // The `[rate_limit]` key as the gates read it; another source's read here.
        let outcome = if *source == rl.source {
            key.get(rl, now_ms).reborrow()
        } else {
            extract_request_key(
                source,
                rl.jwt.as_deref(),
                req.headers,
                req.uri,
                max,
                now_ms / 1000,
                req.client_ip,
            )
        };
        match outcome {
            KeyOutcome::Key(k) => keys.push((i, k)),
            KeyOutcome::Invalid => key_refusal(policies, i, Refusal::TokenInvalid, shadow)?,
            KeyOutcome::TooLong => key_refusal(policies, i, Refusal::KeyTooLong, shadow)?,
            KeyOutcome::Duplicate => key_refusal(policies, i, Refusal::KeyAmbiguous, shadow)?,
            // A named policy whose key the request lacks does not apply to it.
            KeyOutcome::Missing if i > 0 => {}
            KeyOutcome::Missing => match rl.missing_key {
                MissingKey::Allow => {}
                MissingKey::Reject => key_refusal(policies, i, Refusal::KeyMissing, shadow)?,
                MissingKey::ClientIp => {
                    keys.push((i, Cow::Owned(ip_key(req.client_ip).into_bytes())));
                }
            },
        }
    }
    if keys.is_empty() {
        return Ok(None);
    }
    let refs: Vec<(usize, &[u8])> = keys.iter().map(|(i, k)| (*i, k.as_ref())).collect();
    verdict(rl, policies, policies.decide(&refs, now_ms, shadow))
}

fn verdict(
    rl: &RateLimitSettings,
    policies: &Policies,
    combined: Combined,
) -> Result<Option<RateFields>, Refusal> {
    match combined {
        Combined::Admitted {
            policy,
            limit,
            remaining,
            reset_secs,
        } => Ok(rl.headers.then(|| RateFields {
            policy,
            limit,
            window_secs: policies.list[policy].window_secs,
            remaining,
            reset_secs,
        })),
        Combined::Unlimited => Ok(None),
        Combined::Refused {
            policy,
            limit,
            retry_after_secs,
            reset_secs,
        } => {
            let p = &policies.list[policy];
            Err(Refusal::RateLimited {
                retry_after: retry_after_secs,
                fields: RateFields {
                    policy,
                    limit,
                    window_secs: p.window_secs,
                    remaining: 0,
                    reset_secs: reset_secs.max(retry_after_secs),
                },
            })
        }
    }
}
