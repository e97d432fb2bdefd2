//! The edge: what the proxy checks about a client connection and its requests
//! before any gate spends work (CONTRACT §7), and the edge protocols (CONTRACT §6):
//! upgrade tunnels ([`tunnel`]) and gRPC outcomes ([`grpc`]). TLS termination
//! (`server::tls`), the connection wrapper (`server::app`) and the upstream
//! transport (`upstream::peer`) sit above the edge and use it.
//!
//! - [`proxy_protocol`]: the PROXY header (v1, v2), read from `trusted_proxies`
//!   only; [`stream::EdgeStream`] carries the connection's identity and enforces
//!   `client_header_timeout_ms` over a whole header block (408).
//! - [`identity`]: the client address (PROXY source, trusted
//!   `X-Forwarded-For`, or the peer): the `client_ip` rate-limit key and the
//!   logged address.
//! - [`limits`]: `max_request_body_bytes` (413), by `Content-Length` before a
//!   byte of body is read, or as a chunked body passes it.
//!   `client_body_timeout_ms` is Pingora's per-read body timeout (408), for
//!   HTTP/1.1 and HTTP/2 streams alike (vendored pingora-core, "h2 body timeout").
//! - [`glitches`]: `h2_max_glitches`, the reset and malformed streams an HTTP/2
//!   connection may cause per minute before it is closed.
//! - [`headers`]: per-route header rules, hop-by-hop fields, the headers a
//!   gate reads, `X-Request-Id` hygiene.

pub mod glitches;
pub mod grpc;
pub mod headers;
pub mod identity;
pub mod limits;
pub mod proxied;
pub mod proxy_protocol;
pub mod rules;
pub mod stream;
pub mod tunnel;

use std::net::IpAddr;

use pingora::protocols::Stream;
use pingora::proxy::Session;

pub use headers::HeaderRules;
pub use identity::TrustedProxies;
pub use proxied::ProxiedSources;
pub use stream::Conn;

/// The [`Conn`] of the session's client connection (HTTP/1 over plain TCP).
pub fn conn(session: &Session) -> Option<&Conn> {
    let stream = session.as_downstream().as_http1()?.stream();
    conn_of(stream)
}

/// The [`Conn`] of a plain Pingora HTTP/1 session's connection (the admin listener).
pub fn conn_of_server_session(session: &pingora::protocols::http::ServerSession) -> Option<&Conn> {
    conn_of(session.as_http1()?.stream())
}

fn conn_of(stream: &Stream) -> Option<&Conn> {
    let io: &dyn pingora::protocols::IO = stream.as_ref();
    io.as_any()
        .downcast_ref::<stream::EdgeStream>()
        .map(stream::EdgeStream::conn)
}

/// The TCP peer of the session.
pub fn peer_ip(session: &Session) -> Option<IpAddr> {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip())
}

/// The source a PROXY header named for the session's connection. An HTTP/1
/// session reaches its [`Conn`]; an HTTP/2 stream does not (Pingora keeps the
/// connection inside its h2 session), so the edge also files the source by the
/// connection's peer address in `sources` ([`proxied::ProxiedSources`]).
fn proxied_source(session: &Session, sources: &ProxiedSources) -> Option<IpAddr> {
    match conn(session) {
        Some(c) => c.proxied,
        None => session
            .client_addr()
            .and_then(|a| a.as_inet())
            .and_then(|a| sources.lookup(*a)),
    }
}

/// The client address of the request (see [`identity::client_address`]).
///
/// With `proxy_protocol` (CONTRACT §17) the PROXY header alone says who the client is:
/// `X-Forwarded-For` is never read, and a `LOCAL` (v2) or `UNKNOWN` (v1) header, which
/// names no source, makes the connection's peer the client.
pub fn client_ip(
    session: &Session,
    trusted: &TrustedProxies,
    proxy_protocol: bool,
    sources: &ProxiedSources,
) -> Option<IpAddr> {
    let conn = conn(session);
    let peer = conn.and_then(|c| c.peer).or_else(|| peer_ip(session))?;
    let proxied = proxied_source(session, sources);
    if proxy_protocol {
        return Some(proxied.unwrap_or(peer));
    }
    if proxied.is_none() && (trusted.is_empty() || !trusted.contains(peer)) {
        return Some(peer);
    }
    let xff = session
        .req_header()
        .headers
        .get_all(headers::names::X_FORWARDED_FOR.name())
        .into_iter()
        .map(|v| v.as_bytes());
    Some(identity::client_address(trusted, peer, proxied, xff))
}

/// The connection's source, appended to `X-Forwarded-For`: the PROXY header's
/// source where one was used, else the TCP peer.
pub fn source_ip(session: &Session, sources: &ProxiedSources) -> Option<IpAddr> {
    proxied_source(session, sources).or_else(|| peer_ip(session))
}
