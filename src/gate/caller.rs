//! Who a request is, resolved once by [`admit`](super::admit): its `[rate_limit]` key (read
//! from the request at most once, [`RequestKey`]), its tenant, the class it is shed by (its
//! route's, or its tenant tier's) and its blame identity. What the gates resolved is kept
//! in the request's [`Caller`]; the rate limiter, the blame gate, the tenant's charge, the
//! shadow report and the access log read it there, never the request's headers again.

use std::cell::OnceCell;
use std::net::IpAddr;
use std::sync::Arc;

use portcullis_policy::shed::Priority;

use super::{Gate, RequestFacts};
use crate::config::RateLimitSettings;
use crate::cull::blame::{self, Identity};
use crate::ratelimit::{extract_request_key, KeyOutcome};
use crate::respond::Refusal;
use crate::tenants::TenantRt;
use crate::upstream::Pool;

/// Who the request is, as the gates resolved it; kept for the request's life.
#[derive(Default)]
pub struct Caller {
    /// The request's tenant (CONTRACT §14), when its key is a tenant's.
    pub tenant: Option<Arc<TenantRt>>,
    /// The class the request was shed by: its route's, or its tenant tier's. `None` until
    /// the gates ran (a request answered before them).
    pub class: Option<Priority>,
    /// Its blame identity (CONTRACT §15), with `[culling] blame_tenants` only; `None` also
    /// for a key the rate limiter refuses anyway.
    pub blame: Option<Identity>,
}

/// The request's `[rate_limit]` key, extracted (and, for `jwt:CLAIM`, verified) the first
/// time a gate asks for it and never again: the tenant lookup, the rate limiter's policies
/// keyed by it and the blame identity share one extraction. Lives in [`admit`](super::admit)
/// only (the key may borrow the request's header).
pub struct RequestKey<'a> {
    headers: &'a http::HeaderMap,
    uri: &'a http::Uri,
    client_ip: Option<IpAddr>,
    key: OnceCell<KeyOutcome<'a>>,
}

impl<'a> RequestKey<'a> {
    pub fn of(facts: &RequestFacts<'a>) -> Self {
        Self {
            headers: facts.headers,
            uri: facts.uri,
            client_ip: facts.client_ip,
            key: OnceCell::new(),
        }
    }

    /// The key under `rl` (`now_ms`: a token's verification time, at the first call).
    #[inline]
    pub fn get(&self, rl: &RateLimitSettings, now_ms: u64) -> &KeyOutcome<'a> {
        self.key.get_or_init(|| {
            extract_request_key(
                &rl.source,
                rl.jwt.as_deref(),
                self.headers,
                self.uri,
                rl.params.max_key_bytes,
                now_ms / 1000,
                self.client_ip,
            )
        })
    }
}

/// `[culling] blame_tenants`: a caller blamed for its upstream's errors is answered 429
/// until its cooldown ends (CONTRACT §15). One atomic load while nothing is blamed.
pub struct Blame<'a> {
    pub pool: Option<&'a Pool>,
    pub who: Option<Identity>,
    pub window_secs: u64,
}

impl Gate for Blame<'_> {
    type Admit = ();
    #[inline]
    fn check(&self, _facts: &RequestFacts<'_>, now_ms: u64) -> Result<(), Refusal> {
        let (Some(pool), Some(who)) = (self.pool, self.who) else {
            return Ok(());
        };
        if !pool.shared.blamed.any() {
            return Ok(());
        }
        let key = blame::current(
            &pool.shared.key_spread,
            who,
            now_ms / 1000,
            self.window_secs,
        );
        match pool.shared.blamed.limited(key, now_ms) {
            Some(secs) => Err(Refusal::Blamed { retry_after: secs }),
            None => Ok(()),
        }
    }
}
