//! The one place that turns a gate's refusal into a response: status,
//! headers, body and the `outcome` it is counted under. Gates return a
//! [`Refusal`]; the proxy phases (and `fail_to_proxy`) hand it to [`send`].
//! Bodies are short, plain text and name the gate that answered (CONTRACT §3), unless
//! `[errors]` asks for problem details or a page ([`body`]).

pub mod body;

use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::Result;

use crate::ratelimit::{FieldParts, Policies};
pub use portcullis_policy::verdict::{RateFields, Refusal};

/// Add both `RateLimit` fields of `fields`, of the policy whose parts are `policy`, to
/// `resp` (a 429, or an admitted response when the settings ask for them).
pub fn apply_rate_fields(
    fields: &RateFields,
    policy: &FieldParts,
    resp: &mut ResponseHeader,
) -> Result<()> {
    resp.insert_header(
        &crate::edge::headers::names::RATELIMIT_POLICY,
        policy.policy_value(fields.limit, fields.window_secs),
    )?;
    resp.insert_header(
        &crate::edge::headers::names::RATELIMIT,
        policy.ratelimit_value(fields.remaining, fields.reset_secs),
    )?;
    Ok(())
}

/// The last part of the problem type of `refusal` (`urn:portcullis:problem:KIND`) in
/// RFC 9457 bodies: which gate answered, for a program to tell apart.
pub fn problem_kind(refusal: &Refusal) -> Option<&'static str> {
    Some(match refusal {
        Refusal::Shed { .. } => "shed",
        Refusal::TunnelCap { .. } => "tunnel-cap",
        Refusal::RateLimited { .. } => "rate-limited",
        Refusal::Blamed { .. } => "blamed",
        Refusal::TenantConcurrency { .. } => "tenant-concurrency",
        Refusal::QuotaExceeded { .. } => "quota-exceeded",
        Refusal::KeyMissing => "key-missing",
        Refusal::KeyUnknown => "key-unknown",
        Refusal::KeyTooLong => "key-too-long",
        Refusal::KeyAmbiguous => "key-ambiguous",
        Refusal::TokenInvalid => "token-invalid",
        Refusal::NoBackend { .. } => "no-backend",
        Refusal::HeaderTooLarge => "header-too-large",
        Refusal::BadRequest(_) => "bad-request",
        Refusal::PayloadTooLarge => "payload-too-large",
        Refusal::RequestTimeout => "body-timeout",
        Refusal::UnsupportedCoding => "unsupported-coding",
        Refusal::UpstreamTimeout => "upstream-timeout",
        Refusal::UpstreamError => "upstream-error",
        Refusal::Internal => "internal",
        Refusal::Denied { .. } => "denied",
        Refusal::NoRoute { .. } => "no-route",
        #[allow(unreachable_patterns)] // a refusal added later: `about:blank`
        _ => return None,
    })
}

/// The body of `refusal` under `errors`; `request_id` as the access log has it (needed
/// only where [`body::ErrorBodies::shows_request_id`] says so).
pub fn body_of(
    refusal: &Refusal,
    errors: &body::ErrorBodies,
    request_id: Option<&http::HeaderValue>,
) -> body::Body {
    errors.render(&body::Answer {
        status: refusal.status(),
        kind: problem_kind(refusal),
        text: refusal.body(),
        retry_after: refusal.retry_after(),
        request_id: request_id.map(http::HeaderValue::as_bytes),
    })
}

/// The response header of the text body; `close` adds `Connection: close`.
/// A 429 carries the `RateLimit` fields of the refusing policy, whose parts are `parts`.
pub fn header(
    refusal: &Refusal,
    close: bool,
    parts: Option<&FieldParts>,
) -> Result<ResponseHeader> {
    header_with(refusal, close, parts, &text_plain(), refusal.body().len())
}

fn text_plain() -> http::HeaderValue {
    http::HeaderValue::from_static("text/plain; charset=utf-8")
}

/// [`header`] of a body of `content_type` and `len` bytes.
fn header_with(
    refusal: &Refusal,
    close: bool,
    parts: Option<&FieldParts>,
    content_type: &http::HeaderValue,
    len: usize,
) -> Result<ResponseHeader> {
    let mut resp = ResponseHeader::build(refusal.status(), Some(6))?;
    resp.insert_header("content-type", content_type.clone())?;
    resp.insert_header("content-length", len)?;
    if let Some(secs) = refusal.retry_after() {
        resp.insert_header("retry-after", secs)?;
    }
    if let Some(challenge) = refusal.www_authenticate() {
        resp.insert_header("www-authenticate", challenge)?;
    }
    if let (Refusal::RateLimited { fields, .. }, Some(parts)) = (refusal, parts) {
        apply_rate_fields(fields, parts, &mut resp)?;
    }
    match refusal {
        Refusal::TenantConcurrency { limit } => {
            let v = format!("\"concurrency\";q={limit}");
            resp.insert_header(&crate::edge::headers::names::RATELIMIT_POLICY, v)?;
        }
        Refusal::QuotaExceeded {
            quota, period_secs, ..
        } => {
            let v = format!("\"quota\";q={quota};w={period_secs}");
            resp.insert_header(&crate::edge::headers::names::RATELIMIT_POLICY, v)?;
        }
        Refusal::Blamed { retry_after } => {
            // CONTRACT §15: a blamed key's quota is 0 until its cooldown ends.
            resp.insert_header(
                &crate::edge::headers::names::RATELIMIT_POLICY,
                http::HeaderValue::from_static("\"blame\";q=0"),
            )?;
            resp.insert_header(
                &crate::edge::headers::names::RATELIMIT,
                format!("\"blame\";r=0;t={}", (*retry_after).max(1)),
            )?;
        }
        _ => {}
    }
    if close {
        resp.insert_header("connection", "close")?;
    }
    Ok(resp)
}

