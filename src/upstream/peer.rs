//! The transport to a backend: cleartext or TLS (SNI, verification, extra CA),
//! HTTP/1.1 or HTTP/2 (ALPN over TLS, prior knowledge without).

use std::net::SocketAddr;

use pingora::upstreams::peer::HttpPeer;

use crate::config::UpstreamTransport;

/// The peer for `addr` under `t`. With `sni = ""` the backend's host (its IP
/// address, since backends are `host:port` resolved at load) is both the SNI
/// and the name verified. `keep_case`: its HTTP/1 responses keep the case of
/// their header names (`server.preserve_header_case`).
pub fn peer(addr: SocketAddr, t: &UpstreamTransport, keep_case: bool) -> HttpPeer {
    let sni = if !t.tls {
        String::new()
    } else if t.sni.is_empty() {
        addr.ip().to_string()
    } else {
        t.sni.clone()
    };
    let mut peer = HttpPeer::new(addr, t.tls, sni);
    peer.options.preserve_h1_header_case = keep_case;
    if t.tls {
        peer.options.verify_cert = t.verify;
        peer.options.verify_hostname = t.verify;
        if let Some(ca) = &t.ca {
            peer.options.ca = Some(ca.0.clone());
        }
    }
    if t.http2 {
        // Over TLS: ALPN offers h2 only. Without TLS: prior knowledge (h2c).
        peer.options.set_http_version(2, 2);
        // Streams multiplexed on one connection to the backend.
        peer.options.max_h2_streams = 100;
    }
    peer
}
