//! Request framing the proxy refuses to forward (CONTRACT §7, RFC 9112 §6).
//!
//! Pingora 0.9.1 already answers 400 and closes for: differing duplicate
//! `Content-Length`, a final coding other than `chunked`, `Transfer-Encoding` on
//! HTTP/1.0, and control bytes (NUL, bare CR) in a header. It *accepts* two
//! things that a front proxy must not forward:
//!
//! - `Content-Length` together with `Transfer-Encoding`: Pingora drops the
//!   `Content-Length` and frames by chunks (and turns keep-alive off), so a
//!   backend or another hop that framed by length would disagree. The header it
//!   dropped is only visible in the raw header block.
//! - a coding before `chunked` (`gzip, chunked`, or two `Transfer-Encoding`
//!   fields): Pingora forwards the body as plain chunked, losing the coding.
//!
//! Both are answered 400 with the connection closed, before anything is sent
//! upstream. Pure functions over the parsed header and its raw bytes.

use bytes::Bytes;
use http::header::{HeaderMap, CONTENT_LENGTH, TRANSFER_ENCODING};

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ambiguity {
    /// Both `Content-Length` and `Transfer-Encoding`.
    LengthAndChunked,
    /// A transfer coding other than exactly `chunked`.
    UnsupportedCoding,
}

impl Ambiguity {
    pub fn as_str(self) -> &'static str {
        match self {
            Ambiguity::LengthAndChunked => "both Content-Length and Transfer-Encoding",
            Ambiguity::UnsupportedCoding => "transfer coding other than chunked",
        }
    }
}

/// Checks a request header. `raw_header` gives the header block as received
/// (HTTP/1.x), read only when a `Transfer-Encoding` is present.
pub fn check(
    headers: &HeaderMap,
    raw_header: impl FnOnce() -> Option<Bytes>,
) -> Result<(), Ambiguity> {
    if !headers.contains_key(TRANSFER_ENCODING) {
        return Ok(());
    }
    if !coding_is_only_chunked(headers) {
        return Err(Ambiguity::UnsupportedCoding);
    }
    if raw_header().is_some_and(|raw| has_content_length_field(&raw)) {
        return Err(Ambiguity::LengthAndChunked);
    }
    Ok(())
}

/// Whether a request target (as parsed) holds a byte that no URI may hold
/// (RFC 3986 §2; RFC 9112 §3.2): a control byte, space, DEL, `"`, `<` or `>`,
/// or a `#`: a request target has no fragment (RFC 9112 §3.2), and the URI
/// parser drops one with everything after it, query included, so `/a#x?k=v`
/// would go upstream as `/a` (HAProxy refuses it too, CVE-2023-45539).
/// `httparse` lets `"`, `<`, `>` and `#` through. Bytes above 0x7F (raw UTF-8)
/// are left to the backend, as Pingora does.
pub fn target_has_invalid_byte(target: &[u8]) -> bool {
    target
        .iter()
        .any(|&b| b <= b' ' || b == 0x7f || matches!(b, b'"' | b'<' | b'>' | b'#'))
}

/// The request target of a raw HTTP/1 header block (the request line's second field,
/// after any empty lines): the bytes as received, before the URI parser drops a fragment.
pub fn raw_target(raw: &[u8]) -> &[u8] {
    raw.split(|&b| b == b'\n')
        .find(|l| !l.is_empty() && *l != b"\r")
        .and_then(|line| line.split(|&b| b == b' ').nth(1))
        .unwrap_or_default()
}

/// `Content-Length` sent as a list (`5, 5`, RFC 9110 §8.6) or on several lines: the one
/// value to send upstream in its place. `Ok(None)`: one plain value, or none (nothing to
/// do). `Err(())`: the elements differ or one is not a number (Pingora refuses that
/// already; checked again here so that no list is ever passed on).
#[allow(clippy::result_unit_err)]
pub fn content_length_list(headers: &HeaderMap) -> Result<Option<http::HeaderValue>, ()> {
    let mut fields = headers.get_all(CONTENT_LENGTH).iter();
    let Some(first) = fields.next() else {
        return Ok(None);
    };
    let mut rest = fields.peekable();
    if rest.peek().is_none() && !first.as_bytes().contains(&b',') {
        return Ok(None);
    }
    let mut value: Option<&[u8]> = None;
    for field in std::iter::once(first).chain(rest) {
        for part in field.as_bytes().split(|&b| b == b',') {
            let part = part.trim_ascii();
            if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
                return Err(());
            }
            match value {
                Some(v) if v != part => return Err(()),
                _ => value = Some(part),
            }
        }
    }
    value
        .and_then(|v| http::HeaderValue::from_bytes(v).ok())
        .map(Some)
        .ok_or(())
}

