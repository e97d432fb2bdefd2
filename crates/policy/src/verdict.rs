//! The gates' verdict: why the proxy answers a request itself ([`Refusal`]), with the
//! status, body, `Retry-After` and `outcome` label of each answer, and the numbers of the
//! `RateLimit` fields ([`RateFields`]). The app's `respond` turns a refusal into a response.

/// How the proxy finished a request (`portcullis_requests_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Proxied = 0,
    Shed,
    RateLimited,
    Rejected,
    NoBackend,
    UpstreamError,
    /// A route with `action = "deny"` answered (CONTRACT §21).
    Denied,
    /// A route with `action = "redirect"` answered.
    Redirected,
}

impl Outcome {
    pub const ALL: [Outcome; 8] = [
        Outcome::Proxied,
        Outcome::Shed,
        Outcome::RateLimited,
        Outcome::Rejected,
        Outcome::NoBackend,
        Outcome::UpstreamError,
        Outcome::Denied,
        Outcome::Redirected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Proxied => "proxied",
            Outcome::Shed => "shed",
            Outcome::RateLimited => "rate_limited",
            Outcome::Rejected => "rejected",
            Outcome::NoBackend => "no_backend",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Denied => "denied",
            Outcome::Redirected => "redirected",
        }
    }
}

/// The numbers of the `RateLimit-Policy` and `RateLimit` fields (IETF draft), for a
/// 429 and for admitted responses alike; the policy name comes with them at
/// the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateFields {
    /// Which policy these are of: an index in the route's rate-limit policies (0 is
    /// `[rate_limit]`); its name comes at the response.
    pub policy: usize,
    pub limit: u64,
    pub window_secs: u64,
    pub remaining: u64,
    /// Seconds until the quota resets (`t`).
    pub reset_secs: u64,
}

/// Why the proxy answers a request itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The concurrency cap of the request's class is reached (503).
    Shed { retry_after: u64 },
    /// `shedding.max_tunnels` upgraded connections are open (503).
    TunnelCap { retry_after: u64 },
    /// The key is over its limit (429); `fields.remaining` is 0.
    RateLimited {
        retry_after: u64,
        /// The refusing policy's numbers; `fields.policy` names the policy.
        fields: RateFields,
    },
    /// The key was blamed for most of its upstream's errors (CONTRACT §15,
    /// `blame_tenants`): 429 with `RateLimit-Policy: "blame";q=0` until its cooldown ends.
    Blamed { retry_after: u64 },
    /// A tenant's requests in flight reached its tier's `concurrency` across the fleet
    /// (429, `RateLimit-Policy: "concurrency";q=LIMIT`).
    TenantConcurrency { limit: u64 },
    /// A tenant's cost quota of the period is spent (429 until the period ends,
    /// `RateLimit-Policy: "quota";q=QUOTA;w=PERIOD`).
    QuotaExceeded {
        retry_after: u64,
        quota: u64,
        period_secs: u64,
    },
    /// No key and `missing_key = "reject"` (401).
    KeyMissing,
    /// A key no tenant holds, with `tenants.unknown_key = "reject"` (401).
    KeyUnknown,
    /// A key longer than `max_key_bytes` (400).
    KeyTooLong,
    /// More than one value for the key (400): never guess which one counts.
    KeyAmbiguous,
    /// A bearer JWT that does not verify, for a `jwt:CLAIM` key (401 with
    /// `WWW-Authenticate: Bearer error="invalid_token"`): never forwarded.
    TokenInvalid,
    /// No backend can take the request (503).
    NoBackend { retry_after: u64 },
    /// The request header block is over the limit (431).
    HeaderTooLarge,
    /// A request that cannot be forwarded unambiguously (400); the reason is for the body.
    BadRequest(&'static str),
    /// A body over `max_request_body_bytes` (413).
    PayloadTooLarge,
    /// The client's body stalled past `client_body_timeout_ms` (408).
    RequestTimeout,
    /// A transfer coding the proxy does not apply (501).
    UnsupportedCoding,
    /// The backend did not answer in time (504).
    UpstreamTimeout,
    /// The backend failed mid-exchange (502).
    UpstreamError,
    /// A fault in the proxy itself (500).
    Internal,
    /// A route with `action = "deny"` (its `status`, 403 by default).
    Denied { status: u16 },
    /// No route matches and `server.unmatched` is `404` or `421`.
    NoRoute { status: u16 },
}

