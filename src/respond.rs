//! The one place that turns a gate's refusal into a response: status,
//! headers, body and the `outcome` it is counted under. Gates return a
//! [`Refusal`]; the proxy phases (and `fail_to_proxy`) hand it to [`send`].
//! Bodies are short, plain text and name the gate that answered (CONTRACT §3).

use std::sync::Arc;

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::Result;

use crate::metrics::Outcome;
use crate::ratelimit::FieldParts;

/// The numbers of the `RateLimit-Policy` and `RateLimit` fields (IETF draft), for a
/// 429 and for admitted responses alike; the policy name comes with them at
/// [`RateFields::apply`], made once per config ([`FieldParts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateFields {
    /// Which policy these are of: an index in [`crate::ratelimit::Policies::list`] (0 is
    /// `[rate_limit]`); its name comes at [`RateFields::apply`].
    pub policy: usize,
    pub limit: u64,
    pub window_secs: u64,
    pub remaining: u64,
    /// Seconds until the quota resets (`t`).
    pub reset_secs: u64,
}

impl RateFields {
    /// Add both fields, of the policy whose parts are `policy`, to `resp`.
    pub fn apply(&self, policy: &FieldParts, resp: &mut ResponseHeader) -> Result<()> {
        resp.insert_header(
            &crate::edge::headers::names::RATELIMIT_POLICY,
            policy.policy_value(self.limit, self.window_secs),
        )?;
        resp.insert_header(
            &crate::edge::headers::names::RATELIMIT,
            policy.ratelimit_value(self.remaining, self.reset_secs),
        )?;
        Ok(())
    }
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
        /// The refusing policy's field parts.
        policy: Arc<FieldParts>,
        fields: RateFields,
    },
    /// No key and `missing_key = "reject"` (401).
    KeyMissing,
    /// A key longer than `max_key_bytes` (400).
    KeyTooLong,
    /// More than one value for the key (400): never guess which one counts.
    KeyAmbiguous,
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
}

impl Refusal {
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Shed { .. } | Refusal::NoBackend { .. } | Refusal::TunnelCap { .. } => 503,
            Refusal::RateLimited { .. } => 429,
            Refusal::KeyMissing => 401,
            Refusal::KeyTooLong | Refusal::KeyAmbiguous | Refusal::BadRequest(_) => 400,
            Refusal::HeaderTooLarge => 431,
            Refusal::PayloadTooLarge => 413,
            Refusal::RequestTimeout => 408,
            Refusal::UnsupportedCoding => 501,
            Refusal::UpstreamTimeout => 504,
            Refusal::UpstreamError => 502,
            Refusal::Internal => 500,
        }
    }

    /// The `outcome` label it is counted under.
    pub fn outcome(&self) -> Outcome {
        match self {
            Refusal::Shed { .. } | Refusal::TunnelCap { .. } => Outcome::Shed,
            Refusal::RateLimited { .. } => Outcome::RateLimited,
            Refusal::NoBackend { .. } => Outcome::NoBackend,
            Refusal::KeyMissing
            | Refusal::KeyTooLong
            | Refusal::KeyAmbiguous
            | Refusal::HeaderTooLarge
            | Refusal::PayloadTooLarge
            | Refusal::RequestTimeout
            | Refusal::BadRequest(_)
            | Refusal::UnsupportedCoding => Outcome::Rejected,
            Refusal::UpstreamTimeout | Refusal::UpstreamError | Refusal::Internal => {
                Outcome::UpstreamError
            }
        }
    }

    pub fn body(&self) -> &'static str {
        match self {
            Refusal::Shed { .. } => "portcullis: overloaded (load shed)\n",
            Refusal::TunnelCap { .. } => "portcullis: too many open tunnels (max_tunnels)\n",
            Refusal::RateLimited { .. } => "portcullis: rate limited\n",
            Refusal::KeyMissing => "portcullis: API key required\n",
            Refusal::KeyTooLong => "portcullis: API key too long\n",
            Refusal::KeyAmbiguous => "portcullis: more than one API key in the request\n",
            Refusal::NoBackend { .. } => "portcullis: no backend available\n",
            Refusal::HeaderTooLarge => "portcullis: request header too large\n",
            Refusal::BadRequest(why) => why,
            Refusal::PayloadTooLarge => "portcullis: request body too large\n",
            Refusal::RequestTimeout => "portcullis: request body timed out\n",
            Refusal::UnsupportedCoding => "portcullis: transfer coding not implemented\n",
            Refusal::UpstreamTimeout => "portcullis: upstream timed out\n",
            Refusal::UpstreamError => "portcullis: upstream error\n",
            Refusal::Internal => "portcullis: internal error\n",
        }
    }

    /// `Retry-After` in whole seconds (at least 1), where the refusal has one.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Refusal::Shed { retry_after }
            | Refusal::TunnelCap { retry_after }
            | Refusal::NoBackend { retry_after }
            | Refusal::RateLimited { retry_after, .. } => Some((*retry_after).max(1)),
            _ => None,
        }
    }

    /// The response header; `close` adds `Connection: close`.
    pub fn header(&self, close: bool) -> Result<ResponseHeader> {
        let mut resp = ResponseHeader::build(self.status(), Some(6))?;
        resp.insert_header(
            "content-type",
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        )?;
        resp.insert_header("content-length", self.body().len())?;
        if let Some(secs) = self.retry_after() {
            resp.insert_header("retry-after", secs)?;
        }
        if let Refusal::RateLimited { fields, policy, .. } = self {
            fields.apply(policy, &mut resp)?;
        }
        if close {
            resp.insert_header("connection", "close")?;
        }
        Ok(resp)
    }
}

