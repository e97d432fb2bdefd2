//! The PROXY protocol (HAProxy's v1 text and v2 binary header) a load balancer
//! writes before the HTTP bytes. Parsing is `ppp`'s; this module only decides
//! when enough bytes have arrived and what the header says about the client.

use std::net::IpAddr;

/// Longest header accepted: a v1 line is at most 107 bytes; v2 carries TLVs
/// after the addresses, which cloud balancers keep small.
pub const MAX_HEADER: usize = 4096;

const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
const V1_PREFIX: &[u8; 6] = b"PROXY ";
const V1_MAX: usize = 107;

/// What the bytes read so far make of a PROXY header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// More bytes are needed.
    Incomplete,
    /// A header of `len` bytes. `source` is the client it names; `None` for
    /// `LOCAL` (v2) or `UNKNOWN` (v1): the balancer's own connection, such as a
    /// health check, whose client is the TCP peer.
    Done { source: Option<IpAddr>, len: usize },
    /// Not a PROXY header, or a malformed one.
    Invalid,
}

/// Parse the start of a connection's bytes.
pub fn parse(buf: &[u8]) -> Parsed {
    let n = buf.len().min(V2_SIGNATURE.len());
    if buf[..n] == V2_SIGNATURE[..n] {
        return parse_v2(buf);
    }
    let n = buf.len().min(V1_PREFIX.len());
    if buf[..n] == V1_PREFIX[..n] {
        return parse_v1(buf);
    }
    Parsed::Invalid
}

fn parse_v2(buf: &[u8]) -> Parsed {
    use ppp::v2::{Addresses, Command, Header, ParseError};
    match Header::try_from(buf) {
        Ok(h) => {
            let source = match (h.command, h.addresses) {
                (Command::Local, _) => None,
                (_, Addresses::IPv4(a)) => Some(IpAddr::V4(a.source_address)),
                (_, Addresses::IPv6(a)) => Some(IpAddr::V6(a.source_address)),
                (_, _) => None,
            };
            Parsed::Done {
                source,
                len: h.len(),
            }
        }
        Err(ParseError::Incomplete(_) | ParseError::Partial(..)) if buf.len() < MAX_HEADER => {
            Parsed::Incomplete
        }
        Err(_) => Parsed::Invalid,
    }
}

/// v1 is parsed only once its line is complete: `ppp` judges a half-received
/// address as malformed.
fn parse_v1(buf: &[u8]) -> Parsed {
    use ppp::v1::{Addresses, Header};
    let Some(end) = buf.iter().position(|&b| b == b'\n') else {
        return if buf.len() < V1_MAX {
            Parsed::Incomplete
        } else {
            Parsed::Invalid
        };
    };
    let line = &buf[..=end];
    if line.len() > V1_MAX || !line.ends_with(b"\r\n") {
        return Parsed::Invalid;
    }
    match Header::try_from(line) {
        Ok(h) => Parsed::Done {
            source: match h.addresses {
                Addresses::Tcp4(a) => Some(IpAddr::V4(a.source_address)),
                Addresses::Tcp6(a) => Some(IpAddr::V6(a.source_address)),
                Addresses::Unknown => None,
            },
            len: line.len(),
        },
        Err(_) => Parsed::Invalid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(command: u8, family: u8, addrs: &[u8], tlv: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | command);
        h.push(family);
        let len = u16::try_from(addrs.len() + tlv.len()).unwrap();
        h.extend_from_slice(&len.to_be_bytes());
        h.extend_from_slice(addrs);
        h.extend_from_slice(tlv);
        h
    }

    #[test]
    fn v1_byte_by_byte_is_incomplete_until_the_line_ends() {
        let line = b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 8080\r\nGET / HTTP/1.1\r\n";
        let end = 44;
        for i in 0..end {
            assert_eq!(parse(&line[..i]), Parsed::Incomplete, "{i} bytes");
        }
        assert_eq!(
            parse(&line[..]),
            Parsed::Done {
                source: Some("203.0.113.9".parse().unwrap()),
                len: end
            }
        );
        let v6 = b"PROXY TCP6 2001:db8::9 ::1 5555 8080\r\n";
        assert_eq!(
            parse(v6),
            Parsed::Done {
                source: Some("2001:db8::9".parse().unwrap()),
                len: v6.len()
            }
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\n"),
            Parsed::Done {
                source: None,
                len: 15
            }
        );
    }

    #[test]
    fn v2_byte_by_byte_with_tlvs() {
        let mut addrs = vec![203, 0, 113, 9, 127, 0, 0, 1];
        addrs.extend_from_slice(&5555u16.to_be_bytes());
        addrs.extend_from_slice(&8080u16.to_be_bytes());
        let h = v2(1, 0x11, &addrs, &[0x04, 0x00, 0x02, b'a', b'b']);
        for i in 0..h.len() {
            assert_eq!(parse(&h[..i]), Parsed::Incomplete, "{i} bytes");
        }
        let mut with_http = h.clone();
        with_http.extend_from_slice(b"GET / HTTP/1.1\r\n");
        assert_eq!(
            parse(&with_http),
            Parsed::Done {
                source: Some("203.0.113.9".parse().unwrap()),
                len: h.len()
            }
        );
        let local = v2(0, 0x00, &[], &[]);
        assert_eq!(
            parse(&local),
            Parsed::Done {
                source: None,
                len: 16
            }
        );
        let mut a6 = Vec::new();
        a6.extend_from_slice(
            &"2001:db8::9"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        a6.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
        a6.extend_from_slice(&[0, 1, 0, 2]);
        assert_eq!(
            parse(&v2(1, 0x21, &a6, &[])),
            Parsed::Done {
                source: Some("2001:db8::9".parse().unwrap()),
                len: 16 + 36
            }
        );
    }

    #[test]
    fn anything_else_is_invalid() {
        for bad in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"PROXY TCP4 1.2.3 127.0.0.1 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 127.0.0.1 1 2\n",
            b"PROXY TCP5 1.2.3.4 127.0.0.1 1 2\r\n",
            b"\r\n\r\n\0\r\nQUIT\n\x31\x11\x00\x00",
        ] {
            assert_eq!(
                parse(bad),
                Parsed::Invalid,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(parse(&[b'P'; 200][..]), Parsed::Invalid);
        let mut long = b"PROXY ".to_vec();
        long.extend_from_slice(&[b'1'; 120]);
        assert_eq!(parse(&long), Parsed::Invalid);
    }
}
