//! What the proxy reads off a request before the gates: its host, the size of
//! its header block, and whether its target was rewritten.

use std::net::IpAddr;

use pingora::proxy::Session;

/// The text of `ip` as a header value, written on the stack (no `String`).
pub fn ip_value(ip: IpAddr) -> http::HeaderValue {
    use std::io::Write;
    if let IpAddr::V4(v4) = ip {
        // The common case, without the formatting machinery of `write!`.
        let mut buf = [0u8; 15];
        let mut len = 0;
        for (i, octet) in v4.octets().into_iter().enumerate() {
            if i > 0 {
                buf[len] = b'.';
                len += 1;
            }
            let mut digits = itoa::Buffer::new();
            let d = digits.format(octet).as_bytes();
            buf[len..len + d.len()].copy_from_slice(d);
            len += d.len();
        }
        return http::HeaderValue::from_bytes(&buf[..len])
            .unwrap_or_else(|_| http::HeaderValue::from_static(""));
    }
    // The longest IP text: an IPv6 address with an embedded IPv4 one (45 bytes).
    let mut buf = [0u8; 48];
    let mut w = &mut buf[..];
    let len = match write!(w, "{ip}") {
        Ok(()) => 48 - w.len(),
        Err(_) => 0,
    };
    // Digits, hex, `:` and `.` only: always a valid header value.
    http::HeaderValue::from_bytes(&buf[..len])
        .unwrap_or_else(|_| http::HeaderValue::from_static(""))
}

/// X-Forwarded-For (the TCP peer appended to any the client sent) and
/// X-Forwarded-Proto on the upstream request.
pub fn set_forwarded(
    session: &Session,
    req: &mut pingora::http::RequestHeader,
    sources: &crate::edge::proxied::ProxiedSources,
) -> pingora::Result<()> {
    use crate::edge::headers::names::{X_FORWARDED_FOR, X_FORWARDED_PROTO};
    if let Some(ip) = crate::edge::source_ip(session, sources) {
        let joined = match req
            .headers
            .get(X_FORWARDED_FOR.name())
            .and_then(|v| v.to_str().ok())
        {
            Some(prev) if !prev.is_empty() => Some(format!("{prev}, {ip}")),
            _ => None,
        };
        match joined {
            Some(xff) => req.insert_header(&X_FORWARDED_FOR, xff)?,
            None => req.insert_header(&X_FORWARDED_FOR, ip_value(ip))?,
        }
    }
    let over_tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
    let proto = if over_tls { "https" } else { "http" };
    req.insert_header(&X_FORWARDED_PROTO, http::HeaderValue::from_static(proto))
}

/// An HTTP/1.0 request with no `Host` and an origin-form target goes upstream as
/// HTTP/1.0, as it came and as HAProxy forwards it. Pingora sends every upstream
/// request as HTTP/1.1, and HTTP/1.1 requires a `Host` (RFC 9112 §3.2): nginx and
/// most servers answer such a request 400, so a load balancer's or an old tool's
/// `GET / HTTP/1.0` would fail only through the proxy. An authority in the target
/// keeps HTTP/1.1 (Pingora writes it as `Host`); route rules cannot set `Host`.
pub fn keep_http10_without_host(session: &Session, req: &mut pingora::http::RequestHeader) {
    if session.req_header().version == http::Version::HTTP_10
        && !req.headers.contains_key(http::header::HOST)
        && req.uri.authority().is_none()
        && req.raw_path().first() == Some(&b'/')
    {
        req.set_version(http::Version::HTTP_10);
    }
}

