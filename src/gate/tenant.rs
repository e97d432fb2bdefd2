//! The tenant gate (CONTRACT §14): who the request's key belongs to ([`identify`]), and
//! the tier's concurrency share and cost quota ([`TenantGate`]). The tier's limit is the
//! rate-limit gate's (the tenant's key there), its priority the shed gate's class.

use std::sync::Arc;

use super::caller::RequestKey;
use super::{Gate, RequestFacts};
use crate::config::tenants::UnknownKey;
use crate::config::RateLimitSettings;
use crate::ratelimit::KeyOutcome;
use crate::respond::Refusal;
use crate::tenants::{Registry, TenantRt, TenantSlot};
use portcullis_policy::shed::Priority;
use portcullis_policy::tenant::QuotaBook;

/// Who the rate limit counts a request as.
#[derive(Clone, Copy)]
pub enum Who<'r> {
    /// As without tenants: its own key (or none).
    Unresolved,
    /// A tenant's: counted as the tenant, under its tier's limit.
    Tenant(&'r Arc<TenantRt>),
    /// A key no tenant holds, with `unknown_key = "client_ip"`: counted by its address.
    ClientIp,
}

impl Who<'_> {
    /// The tier's shedding class, when it sets one.
    pub fn priority(&self) -> Option<Priority> {
        match self {
            Who::Tenant(t) => t.tier.priority,
            _ => None,
        }
    }
}

/// The tenant holding the request's `[rate_limit]` key (for `jwt:CLAIM`, the claim of a
/// token that verifies at `now_ms`). A request without a key, or whose key is refused as it
/// stands (too long, twice), is left to the rate-limit gate; a bearer token that does not
/// verify is refused here (401 `invalid_token`, verified and counted once), as an unknown
/// key with `unknown_key = "reject"` is.
pub fn identify<'r>(
    registry: &'r Registry,
    rl: &RateLimitSettings,
    key: &RequestKey<'_>,
    now_ms: u64,
) -> Result<Who<'r>, Refusal> {
    let key = match key.get(rl, now_ms) {
        KeyOutcome::Key(key) => key,
        KeyOutcome::Invalid => return Err(Refusal::TokenInvalid),
        _ => return Ok(Who::Unresolved),
    };
    match registry.lookup(key) {
        Some(t) => Ok(Who::Tenant(t)),
        None => match registry.unknown_key {
            UnknownKey::Allow => Ok(Who::Unresolved),
            UnknownKey::ClientIp => Ok(Who::ClientIp),
            UnknownKey::Reject => Err(Refusal::KeyUnknown),
        },
    }
}

/// A tenant's concurrency share here and its cost quota of the period.
pub struct TenantGate<'a> {
    pub tenant: &'a TenantRt,
    pub quota: &'a QuotaBook,
}

impl Gate for TenantGate<'_> {
    type Admit = Option<TenantSlot>;
    #[inline]
    fn check(&self, _facts: &RequestFacts<'_>, now_ms: u64) -> Result<Self::Admit, Refusal> {
        let t = self.tenant;
        let tier = &t.tier;
        if tier.quota > 0 {
            if let Err(q) = self
                .quota
                .check(t.quota_key, tier.period, tier.quota, now_ms)
            {
                let index = tier.period.index(now_ms);
                let period_secs =
                    (tier.period.start_ms(index + 1) - tier.period.start_ms(index)) / 1000;
                return Err(Refusal::QuotaExceeded {
                    retry_after: q.retry_after_secs,
                    quota: tier.quota,
                    period_secs,
                });
            }
        }
        t.enter()
            .map_err(|limit| Refusal::TenantConcurrency { limit })
    }
}
