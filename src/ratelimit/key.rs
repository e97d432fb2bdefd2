//! Extraction of the API key from a request.

use std::borrow::Cow;

/// Where the API key is read from (`rate_limit.key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `header:NAME` — the first value of that header.
    Header(http::HeaderName),
    /// `query:NAME` — the first query parameter of that name (percent-decoded, `+` kept).
    Query(String),
    /// `bearer` — `Authorization: Bearer <token>` (scheme case-insensitive).
    Bearer,
    /// `jwt:CLAIM` — that claim of the bearer token, once the token is verified
    /// ([`extract_request_key`] with `[jwt]`'s verifier).
    Jwt(String),
}

/// What to do when the key is missing (`rate_limit.missing_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingKey {
    /// Limit by client address instead.
    ClientIp,
    /// Answer 401.
    Reject,
    /// Let the request through unlimited.
    Allow,
}

/// Result of [`extract_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOutcome<'a> {
    /// A non-empty key of at most `max_key_bytes` bytes. Keys are bytes: a value that is not
    /// valid UTF-8 is kept as is (never converted lossily, so `a\xff` and `a\xfe` stay two
    /// keys).
    Key(Cow<'a, [u8]>),
    /// No key, or an empty one.
    Missing,
    /// Longer than `max_key_bytes` (answer 400, never store it).
    TooLong,
    /// More than one value for the key: the key header twice, `Authorization` twice (for
    /// `bearer`), one key header line whose value is a comma-separated list (`a, b`: the
    /// same as two lines, RFC 9110 §5.3), or the query parameter twice (`&` or `;` as the
    /// separator). Answer 400 and never forward the request: the limiter would count one
    /// value while the backend may act on another.
    Duplicate,
    /// A bearer token that does not verify (`jwt:CLAIM`): forged, expired, of another
    /// issuer or audience, of a refused algorithm. Answer 401 `invalid_token`.
    Invalid,
}

impl KeyOutcome<'_> {
    /// The same outcome, its key borrowed from this one (no copy).
    #[inline]
    pub fn reborrow(&self) -> KeyOutcome<'_> {
        match self {
            KeyOutcome::Key(k) => KeyOutcome::Key(Cow::Borrowed(k)),
            KeyOutcome::Missing => KeyOutcome::Missing,
            KeyOutcome::TooLong => KeyOutcome::TooLong,
            KeyOutcome::Duplicate => KeyOutcome::Duplicate,
            KeyOutcome::Invalid => KeyOutcome::Invalid,
        }
    }
}

/// The key of a request under `src`: [`extract_key`], and for `jwt:CLAIM` the claim of the
/// bearer token once `jwt` verified it at `now_secs`. A request without a bearer token, or
/// whose valid token lacks the claim (or holds neither a string nor a number there), has
/// no key; a token that does not verify is [`KeyOutcome::Invalid`]. `client_ip` is the
/// request's address, whose tokens that fail are counted (past a limit its unknown tokens
/// are refused unchecked).
pub fn extract_request_key<'a>(
    src: &KeySource,
    jwt: Option<&super::jwt::Verifier>,
    headers: &'a http::HeaderMap,
    uri: &'a http::Uri,
    max_key_bytes: usize,
    now_secs: u64,
    client_ip: Option<std::net::IpAddr>,
) -> KeyOutcome<'a> {
    let KeySource::Jwt(claim) = src else {
        return extract_key(src, headers, uri, max_key_bytes);
    };
    let Some(verifier) = jwt else {
        // No keys to verify with (validation refuses this config): never a key.
        return KeyOutcome::Invalid;
    };
    let token = match extract_key(
        &KeySource::Bearer,
        headers,
        uri,
        super::jwt::MAX_TOKEN_BYTES,
    ) {
        KeyOutcome::Key(t) => t,
        KeyOutcome::TooLong => return KeyOutcome::Invalid,
        other => return other,
    };
    match verifier.claim_key(&token, claim, now_secs, client_ip) {
        Ok(Some(k)) => finish(Cow::Owned(k), max_key_bytes),
        Ok(None) => KeyOutcome::Missing,
        Err(_) => KeyOutcome::Invalid,
    }
}