/// How the response is framed for the client, before Pingora writes it:
/// - a 204 or a 1xx (but 101) carries neither `Content-Length` nor `Transfer-Encoding`
///   (RFC 9110 §8.6, RFC 9112 §6.1). Pingora writes no body for them but passed an
///   upstream's fields on; HAProxy removes them.
/// - a 101 answers only a request that asked to upgrade (RFC 9110 §15.2.2). Any other
///   is an upstream error (502), as HAProxy answers it. Pingora passed it on, and the
///   client saw a switch of protocols it never asked for.
/// - see [`frame_for_http10_client`].
pub fn frame_for_client(
    session: &mut Session,
    resp: &mut pingora::http::ResponseHeader,
) -> pingora::Result<()> {
    let status = resp.status.as_u16();
    if status == 101 && !session.is_upgrade_req() {
        return Err(pingora::Error::explain(
            pingora::ErrorType::InvalidHTTPHeader,
            "a 101 to a request that asked for no upgrade",
        )
        .into_up());
    }
    if status == 204 || (resp.status.is_informational() && status != 101) {
        resp.remove_header(&http::header::CONTENT_LENGTH);
        resp.remove_header(&http::header::TRANSFER_ENCODING);
        return Ok(());
    }
    frame_for_http10_client(session, resp)
}

/// A response to an HTTP/1.0 client carries no `Transfer-Encoding` (RFC 9112 §6.1).
/// Pingora turns an upstream response without `Content-Length` into a chunked one, and
/// passes an upstream's chunked one on, whatever the client's version: an HTTP/1.0
/// client (ApacheBench, a health checker) would read the chunk sizes as body. Without
/// the field the decoded body is written as it is and delimited by closing the
/// connection, as HAProxy does. A response that has no body keeps the connection. A
/// coding other than `chunked` (`gzip, chunked`) cannot reach such a client undeclared:
/// that is an upstream error (502), as HAProxy answers it.
fn frame_for_http10_client(
    session: &mut Session,
    resp: &mut pingora::http::ResponseHeader,
) -> pingora::Result<()> {
    let te = &http::header::TRANSFER_ENCODING;
    let req = session.req_header();
    if req.version != http::Version::HTTP_10 || !resp.headers.contains_key(te) {
        return Ok(());
    }
    if !crate::framing::coding_is_only_chunked(&resp.headers) {
        return Err(pingora::Error::explain(
            pingora::ErrorType::InvalidHTTPHeader,
            "a transfer coding an HTTP/1.0 client cannot read",
        )
        .into_up());
    }
    resp.remove_header(te);
    // 1xx and 204 never get here (`frame_for_client`; a 101 needs an HTTP/1.1 request).
    let no_body = req.method == http::Method::HEAD || resp.status.as_u16() == 304;
    if !no_body {
        // The chunked length is gone; a `Content-Length` sent beside it does not count.
        resp.remove_header(&http::header::CONTENT_LENGTH);
        session.set_keepalive(None);
        resp.insert_header(http::header::CONNECTION, "close")?;
    }
    Ok(())
}

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
/// refuses (a space, a control byte, …) and parses again, so `GET /a b` would
/// reach the backend as `/a%20b`. Such a request is refused, not forwarded
/// rewritten. The HTTP/1 session says whether it encoded the target (vendored
/// pingora-core, twelfth patch), over plain TCP and TLS alike, and its raw
/// request line is checked too (a `#` is gone from the parsed target); HTTP/2 has no
/// such repair, and its targets are checked for the bytes themselves.
pub fn invalid_target(session: &Session) -> bool {
    use crate::framing::{raw_target, target_has_invalid_byte};
    target_has_invalid_byte(session.req_header().raw_path())
        || session.as_downstream().as_http1().is_some_and(|h1| {
            // the target as received: the parsed one has lost a fragment (`/a#x?k=v`)
            h1.request_target_escaped()
                || target_has_invalid_byte(raw_target(&h1.get_headers_raw_bytes()))
        })
}