/// The response header of `refusal`: built once per thread and cloned for
/// every refusal but a 429 (whose `RateLimit` fields change with each request).
/// A shed 503 under overload is the case this is for: cloning a built header
/// is a copy of its two small maps, building one parses and inserts each field.
fn header_for(
    refusal: &Refusal,
    close: bool,
    policies: &Policies,
    body: &body::Body,
) -> Result<Box<ResponseHeader>> {
    let (content_type, len) = (&body.content_type, body.bytes.len());
    match refusal {
        Refusal::RateLimited { fields, .. } => {
            let parts = policies.fields(fields.policy);
            let h = header_with(refusal, close, parts, content_type, len)?;
            return Ok(Box::new(h));
        }
        // Their fields change with the tenant's tier.
        Refusal::TenantConcurrency { .. } | Refusal::QuotaExceeded { .. } => {
            let h = header_with(refusal, close, None, content_type, len)?;
            return Ok(Box::new(h));
        }
        _ => {}
    }
    // Everything the header holds: status, Content-Type, Content-Length, Retry-After,
    // WWW-Authenticate, Connection.
    let key = (
        refusal.status(),
        content_type.clone(),
        len,
        refusal.retry_after(),
        refusal.www_authenticate(),
        close,
    );
    HEADERS.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some((_, h)) = cache.iter().find(|(k, _)| *k == key) {
            return Ok(Box::new(h.clone()));
        }
        let h = header_with(refusal, close, None, content_type, len)?;
        // Bounded: a `Retry-After` changed by reloads many times over is rebuilt.
        if cache.len() >= HEADER_CACHE_MAX {
            cache.clear();
        }
        cache.push((key, h.clone()));
        Ok(Box::new(h))
    })
}

/// (status, `Content-Type`, body length, `Retry-After`, `WWW-Authenticate`, close)
type HeaderKey = (
    u16,
    http::HeaderValue,
    usize,
    Option<u64>,
    Option<&'static str>,
    bool,
);
const HEADER_CACHE_MAX: usize = 64;

thread_local! {
    static HEADERS: std::cell::RefCell<Vec<(HeaderKey, ResponseHeader)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Write the refusal to the client. `close` ends the connection after it
/// (a body left unread, draining, or framing that forbids reuse). `request_id`: the
/// request's, where its body shows it ([`body::ErrorBodies::shows_request_id`]).
pub async fn send(
    session: &mut Session,
    refusal: &Refusal,
    close: bool,
    rt: &crate::state::Runtime,
    request_id: Option<&http::HeaderValue>,
) -> Result<()> {
    if close {
        session.set_keepalive(None);
    }
    let body = body_of(refusal, &rt.config.errors, request_id);
    session
        .write_response_header(header_for(refusal, close, &rt.rate, &body)?, false)
        .await?;
    session.write_response_body(Some(body.bytes), true).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use portcullis_policy::verdict::Outcome;

    fn limited() -> Refusal {
        Refusal::RateLimited {
            retry_after: 0,
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
            (Refusal::TokenInvalid, 401, Outcome::Rejected, None),
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
        // No policies: a 429 is built without its fields here (the next test has them).
        let policies = Policies {
            list: Vec::new(),
            default_enabled: true,
        };
        let refusals = [
            Refusal::Shed { retry_after: 2 },
            Refusal::Shed { retry_after: 3 },
            Refusal::NoBackend { retry_after: 2 },
            Refusal::BadRequest("portcullis: one\n"),
            Refusal::BadRequest("portcullis: other reason\n"),
            Refusal::KeyMissing,
            Refusal::TokenInvalid,
            limited(),
        ];
        // twice: the second round comes from the cache
        for _ in 0..2 {
            for r in &refusals {
                for close in [false, true] {
                    let text = body_of(r, &body::ErrorBodies::default(), None);
                    let got = header_for(r, close, &policies, &text).unwrap();
                    let want = header(r, close, None).unwrap();
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
    fn an_invalid_token_is_a_bearer_challenge() {
        let h = header(&Refusal::TokenInvalid, false, None).unwrap();
        assert_eq!(h.status.as_u16(), 401);
        assert_eq!(
            h.headers.get("www-authenticate").unwrap(),
            "Bearer error=\"invalid_token\""
        );
        // The cached 401 of a missing key is not this one.
        let policies = Policies {
            list: Vec::new(),
            default_enabled: true,
        };
        let text = |r: &Refusal| body_of(r, &body::ErrorBodies::default(), None);
        let r = Refusal::KeyMissing;
        let missing = header_for(&r, false, &policies, &text(&r)).unwrap();
        assert!(missing.headers.get("www-authenticate").is_none());
        let r = Refusal::TokenInvalid;
        let invalid = header_for(&r, false, &policies, &text(&r)).unwrap();
        assert!(invalid.headers.get("www-authenticate").is_some());
    }

    #[test]
    fn a_429_carries_both_ratelimit_fields_and_retry_after() {
        let parts = FieldParts::new("default", 10, 60);
        let h = header(&limited(), true, Some(&parts)).unwrap();
        let get = |n: &str| h.headers.get(n).unwrap().to_str().unwrap().to_string();
        assert_eq!(get("retry-after"), "1");
        assert_eq!(get("ratelimit-policy"), "\"default\";q=10;w=60");
        assert_eq!(get("ratelimit"), "\"default\";r=0;t=7");
        assert_eq!(get("connection"), "close");
        assert_eq!(get("content-length"), limited().body().len().to_string());
    }
}