/// Reads the API key of a request. Surrounding ASCII whitespace is trimmed; a request with
/// more than one value for the key is [`KeyOutcome::Duplicate`], whatever the values.
pub fn extract_key<'a>(
    src: &KeySource,
    headers: &'a http::HeaderMap,
    uri: &'a http::Uri,
    max_key_bytes: usize,
) -> KeyOutcome<'a> {
    match src {
        KeySource::Header(name) => match single(headers, name) {
            Ok(Some(v)) => finish(Cow::Borrowed(v.as_bytes()), max_key_bytes),
            Ok(None) => KeyOutcome::Missing,
            Err(d) => d,
        },
        KeySource::Bearer => {
            let v = match single(headers, &http::header::AUTHORIZATION) {
                Ok(Some(v)) => v,
                Ok(None) => return KeyOutcome::Missing,
                Err(d) => return d,
            };
            let b = trim(v.as_bytes());
            if b.len() < 7 || !b[..6].eq_ignore_ascii_case(b"bearer") || !is_ws(b[6]) {
                return KeyOutcome::Missing;
            }
            finish(Cow::Borrowed(&b[7..]), max_key_bytes)
        }
        // Only with the verifier (`extract_request_key`): unverified, never a key.
        KeySource::Jwt(_) => KeyOutcome::Invalid,
        KeySource::Query(name) => {
            let Some(q) = uri.query() else {
                return KeyOutcome::Missing;
            };
            let mut found: Option<&str> = None;
            // `;` separates parameters too for many frameworks: `key=a;key=b` is two keys.
            for pair in q.split(['&', ';']) {
                let (k, v) = match pair.split_once('=') {
                    Some((k, v)) => (k, v),
                    None => (pair, ""),
                };
                if k != name && percent_decode(k).as_ref() != name.as_bytes() {
                    continue;
                }
                if found.is_some() {
                    return KeyOutcome::Duplicate;
                }
                found = Some(v);
            }
            let Some(v) = found else {
                return KeyOutcome::Missing;
            };
            // Decoded whole, then trimmed, then measured (the value is bounded by the
            // request header's size): a decoding cut short at the limit could end in
            // whitespace that trimming removes and pass a prefix of an over-long key as the
            // key, and a length check before decoding refuses a key padded with `%20`.
            finish(percent_decode(v), max_key_bytes)
        }
    }
}

/// The one value of header `name`: `Ok(None)` without one, `Err(Duplicate)` with several,
/// whether as several field lines or as one line holding a comma-separated list (a
/// recipient may combine the lines into that list, RFC 9110 §5.3, so both mean the same;
/// no API key or bearer token holds a comma).
fn single<'a>(
    headers: &'a http::HeaderMap,
    name: &http::HeaderName,
) -> Result<Option<&'a http::HeaderValue>, KeyOutcome<'static>> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(_), Some(_)) => Err(KeyOutcome::Duplicate),
        (Some(v), None) if v.as_bytes().contains(&b',') => Err(KeyOutcome::Duplicate),
        (v, _) => Ok(v),
    }
}