impl Refusal {
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Shed { .. } | Refusal::NoBackend { .. } | Refusal::TunnelCap { .. } => 503,
            Refusal::RateLimited { .. }
            | Refusal::Blamed { .. }
            | Refusal::TenantConcurrency { .. }
            | Refusal::QuotaExceeded { .. } => 429,
            Refusal::KeyMissing | Refusal::KeyUnknown | Refusal::TokenInvalid => 401,
            Refusal::KeyTooLong | Refusal::KeyAmbiguous | Refusal::BadRequest(_) => 400,
            Refusal::HeaderTooLarge => 431,
            Refusal::PayloadTooLarge => 413,
            Refusal::RequestTimeout => 408,
            Refusal::UnsupportedCoding => 501,
            Refusal::UpstreamTimeout => 504,
            Refusal::UpstreamError => 502,
            Refusal::Internal => 500,
            Refusal::Denied { status } | Refusal::NoRoute { status } => *status,
        }
    }

    /// The `outcome` label it is counted under.
    pub fn outcome(&self) -> Outcome {
        match self {
            Refusal::Shed { .. } | Refusal::TunnelCap { .. } => Outcome::Shed,
            Refusal::RateLimited { .. }
            | Refusal::Blamed { .. }
            | Refusal::TenantConcurrency { .. }
            | Refusal::QuotaExceeded { .. } => Outcome::RateLimited,
            Refusal::NoBackend { .. } => Outcome::NoBackend,
            Refusal::KeyUnknown
            | Refusal::KeyMissing
            | Refusal::KeyTooLong
            | Refusal::KeyAmbiguous
            | Refusal::TokenInvalid
            | Refusal::HeaderTooLarge
            | Refusal::PayloadTooLarge
            | Refusal::RequestTimeout
            | Refusal::BadRequest(_)
            | Refusal::UnsupportedCoding => Outcome::Rejected,
            Refusal::UpstreamTimeout | Refusal::UpstreamError | Refusal::Internal => {
                Outcome::UpstreamError
            }
            Refusal::Denied { .. } => Outcome::Denied,
            Refusal::NoRoute { .. } => Outcome::Rejected,
        }
    }

    pub fn body(&self) -> &'static str {
        match self {
            Refusal::Shed { .. } => "portcullis: overloaded (load shed)\n",
            Refusal::TunnelCap { .. } => "portcullis: too many open tunnels (max_tunnels)\n",
            Refusal::RateLimited { .. } => "portcullis: rate limited\n",
            Refusal::Blamed { .. } => "portcullis: rate limited (blamed for backend errors)\n",
            Refusal::TenantConcurrency { .. } => {
                "portcullis: too many requests in flight for this tenant\n"
            }
            Refusal::QuotaExceeded { .. } => "portcullis: quota exhausted for this period\n",
            Refusal::KeyMissing => "portcullis: API key required\n",
            Refusal::KeyUnknown => "portcullis: unknown API key\n",
            Refusal::KeyTooLong => "portcullis: API key too long\n",
            Refusal::KeyAmbiguous => "portcullis: more than one API key in the request\n",
            Refusal::TokenInvalid => "portcullis: invalid bearer token\n",
            Refusal::NoBackend { .. } => "portcullis: no backend available\n",
            Refusal::HeaderTooLarge => "portcullis: request header too large\n",
            Refusal::BadRequest(why) => why,
            Refusal::PayloadTooLarge => "portcullis: request body too large\n",
            Refusal::RequestTimeout => "portcullis: request body timed out\n",
            Refusal::UnsupportedCoding => "portcullis: transfer coding not implemented\n",
            Refusal::UpstreamTimeout => "portcullis: upstream timed out\n",
            Refusal::UpstreamError => "portcullis: upstream error\n",
            Refusal::Internal => "portcullis: internal error\n",
            Refusal::Denied { .. } => "portcullis: denied\n",
            Refusal::NoRoute { status: 421 } => "portcullis: misdirected request (no route)\n",
            Refusal::NoRoute { .. } => "portcullis: no route\n",
        }
    }

    /// The `WWW-Authenticate` field of the answer, where it has one (RFC 6750 §3).
    pub fn www_authenticate(&self) -> Option<&'static str> {
        match self {
            Refusal::TokenInvalid => Some("Bearer error=\"invalid_token\""),
            _ => None,
        }
    }

    /// `Retry-After` in whole seconds (at least 1), where the refusal has one.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Refusal::Shed { retry_after }
            | Refusal::TunnelCap { retry_after }
            | Refusal::NoBackend { retry_after }
            | Refusal::RateLimited { retry_after, .. }
            | Refusal::Blamed { retry_after }
            | Refusal::QuotaExceeded { retry_after, .. } => Some((*retry_after).max(1)),
            Refusal::TenantConcurrency { .. } => Some(1),
            _ => None,
        }
    }
}
