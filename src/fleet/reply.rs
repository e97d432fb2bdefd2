//! What the runtime API's endpoints share: JSON answers, the percent-decoding of a path
//! segment, finding a backend, and the journal entry, metric and log line of an action.

use http::{Response, StatusCode};
use serde_json::{json, Value};

use crate::state::Shared;
use crate::upstream::Pool;

/// A JSON answer.
pub fn answer(status: StatusCode, body: &Value) -> Response<Vec<u8>> {
    let bytes = serde_json::to_vec_pretty(body).unwrap_or_default();
    let mut r = Response::new(bytes);
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

pub fn error(status: StatusCode, msg: &str) -> Response<Vec<u8>> {
    answer(status, &json!({ "error": msg }))
}

/// Percent-decoding of a path segment (`10.0.0.5%3A8080`); `None` when it is not UTF-8
/// or a `%` is not followed by two hex digits.
pub fn decode(seg: &str) -> Option<String> {
    let b = seg.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            // two hex digits: `u8::from_str_radix` alone would take `%+1` as 0x01
            let hex = b
                .get(i + 1..i + 3)
                .filter(|h| h.iter().all(u8::is_ascii_hexdigit))?;
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// What happened to one action, for the journal, the metric and the log line.
pub struct Done<'a> {
    pub action: &'static str,
    pub upstream: &'a str,
    pub backend: &'a str,
    pub by: &'a str,
    pub result: &'static str,
    pub reason: String,
}

/// Records `d`. Its reason may quote the request (a refused body's field name): it is
/// made one line first, so a newline in a JSON key cannot forge a log line.
pub fn record(shared: &Shared, d: &Done<'_>) {
    let reason = portcullis_policy::text::one_line(&d.reason);
    shared.metrics.admin.count(d.action, d.result);
    shared
        .observe
        .culls
        .record(crate::observe::journal::CullEntry {
            at_ms: crate::state::unix_ms(),
            upstream: d.upstream.to_string(),
            backend: d.backend.to_string(),
            result: d.result,
            errors: 0,
            action: Some(d.action),
            by: Some(d.by.to_string()),
            reason: Some(reason.clone()),
            ..Default::default()
        });
    tracing::info!(
        event = "admin_action",
        action = d.action,
        upstream = d.upstream,
        backend = d.backend,
        by = d.by,
        result = d.result,
        reason = %reason,
        "runtime action on a backend"
    );
}

/// The pool named `up` and the index of its backend written `addr` (an address, compared
/// as an address, the backend's text, or its name).
pub fn find(
    pools: &[std::sync::Arc<Pool>],
    up: &str,
    addr: &str,
) -> Result<(usize, usize), String> {
    let pi = pools
        .iter()
        .position(|p| p.name == up)
        .ok_or_else(|| format!("unknown upstream {up:?}"))?;
    let parsed = addr.parse::<std::net::SocketAddr>().ok();
    let bi = pools[pi]
        .backends
        .iter()
        .position(|b| Some(b.addr) == parsed || b.addr_str == addr || b.name == addr)
        .ok_or_else(|| format!("upstream {up:?} has no backend {addr:?}"))?;
    Ok((pi, bi))
}
