//! Who the client is (CONTRACT §7): the TCP peer, unless the peer is a trusted
//! proxy; then the PROXY header's source, or else the right-most
//! `X-Forwarded-For` entry that is not itself a trusted proxy. Pure functions.

use std::net::IpAddr;

use ipnet::IpNet;

/// `server.trusted_proxies`: the peers allowed to say who the client is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// Parse CIDRs (`10.0.0.0/8`, `::1/128`) or bare addresses (a /32 or /128).
    /// The error names the entry that is neither.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, String> {
        let mut nets = Vec::with_capacity(entries.len());
        for e in entries {
            let e = e.as_ref().trim();
            let net = match e.parse::<IpNet>() {
                Ok(n) => n.trunc(),
                Err(_) => match e.parse::<IpAddr>() {
                    Ok(ip) => IpNet::from(ip),
                    Err(_) => return Err(format!("{e:?} is not a CIDR or an IP address")),
                },
            };
            nets.push(net);
        }
        Ok(Self { nets })
    }

    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// Whether `ip` is a trusted proxy. An IPv4-mapped IPv6 peer (`::ffff:a.b.c.d`)
    /// is judged as its IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.nets.iter().any(|n| n.contains(&ip))
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The client address of a request.
///
/// - `peer`: the TCP peer; `proxied`: the source a PROXY header gave, when the
///   connection came with one (only ever accepted from a trusted peer);
/// - `xff`: the request's `X-Forwarded-For` field values, in order.
///
/// An untrusted peer is the client whatever the headers say. Behind a trusted
/// peer, the PROXY source wins; else the entries are walked right to left
/// past trusted proxies; an entry that does not parse stops the walk (what is
/// left of it cannot be trusted) and the last trusted hop is the client.
pub fn client_address<'a>(
    trusted: &TrustedProxies,
    peer: IpAddr,
    proxied: Option<IpAddr>,
    xff: impl Iterator<Item = &'a [u8]>,
) -> IpAddr {
    if let Some(source) = proxied {
        return source;
    }
    if trusted.is_empty() || !trusted.contains(peer) {
        return peer;
    }
    let entries: Vec<&[u8]> = xff
        .flat_map(|v| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .collect();
    let mut client = peer;
    for raw in entries.iter().rev() {
        let Some(ip) = parse_entry(raw) else {
            return client;
        };
        if !trusted.contains(ip) {
            return ip;
        }
        client = ip;
    }
    client
}

/// An `X-Forwarded-For` entry: an address, possibly `[v6]` or with a port.
fn parse_entry(raw: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(raw).ok()?;
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Ok(sa) = s.parse::<std::net::SocketAddr>() {
        return Some(canonical(sa.ip()));
    }
    s.strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .and_then(|r| r.parse::<IpAddr>().ok())
        .map(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn lb() -> TrustedProxies {
        TrustedProxies::parse(&["127.0.0.2", "10.0.0.0/8", "fd00::/8"]).unwrap()
    }

    fn client(peer: &str, proxied: Option<&str>, xff: &[&str]) -> IpAddr {
        client_address(
            &lb(),
            ip(peer),
            proxied.map(ip),
            xff.iter().map(|v| v.as_bytes()),
        )
    }

    #[test]
    fn parses_cidrs_and_bare_addresses_v4_and_v6() {
        let t = lb();
        assert!(t.contains(ip("127.0.0.2")));
        assert!(!t.contains(ip("127.0.0.1")));
        assert!(t.contains(ip("10.200.3.4")));
        assert!(t.contains(ip("fd12::1")));
        assert!(!t.contains(ip("fe80::1")));
        assert!(t.contains(ip("::ffff:10.1.1.1")), "v4-mapped judged as v4");
        assert!(TrustedProxies::parse(&["10.0.0.0/33"]).is_err());
        assert!(TrustedProxies::parse(&["lb.example"]).is_err());
        // host bits are ignored: 10.1.2.3/8 is 10.0.0.0/8
        assert!(TrustedProxies::parse(&["10.1.2.3/8"])
            .unwrap()
            .contains(ip("10.9.9.9")));
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_sends() {
        assert_eq!(client("127.0.0.1", None, &["1.2.3.4"]), ip("127.0.0.1"));
        assert_eq!(client("127.0.0.1", None, &[]), ip("127.0.0.1"));
        let none = TrustedProxies::default();
        let got = client_address(&none, ip("10.0.0.1"), None, [&b"1.2.3.4"[..]].into_iter());
        assert_eq!(
            got,
            ip("10.0.0.1"),
            "no trusted proxies: headers never count"
        );
    }

    #[test]
    fn behind_a_trusted_peer_the_rightmost_untrusted_entry_wins() {
        assert_eq!(client("127.0.0.2", None, &["1.2.3.4"]), ip("1.2.3.4"));
        // a client forging a left-most entry does not win
        assert_eq!(
            client("127.0.0.2", None, &["6.6.6.6, 1.2.3.4"]),
            ip("1.2.3.4")
        );
        // trusted hops on the right are skipped, across field lines too
        assert_eq!(
            client("127.0.0.2", None, &["6.6.6.6, 1.2.3.4", "10.0.0.7"]),
            ip("1.2.3.4")
        );
        assert_eq!(
            client("127.0.0.2", None, &["[2001:db8::1]:443"]),
            ip("2001:db8::1")
        );
        assert_eq!(client("127.0.0.2", None, &["1.2.3.4:5678"]), ip("1.2.3.4"));
        // no header, or only trusted hops: the left-most trusted hop
        assert_eq!(client("127.0.0.2", None, &[]), ip("127.0.0.2"));
        assert_eq!(
            client("127.0.0.2", None, &["10.0.0.9, 10.0.0.7"]),
            ip("10.0.0.9")
        );
        // garbage stops the walk at the last trusted hop
        assert_eq!(
            client("127.0.0.2", None, &["1.2.3.4, junk"]),
            ip("127.0.0.2")
        );
        assert_eq!(
            client("127.0.0.2", None, &["1.2.3.4, junk, 10.0.0.7"]),
            ip("10.0.0.7")
        );
    }

    #[test]
    fn a_proxy_header_source_wins_over_any_header() {
        assert_eq!(
            client("127.0.0.2", Some("203.0.113.9"), &["1.2.3.4"]),
            ip("203.0.113.9")
        );
    }
}
