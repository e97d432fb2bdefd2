//! The request's hash key for consistent hashing and shuffle sharding.

use std::borrow::Cow;
use std::net::IpAddr;

use super::HashKey;
use crate::ratelimit::{extract_key, KeyOutcome, KeySource};

/// Longest key value hashed as is; longer values are hashed too (never stored).
const MAX_KEY: usize = 64 * 1024;

/// The bytes to hash. A request without the key (or with it twice) hashes by
/// its client address, so keyless traffic still spreads instead of piling on
/// one backend.
pub fn hash_bytes<'a>(
    key: &HashKey,
    headers: &'a http::HeaderMap,
    uri: &'a http::Uri,
    client_ip: Option<IpAddr>,
) -> Cow<'a, [u8]> {
    let src = match key {
        HashKey::Header(h) => KeySource::Header(h.clone()),
        HashKey::Query(q) => KeySource::Query(q.clone()),
        HashKey::Bearer => KeySource::Bearer,
        HashKey::Path => return Cow::Borrowed(uri.path().as_bytes()),
        HashKey::ClientIp => return ip_bytes(client_ip),
    };
    match extract_key(&src, headers, uri, MAX_KEY) {
        KeyOutcome::Key(k) => k,
        _ => ip_bytes(client_ip),
    }
}

fn ip_bytes(ip: Option<IpAddr>) -> Cow<'static, [u8]> {
    match ip {
        Some(IpAddr::V4(v4)) => Cow::Owned(v4.octets().to_vec()),
        Some(IpAddr::V6(v6)) => Cow::Owned(v6.octets().to_vec()),
        None => Cow::Borrowed(b""),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn header_key_else_client_ip() {
        let mut h = http::HeaderMap::new();
        let uri: http::Uri = "/a/b?k=v".parse().unwrap();
        let ip = Some("10.0.0.1".parse().unwrap());
        let k = HashKey::Header(http::HeaderName::from_static("x-api-key"));
        assert_eq!(&*hash_bytes(&k, &h, &uri, ip), &[10, 0, 0, 1]);
        h.insert("x-api-key", "abc".parse().unwrap());
        assert_eq!(&*hash_bytes(&k, &h, &uri, ip), b"abc");
        assert_eq!(&*hash_bytes(&HashKey::Path, &h, &uri, ip), b"/a/b");
        assert_eq!(
            &*hash_bytes(&HashKey::Query("k".into()), &h, &uri, ip),
            b"v"
        );
    }
}
