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
    /// A non-empty key of at most `max_key_bytes` bytes.
    Key(Cow<'a, str>),
    /// No key, or an empty one.
    Missing,
    /// Longer than `max_key_bytes` (answer 400, never store it).
    TooLong,
}

/// Reads the API key of a request. Surrounding whitespace is trimmed; a value that is not
/// valid UTF-8 is converted lossily.
pub fn extract_key<'a>(
    src: &KeySource,
    headers: &'a http::HeaderMap,
    uri: &'a http::Uri,
    max_key_bytes: usize,
) -> KeyOutcome<'a> {
    match src {
        KeySource::Header(name) => match headers.get(name) {
            Some(v) => finish(bytes_to_str(v.as_bytes()), max_key_bytes),
            None => KeyOutcome::Missing,
        },
        KeySource::Bearer => {
            let Some(v) = headers.get(http::header::AUTHORIZATION) else {
                return KeyOutcome::Missing;
            };
            let b = v.as_bytes();
            let b = trim(b);
            if b.len() < 7 || !b[..6].eq_ignore_ascii_case(b"bearer") || !is_ws(b[6]) {
                return KeyOutcome::Missing;
            }
            finish(bytes_to_str(&b[7..]), max_key_bytes)
        }
        KeySource::Query(name) => {
            let Some(q) = uri.query() else {
                return KeyOutcome::Missing;
            };
            for pair in q.split('&') {
                let (k, v) = match pair.split_once('=') {
                    Some((k, v)) => (k, v),
                    None => (pair, ""),
                };
                if k != name && percent_decode(k, usize::MAX).as_deref() != Some(name.as_str()) {
                    continue;
                }
                // Fast reject before decoding: a decoded byte needs at most 3 raw bytes.
                if v.len() > max_key_bytes.saturating_mul(3) {
                    return KeyOutcome::TooLong;
                }
                return match percent_decode(v, max_key_bytes.saturating_add(1)) {
                    Some(s) => finish(s, max_key_bytes),
                    None => KeyOutcome::Missing,
                };
            }
            KeyOutcome::Missing
        }
    }
}

fn is_ws(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn trim(mut b: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = b {
        if is_ws(*first) {
            b = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = b {
        if is_ws(*last) {
            b = rest;
        } else {
            break;
        }
    }
    b
}

fn bytes_to_str(b: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(trim(b))
}

fn finish(s: Cow<'_, str>, max: usize) -> KeyOutcome<'_> {
    let t = s.trim();
    if t.is_empty() {
        return KeyOutcome::Missing;
    }
    if t.len() > max {
        return KeyOutcome::TooLong;
    }
    if t.len() == s.len() {
        KeyOutcome::Key(s)
    } else {
        KeyOutcome::Key(Cow::Owned(t.to_owned()))
    }
}

/// Decodes `%XX` escapes (invalid escapes are kept literally). Stops early once the output
/// exceeds `limit` bytes (the caller then sees an over-long key).
fn percent_decode(s: &str, limit: usize) -> Option<Cow<'_, str>> {
    if !s.contains('%') {
        return Some(Cow::Borrowed(s));
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len().min(limit));
    let mut i = 0;
    while i < b.len() && out.len() <= limit {
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
    Some(Cow::Owned(String::from_utf8_lossy(&out).into_owned()))
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
            KeyOutcome::Key(k) => Some(k.into_owned()),
            _ => None,
        }
    }

    #[test]
    fn header_source() {
        let src = KeySource::Header(http::HeaderName::from_static("x-api-key"));
        let uri: http::Uri = "/p".parse().unwrap();
        let h = hm(&[("x-api-key", " abc "), ("x-api-key", "second")]);
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
            KeyOutcome::Key(Cow::Borrowed("abc"))
        ));
    }

    #[test]
    fn bearer_source() {
        let uri: http::Uri = "/".parse().unwrap();
        let s = KeySource::Bearer;
        let t = |v: &str| match extract_key(&s, &hm(&[("authorization", v)]), &uri, 8) {
            KeyOutcome::Key(k) => KeyOutcome::Key(Cow::Owned(k.into_owned())),
            KeyOutcome::Missing => KeyOutcome::Missing,
            KeyOutcome::TooLong => KeyOutcome::TooLong,
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
                KeyOutcome::Key(k) => Ok(k.into_owned()),
                other => Err(format!("{other:?}")),
            }
        };
        assert_eq!(t("/x?a=1&api_key=abc&api_key=zzz"), Ok("abc".into()));
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
}