fn is_ws(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn trim(b: &[u8]) -> &[u8] {
    b.trim_ascii()
}

fn finish(s: Cow<'_, [u8]>, max: usize) -> KeyOutcome<'_> {
    let t = trim(&s);
    if t.is_empty() {
        return KeyOutcome::Missing;
    }
    if t.len() > max {
        return KeyOutcome::TooLong;
    }
    if t.len() == s.len() {
        KeyOutcome::Key(s)
    } else {
        match s {
            Cow::Borrowed(b) => KeyOutcome::Key(Cow::Borrowed(trim(b))),
            Cow::Owned(v) => KeyOutcome::Key(Cow::Owned(trim(&v).to_vec())),
        }
    }
}

/// Decodes `%XX` escapes into bytes (invalid escapes are kept literally; the result need
/// not be UTF-8).
fn percent_decode(s: &str) -> Cow<'_, [u8]> {
    if !s.contains('%') {
        return Cow::Borrowed(s.as_bytes());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    Cow::Owned(out)
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn hm(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn key(o: KeyOutcome<'_>) -> Option<String> {
        match o {
            KeyOutcome::Key(k) => Some(String::from_utf8(k.into_owned()).unwrap()),
            _ => None,
        }
    }

    #[test]
    fn header_source() {
        let src = KeySource::Header(http::HeaderName::from_static("x-api-key"));
        let uri: http::Uri = "/p".parse().unwrap();
        let h = hm(&[("x-api-key", " abc ")]);
        assert_eq!(
            key(extract_key(&src, &h, &uri, 256)).as_deref(),
            Some("abc")
        );
        assert_eq!(extract_key(&src, &hm(&[]), &uri, 256), KeyOutcome::Missing);
        assert_eq!(
            extract_key(&src, &hm(&[("x-api-key", "")]), &uri, 256),
            KeyOutcome::Missing
        );
        assert_eq!(
            extract_key(&src, &hm(&[("x-api-key", "   ")]), &uri, 256),
            KeyOutcome::Missing
        );
        let long = "k".repeat(257);
        assert_eq!(
            extract_key(&src, &hm(&[("x-api-key", &long)]), &uri, 256),
            KeyOutcome::TooLong
        );
        let exact = "k".repeat(256);
        assert_eq!(
            key(extract_key(&src, &hm(&[("x-api-key", &exact)]), &uri, 256)),
            Some(exact)
        );
        // Borrowed when no conversion needed.
        let h = hm(&[("x-api-key", "abc")]);
        assert!(matches!(
            extract_key(&src, &h, &uri, 256),
            KeyOutcome::Key(Cow::Borrowed(b"abc"))
        ));
    }

    #[test]
    fn more_than_one_value_is_a_duplicate() {
        let src = KeySource::Header(http::HeaderName::from_static("x-api-key"));
        let uri: http::Uri = "/p".parse().unwrap();
        for pairs in [
            &[("x-api-key", "rnd-1"), ("x-api-key", "realkey")][..],
            &[("x-api-key", "same"), ("x-api-key", "same")],
            &[("x-api-key", ""), ("x-api-key", "realkey")],
            &[("x-api-key", "k"), ("other", "1"), ("X-Api-Key", "k2")],
        ] {
            assert_eq!(
                extract_key(&src, &hm(pairs), &uri, 256),
                KeyOutcome::Duplicate,
                "{pairs:?}"
            );
        }
        let b = KeySource::Bearer;
        let two = hm(&[("authorization", "Bearer a"), ("authorization", "Bearer b")]);
        assert_eq!(extract_key(&b, &two, &uri, 256), KeyOutcome::Duplicate);
        let mixed = hm(&[("authorization", "Basic x"), ("authorization", "Bearer b")]);
        assert_eq!(extract_key(&b, &mixed, &uri, 256), KeyOutcome::Duplicate);
        // One line holding a list is two values (RFC 9110 §5.3), whatever the values.
        for v in ["a, b", "a,b", "a,", ",a", "same, same"] {
            let h = hm(&[("x-api-key", v)]);
            assert_eq!(
                extract_key(&src, &h, &uri, 256),
                KeyOutcome::Duplicate,
                "{v}"
            );
        }
        let list = hm(&[("authorization", "Bearer a, Bearer b")]);
        assert_eq!(extract_key(&b, &list, &uri, 256), KeyOutcome::Duplicate);
        // Another header repeated is not the key's business.
        let h = hm(&[("x-api-key", "k"), ("accept", "a"), ("accept", "b")]);
        assert_eq!(key(extract_key(&src, &h, &uri, 256)).as_deref(), Some("k"));
    }

    #[test]
    fn keys_are_bytes() {
        let src = KeySource::Header(http::HeaderName::from_static("x-api-key"));
        let uri: http::Uri = "/p".parse().unwrap();
        let raw = |v: &[u8]| {
            let mut h = http::HeaderMap::new();
            h.insert("x-api-key", http::HeaderValue::from_bytes(v).unwrap());
            match extract_key(&src, &h, &uri, 256) {
                KeyOutcome::Key(k) => k.into_owned(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(raw(b"a\xff"), b"a\xff");
        assert_eq!(raw(b"a\xfe"), b"a\xfe");
        assert_eq!(raw(b" a\xff\t"), b"a\xff");
        let q = KeySource::Query("k".into());
        let h = http::HeaderMap::new();
        let dec = |u: &str| match extract_key(&q, &h, &u.parse().unwrap(), 256) {
            KeyOutcome::Key(k) => k.into_owned(),
            other => panic!("{other:?}"),
        };
        assert_eq!(dec("/?k=a%FF"), b"a\xff");
        assert_eq!(dec("/?k=a%FE"), b"a\xfe");
    }

    #[test]
    fn bearer_source() {
        let uri: http::Uri = "/".parse().unwrap();
        let s = KeySource::Bearer;
        let t = |v: &str| match extract_key(&s, &hm(&[("authorization", v)]), &uri, 8) {
            KeyOutcome::Key(k) => KeyOutcome::Key(Cow::Owned(k.into_owned())),
            KeyOutcome::Missing => KeyOutcome::Missing,
            KeyOutcome::TooLong => KeyOutcome::TooLong,
            KeyOutcome::Duplicate => KeyOutcome::Duplicate,
            KeyOutcome::Invalid => KeyOutcome::Invalid,
        };
        assert_eq!(key(t("Bearer tok123")).as_deref(), Some("tok123"));
        assert_eq!(key(t("bearer   tok")).as_deref(), Some("tok"));
        assert_eq!(t("Basic dXNlcjpwYXNz"), KeyOutcome::Missing);
        assert_eq!(t("Bearer"), KeyOutcome::Missing);
        assert_eq!(t("Bearer "), KeyOutcome::Missing);
        assert_eq!(t("Bearertok"), KeyOutcome::Missing);
        assert_eq!(t("Bearer 123456789"), KeyOutcome::TooLong);
        assert_eq!(extract_key(&s, &hm(&[]), &uri, 8), KeyOutcome::Missing);
    }

    #[test]
    fn query_source() {
        let s = KeySource::Query("api_key".into());
        let h = hm(&[]);
        let t = |u: &str| {
            let uri: http::Uri = u.parse().unwrap();
            match extract_key(&s, &h, &uri, 8) {
                KeyOutcome::Key(k) => Ok(String::from_utf8(k.into_owned()).unwrap()),
                other => Err(format!("{other:?}")),
            }
        };
        assert_eq!(t("/x?a=1&api_key=abc"), Ok("abc".into()));
        // The parameter twice (also spelled differently, or once empty): refused.
        assert_eq!(t("/x?a=1&api_key=abc&api_key=zzz"), Err("Duplicate".into()));
        assert_eq!(t("/x?api%5Fkey=abc&api_key=abc"), Err("Duplicate".into()));
        assert_eq!(t("/x?api_key=&api_key=abc"), Err("Duplicate".into()));
        // `;` separates parameters as `&` does.
        assert_eq!(t("/x?api_key=abc;api_key=zzz"), Err("Duplicate".into()));
        assert_eq!(t("/x?a=1;api_key=abc&api_key=z"), Err("Duplicate".into()));
        assert_eq!(t("/x?a=1;api_key=abc"), Ok("abc".into()));
        assert_eq!(t("/x?api_key=abc;v=2"), Ok("abc".into()));
        assert_eq!(t("/x?api_key=a%2Bb+c"), Ok("a+b+c".into()));
        assert_eq!(t("/x?api%5Fkey=k1"), Ok("k1".into()));
        assert_eq!(t("/x?api_key=%zz"), Ok("%zz".into()));
        assert_eq!(t("/x?api_key="), Err("Missing".into()));
        assert_eq!(t("/x?api_key"), Err("Missing".into()));
        assert_eq!(t("/x?other=1"), Err("Missing".into()));
        assert_eq!(t("/x"), Err("Missing".into()));
        assert_eq!(t("/x?api_key=123456789"), Err("TooLong".into()));
        assert_eq!(
            t("/x?api_key=%31%32%33%34%35%36%37%38"),
            Ok("12345678".into())
        );
        assert_eq!(
            t("/x?api_key=%31%32%33%34%35%36%37%38%39"),
            Err("TooLong".into())
        );
    }

    /// Found by fuzzing (fuzz/corpus/key/query_ws*): the value was decoded only up to
    /// `max_key_bytes + 1` bytes, so whitespace around it let a prefix of an over-long key
    /// through as the key (`  abcde`, max 4: `abcd`); and a value longer than 3 bytes per
    /// allowed byte was refused before decoding, a key padded with `%20` included.
    #[test]
    fn a_query_key_is_measured_whole_after_trimming() {
        let src = KeySource::Query("key".into());
        let h = hm(&[]);
        let t = |q: &str, max| {
            let uri: http::Uri = q.parse().unwrap();
            match extract_key(&src, &h, &uri, max) {
                KeyOutcome::Key(k) => Ok(k.into_owned()),
                other => Err(format!("{other:?}")),
            }
        };
        assert_eq!(t("/p?key=%20%20abcde", 4), Err("TooLong".into()));
        assert_eq!(t("/p?key=abcd%20%20x", 4), Err("TooLong".into()));
        assert_eq!(t("/p?key=%20%20abcd%20", 4), Ok(b"abcd".to_vec()));
    }
}