/// A request target `*` (asterisk-form, `:path *`) on any method but `OPTIONS`: RFC 9112
/// §3.2.4 and RFC 9113 §8.3.1 allow it only there.
pub fn asterisk_target_misused(method: &http::Method, raw_target: &[u8]) -> bool {
    raw_target == b"*" && method != http::Method::OPTIONS
}

/// A request target in none of the four forms of RFC 9112 §3.2: origin-form (`/` first),
/// absolute-form (a scheme and `:` first, RFC 3986 §3.1), authority-form (CONNECT only,
/// left to Pingora's checks) and asterisk-form (`*`). `?q`, `` `/a``, `{/a`, `%00/a` or
/// `x` would otherwise go upstream as they came, and a backend reads them as it likes
/// (as `/?q`, as `/a`, or refuses them); RFC 9112 §3 has an invalid request line answered
/// 400, as HAProxy does (found by the differential target, fuzz/differential/).
pub fn target_form_invalid(method: &http::Method, raw_target: &[u8]) -> bool {
    if method == http::Method::CONNECT || raw_target == b"*" || raw_target.first() == Some(&b'/') {
        return false;
    }
    let scheme = raw_target.split(|&b| b == b':').next().unwrap_or_default();
    let is_scheme = scheme.len() < raw_target.len()
        && scheme.first().is_some_and(u8::is_ascii_alphabetic)
        && scheme
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    !is_scheme
}

/// One `Transfer-Encoding` field, and its coding `chunked` and nothing else: the only
/// framing by transfer coding that is passed on (requests), or that can be decoded for
/// a client that cannot read it (responses to HTTP/1.0).
pub fn coding_is_only_chunked(headers: &HeaderMap) -> bool {
    let mut fields = headers.get_all(TRANSFER_ENCODING).iter();
    fields
        .next()
        .is_some_and(|first| is_only_chunked(first.as_bytes()))
        && fields.next().is_none()
}

/// `chunked` and nothing else (case-insensitive, optional whitespace around).
fn is_only_chunked(value: &[u8]) -> bool {
    value
        .trim_ascii_start()
        .trim_ascii_end()
        .eq_ignore_ascii_case(b"chunked")
}

