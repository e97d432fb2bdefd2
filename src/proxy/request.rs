//! What the proxy reads off a request before the gates: its host, the size of
//! its header block, and whether its target was rewritten.

use pingora::proxy::Session;

/// The `Host` (or absolute-form authority) without its port; IPv6 literals keep
/// their brackets.
pub fn host_of(session: &Session) -> &str {
    let req = session.req_header();
    let host = req
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri.host())
        .unwrap_or("");
    match host.rfind(':') {
        Some(i) if !host[i..].contains(']') => &host[..i],
        _ => host,
    }
}

/// Approximate size of the request line and header block as received.
pub fn header_block_len(session: &Session) -> usize {
    let req = session.req_header();
    let mut n = req.uri.path_and_query().map_or(1, |p| p.as_str().len()) + 16;
    for (name, value) in req.headers.iter() {
        n += name.as_str().len() + value.len() + 4;
    }
    n
}

/// Whether the request target holds a byte no URI may hold, as received or as
/// Pingora rewrote it: Pingora percent-encodes a target that `httparse`
/// refuses (a space, a control byte, …) and parses again. Such a request is
/// refused, not forwarded rewritten. The raw bytes are looked up only for
/// targets that contain `%`.
pub fn invalid_target(session: &Session) -> bool {
    let req = session.req_header();
    let target = req.raw_path();
    if crate::framing::target_has_invalid_byte(target) {
        return true;
    }
    if !target.contains(&b'%') {
        return false;
    }
    let Some(h1) = session.as_downstream().as_http1() else {
        return false;
    };
    crate::raw_window::recent_bytes(h1.stream()).is_some_and(|recent| {
        crate::raw_window::target_was_rewritten(recent, req.method.as_str().as_bytes(), target)
    })
}