/// An HTTP/2 request that declared `content-length: 0` but whose stream did not end with
/// its HEADERS frame, and whose next frame (already received) carries data: malformed
/// (RFC 9113 §8.1.1), never forwarded. The h2 crate resets such a stream itself
/// (PROTOCOL_ERROR), but Pingora takes `content-length: 0` as "no body" and would forward
/// the request as a complete one first. Only what has already arrived is looked at (a
/// client may legitimately end the stream late); a DATA frame that comes later still gets
/// the stream reset, and nothing of it is forwarded.
pub fn data_past_zero_length(session: &mut Session) -> bool {
    use futures_util::FutureExt;
    let downstream = session.as_downstream_mut();
    if !downstream.is_http2()
        || downstream
            .req_header()
            .headers
            .get(http::header::CONTENT_LENGTH)
            .is_none_or(|v| v.as_bytes() != b"0")
    {
        return false;
    }
    match downstream.read_request_body().now_or_never() {
        Some(Ok(Some(data))) => !data.is_empty(),
        Some(Ok(None)) | None => false,
        // The h2 crate reset the stream: DATA past the declared length.
        Some(Err(_)) => true,
    }
}

/// HTTP/2 cookie crumbs (several `cookie` fields, RFC 9113 §8.2.3) joined with `"; "`
/// into one `Cookie` field for an HTTP/1.1 upstream, which must not get several.
pub fn join_cookie_crumbs(req: &mut pingora::http::RequestHeader) -> pingora::Result<()> {
    let cookie = http::header::COOKIE;
    let mut values = req.headers.get_all(&cookie).iter();
    if values.next().is_none() || values.next().is_none() {
        return Ok(());
    }
    let mut joined: Vec<u8> = Vec::new();
    for v in req.headers.get_all(&cookie) {
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(v.as_bytes());
    }
    let value = http::HeaderValue::from_bytes(&joined).map_err(|e| {
        pingora::Error::because(pingora::ErrorType::InvalidHTTPHeader, "joining cookies", e)
    })?;
    req.insert_header(cookie, value)?;
    Ok(())
}

/// The timeouts and reuse of the client connection, per request.
pub fn set_connection_options(session: &mut Session, server: &crate::config::ServerSettings) {
    // The wait for the next request is timed by the edge stream when there is one
    // (one timer per connection), not by a timer Pingora registers per wait.
    let idle = server.h1_idle();
    let idle_timed_by_edge = crate::edge::conn(session)
        .map(|conn| conn.header_received(idle))
        .is_some();
    // Between body reads; Pingora answers a stall with a downstream read
    // timeout, which `fail_to_proxy` turns into 408. HTTP/2 streams too (vendored
    // pingora-core, "h2 body timeout"): 408 on the stream, or a reset once the
    // response has started.
    session.set_read_timeout(Some(server.client_body_timeout));
    // Pingora has already decided whether this connection may be reused: off
    // for HTTP/1.0 without `Connection: keep-alive`, for `Connection: close`
    // and for ambiguous framing (RFC 9112 §6.1, §9.3). Only the timeout is
    // ours to set; never turn keep-alive back on. 0: no timeout of Pingora's
    // (the edge stream's, or none when 0 is configured).
    if session.get_keepalive().is_some() {
        let pingora_idle = if idle_timed_by_edge {
            0
        } else {
            // whole seconds, rounded up (never 0: Pingora's "no timeout")
            u64::try_from(idle.as_millis().div_ceil(1000)).unwrap_or(u64::MAX)
        };
        session.set_keepalive(Some(pingora_idle));
    }
    // Pipelined requests are answered one after another, in order (RFC 9112
    // §9.3.2); without this Pingora closes after the first.
    session.set_pipelining_enabled(true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_values_are_the_addresses_text() {
        for ip in [
            "127.0.0.1",
            "255.255.255.255",
            "::1",
            "2001:db8::ff00:42:8329",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "::ffff:192.168.100.200",
            "0.0.0.0",
            "10.0.0.1",
            "1.22.133.9",
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert_eq!(ip_value(ip).to_str().ok(), Some(ip.to_string().as_str()));
        }
    }
}