/// Whether a raw header block (request line first) has a `Content-Length` field.
fn has_content_length_field(raw: &[u8]) -> bool {
    raw.split(|&b| b == b'\n').skip(1).any(|line| {
        line.iter()
            .position(|&b| b == b':')
            .is_some_and(|i| line[..i].eq_ignore_ascii_case(b"content-length"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn no_transfer_encoding_passes_without_reading_raw() {
        let h = headers(&[("content-length", "5")]);
        assert_eq!(check(&h, || panic!("raw read without TE")), Ok(()));
    }

    #[test]
    fn only_exactly_chunked_is_accepted() {
        for ok in ["chunked", "CHUNKED", " chunked ", "Chunked"] {
            let h = headers(&[("transfer-encoding", ok)]);
            assert_eq!(
                check(&h, || Some(Bytes::from_static(b"POST / HTTP/1.1\r\n\r\n"))),
                Ok(()),
                "{ok}"
            );
        }
        for bad in [
            "gzip, chunked",
            "chunked, chunked",
            "xchunked",
            "identity",
            "",
            "chunked;q=1",
        ] {
            let h = headers(&[("transfer-encoding", bad)]);
            assert_eq!(
                check(&h, || None),
                Err(Ambiguity::UnsupportedCoding),
                "{bad:?}"
            );
        }
        let two = headers(&[
            ("transfer-encoding", "gzip"),
            ("transfer-encoding", "chunked"),
        ]);
        assert_eq!(check(&two, || None), Err(Ambiguity::UnsupportedCoding));
    }

    #[test]
    fn invalid_target_bytes() {
        // `#`: found by the http1 fuzz target (`POST #up` went upstream as `POST /`)
        let bad: [&[u8]; 8] = [
            b"/a b",
            b"/a\"b",
            b"/<x>",
            b"/a\tb",
            b"/\x7f",
            b"/a\0",
            b"/a#x?k=v",
            b"#up",
        ];
        let ok: [&[u8]; 5] = [b"/a%20b?x=1&y=%22", b"/", b"*", b"/caf\xc3\xa9", b"/a{b}|c"];
        for (targets, invalid) in [(&bad[..], true), (&ok[..], false)] {
            for t in targets {
                assert_eq!(target_has_invalid_byte(t), invalid, "{t:?}");
                let mut raw = b"\r\nGET ".to_vec();
                raw.extend_from_slice(t);
                raw.extend_from_slice(b" HTTP/1.1\r\nHost: x\r\n\r\n");
                if !t.contains(&b' ') {
                    assert_eq!(raw_target(&raw), *t);
                }
            }
        }
    }

    #[test]
    fn content_length_lists_collapse_to_one_value_or_are_refused() {
        assert_eq!(content_length_list(&headers(&[])), Ok(None));
        assert_eq!(
            content_length_list(&headers(&[("content-length", "5")])),
            Ok(None)
        );
        for same in [
            &[("content-length", "5, 5")][..],
            &[("content-length", "5,5,5")],
            &[("content-length", "5"), ("content-length", "5")],
            &[("content-length", " 5 ,5"), ("content-length", "5")],
        ] {
            assert_eq!(
                content_length_list(&headers(same)),
                Ok(Some(HeaderValue::from_static("5"))),
                "{same:?}"
            );
        }
        for bad in [
            &[("content-length", "5, 6")][..],
            &[("content-length", "5,")],
            &[("content-length", "5"), ("content-length", "6")],
            &[("content-length", "5, x")],
        ] {
            assert_eq!(content_length_list(&headers(bad)), Err(()), "{bad:?}");
        }
    }

    #[test]
    fn asterisk_form_only_for_options() {
        assert!(!asterisk_target_misused(&http::Method::OPTIONS, b"*"));
        assert!(asterisk_target_misused(&http::Method::GET, b"*"));
        assert!(asterisk_target_misused(&http::Method::POST, b"*"));
        assert!(!asterisk_target_misused(&http::Method::GET, b"/*"));
    }

    #[test]
    fn a_target_in_no_form_of_rfc_9112_is_invalid() {
        use http::Method;
        let get = Method::GET;
        for bad in [
            &b"?q"[..],
            b"`/a",
            b"{/a",
            b"%00/a",
            b"x",
            b"",
            b"1http://a/",
            b":x",
            b".a:b",
        ] {
            assert!(target_form_invalid(&get, bad), "{bad:?}");
        }
        for ok in [
            &b"/"[..],
            b"/a?q",
            b"//a",
            b"*",
            b"http://a/b",
            b"HTTP://a",
            b"ftp://a/b",
            b"example.test:443",
            b"urn:x",
            b"a+b-c.d:e",
        ] {
            assert!(!target_form_invalid(&get, ok), "{ok:?}");
        }
        assert!(!target_form_invalid(&Method::CONNECT, b"example.test:443"));
        assert!(!target_form_invalid(&Method::CONNECT, b"x"));
    }

    #[test]
    fn content_length_next_to_chunked_is_found_in_the_raw_block() {
        // Pingora removed Content-Length from the parsed header; the raw block keeps it.
        let h = headers(&[("transfer-encoding", "chunked")]);
        for raw in [
            &b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 72\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\ncOnTeNt-LeNgTh:5\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\nTransfer-Encoding: chunked\ncontent-length: 1\n\n",
        ] {
            assert_eq!(
                check(&h, || Some(Bytes::from_static(raw))),
                Err(Ambiguity::LengthAndChunked),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
        // a value mentioning content-length is not the field
        let raw = b"POST /content-length: HTTP/1.1\r\nX-A: content-length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(check(&h, || Some(Bytes::from_static(raw))), Ok(()));
    }
}