/// The response header of `refusal`: built once per thread and cloned for
/// every refusal but a 429 (whose `RateLimit` fields change with each request).
/// A shed 503 under overload is the case this is for: cloning a built header
/// is a copy of its two small maps, building one parses and inserts each field.
fn header_for(refusal: &Refusal, close: bool) -> Result<Box<ResponseHeader>> {
    if matches!(refusal, Refusal::RateLimited { .. }) {
        return Ok(Box::new(refusal.header(close)?));
    }
    // Everything the header holds: status, Content-Length, Retry-After, Connection.
    let key = (
        refusal.status(),
        refusal.body().len(),
        refusal.retry_after(),
        close,
    );
    HEADERS.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some((_, h)) = cache.iter().find(|(k, _)| *k == key) {
            return Ok(Box::new(h.clone()));
        }
        let h = refusal.header(close)?;
        // Bounded: a `Retry-After` changed by reloads many times over is rebuilt.
        if cache.len() >= HEADER_CACHE_MAX {
            cache.clear();
        }
        cache.push((key, h.clone()));
        Ok(Box::new(h))
    })
}

/// (status, body length, `Retry-After`, close)
type HeaderKey = (u16, usize, Option<u64>, bool);
const HEADER_CACHE_MAX: usize = 64;

thread_local! {
    static HEADERS: std::cell::RefCell<Vec<(HeaderKey, ResponseHeader)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Write the refusal to the client. `close` ends the connection after it
/// (a body left unread, draining, or framing that forbids reuse).
pub async fn send(session: &mut Session, refusal: &Refusal, close: bool) -> Result<()> {
    if close {
        session.set_keepalive(None);
    }
    session
        .write_response_header(header_for(refusal, close)?, false)
        .await?;
    session
        .write_response_body(Some(Bytes::from_static(refusal.body().as_bytes())), true)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited() -> Refusal {
        Refusal::RateLimited {
            retry_after: 0,
            policy: Arc::new(FieldParts::new("default", 10, 60)),
            fields: RateFields {
                policy: 0,
                limit: 10,
                window_secs: 60,
                remaining: 0,
                reset_secs: 7,
            },
        }
    }

    #[test]
    fn each_refusal_maps_to_its_status_and_outcome() {
        let table = [
            (
                Refusal::Shed { retry_after: 2 },
                503,
                Outcome::Shed,
                Some(2),
            ),
            (limited(), 429, Outcome::RateLimited, Some(1)),
            (Refusal::KeyMissing, 401, Outcome::Rejected, None),
            (Refusal::KeyTooLong, 400, Outcome::Rejected, None),
            (Refusal::KeyAmbiguous, 400, Outcome::Rejected, None),
            (
                Refusal::NoBackend { retry_after: 0 },
                503,
                Outcome::NoBackend,
                Some(1),
            ),
            (Refusal::HeaderTooLarge, 431, Outcome::Rejected, None),
            (Refusal::BadRequest("x\n"), 400, Outcome::Rejected, None),
            (Refusal::UnsupportedCoding, 501, Outcome::Rejected, None),
            (Refusal::PayloadTooLarge, 413, Outcome::Rejected, None),
            (Refusal::RequestTimeout, 408, Outcome::Rejected, None),
            (Refusal::UpstreamTimeout, 504, Outcome::UpstreamError, None),
            (Refusal::UpstreamError, 502, Outcome::UpstreamError, None),
            (Refusal::Internal, 500, Outcome::UpstreamError, None),
        ];
        for (r, status, outcome, retry) in table {
            assert_eq!(r.status(), status, "{r:?}");
            assert_eq!(r.outcome(), outcome, "{r:?}");
            assert_eq!(r.retry_after(), retry, "{r:?}");
            assert!(r.body().starts_with("portcullis: ") || matches!(r, Refusal::BadRequest(_)));
        }
    }

    #[test]
    fn a_cached_header_is_the_built_one() {
        let refusals = [
            Refusal::Shed { retry_after: 2 },
            Refusal::Shed { retry_after: 3 },
            Refusal::NoBackend { retry_after: 2 },
            Refusal::BadRequest("portcullis: one\n"),
            Refusal::BadRequest("portcullis: other reason\n"),
            limited(),
        ];
        // twice: the second round comes from the cache
        for _ in 0..2 {
            for r in &refusals {
                for close in [false, true] {
                    let got = header_for(r, close).unwrap();
                    let want = r.header(close).unwrap();
                    assert_eq!(got.status, want.status, "{r:?}");
                    assert_eq!(got.headers, want.headers, "{r:?} close={close}");
                    let wire = |h: &ResponseHeader| {
                        let mut buf = bytes::BytesMut::new();
                        h.header_to_h1_wire(&mut buf);
                        buf
                    };
                    assert_eq!(wire(&got), wire(&want), "{r:?} close={close}");
                }
            }
        }
    }

    #[test]
    fn a_429_carries_both_ratelimit_fields_and_retry_after() {
        let h = limited().header(true).unwrap();
        let get = |n: &str| h.headers.get(n).unwrap().to_str().unwrap().to_string();
        assert_eq!(get("retry-after"), "1");
        assert_eq!(get("ratelimit-policy"), "\"default\";q=10;w=60");
        assert_eq!(get("ratelimit"), "\"default\";r=0;t=7");
        assert_eq!(get("connection"), "close");
        assert_eq!(get("content-length"), limited().body().len().to_string());
    }
}
