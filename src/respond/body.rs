//! The bodies of the responses the proxy writes itself (`[errors]`): the refusal's own
//! short text, RFC 9457 problem details (`application/problem+json`), or an operator's
//! page per status. Whatever does not change from one request to the next is rendered at
//! config load: a page's template is split once into its literal parts and its
//! per-request fields (`{status}` is filled in then); nothing here reads a file.

use std::fmt;

use bytes::{Bytes, BytesMut};
use http::HeaderValue;

/// `errors.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// The refusal's own text (`text/plain`).
    #[default]
    Text,
    /// RFC 9457 problem details.
    ProblemJson,
}

/// What a body may show of one answer.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    pub status: u16,
    /// The problem type's last part (`rate-limited`); `None`: `about:blank`.
    pub kind: Option<&'static str>,
    /// The refusal's text (`portcullis: rate limited\n`): the text body, and the
    /// problem's `detail` without its `portcullis: ` and newline.
    pub text: &'static str,
    /// The response's `Retry-After`, in seconds.
    pub retry_after: Option<u64>,
    /// The request's id, as the access log has it.
    pub request_id: Option<&'a [u8]>,
}

/// A rendered body and its `Content-Type`.
#[derive(Debug, Clone, PartialEq)]
pub struct Body {
    pub content_type: HeaderValue,
    pub bytes: Bytes,
}

/// `[errors]`, ready to answer with.
#[derive(Clone, PartialEq, Default)]
pub struct ErrorBodies {
    pub format: Format,
    /// `[errors.pages]` by status, ascending.
    pages: Vec<(u16, Page)>,
    /// The response to a header timeout, when it is not the text one.
    header_timeout: Option<Bytes>,
}

impl fmt::Debug for ErrorBodies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ErrorBodies")
            .field("format", &self.format)
            .field(
                "pages",
                &self.pages.iter().map(|(s, _)| s).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// One `[errors.pages]` entry: its template split at the per-request fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    content_type: HeaderValue,
    parts: Vec<Part>,
    /// The bytes of the literal parts.
    fixed_len: usize,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(Bytes),
    RetryAfter,
    RequestId,
}

const STATUS: &[u8] = b"{status}";
const RETRY_AFTER: &[u8] = b"{retry_after}";
const REQUEST_ID: &[u8] = b"{request_id}";

const TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

impl Page {
    /// The page of `status` from `template` (a file's bytes): `{status}` is filled in
    /// now, `{retry_after}` and `{request_id}` per answer. Any other text, braces
    /// included, is kept as it is.
    pub fn new(status: u16, template: &[u8], content_type: HeaderValue) -> Page {
        let mut parts = Vec::new();
        let mut lit = Vec::with_capacity(template.len());
        let mut rest = template;
        let status_text = status.to_string();
        while !rest.is_empty() {
            if rest.starts_with(STATUS) {
                lit.extend_from_slice(status_text.as_bytes());
                rest = &rest[STATUS.len()..];
            } else if let Some((part, len)) = field_at(rest) {
                if !lit.is_empty() {
                    parts.push(Part::Text(Bytes::from(std::mem::take(&mut lit))));
                }
                parts.push(part);
                rest = &rest[len..];
            } else {
                // up to the next brace, as one run
                let n = rest[1..]
                    .iter()
                    .position(|&b| b == b'{')
                    .map_or(rest.len(), |i| i + 1);
                lit.extend_from_slice(&rest[..n]);
                rest = &rest[n..];
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Text(Bytes::from(lit)));
        }
        let fixed_len = parts
            .iter()
            .map(|p| match p {
                Part::Text(b) => b.len(),
                _ => 0,
            })
            .sum();
        Page {
            content_type,
            parts,
            fixed_len,
        }
    }

    fn shows_request_id(&self) -> bool {
        self.parts.contains(&Part::RequestId)
    }

    fn render(&self, a: &Answer<'_>) -> Bytes {
        // A page without per-request fields is one shared buffer: no copy.
        if let [Part::Text(b)] = self.parts.as_slice() {
            return b.clone();
        }
        if self.parts.is_empty() {
            return Bytes::new();
        }
        let mut out =
            BytesMut::with_capacity(self.fixed_len + 24 + a.request_id.map_or(0, <[u8]>::len));
        let mut digits = itoa::Buffer::new();
        for p in &self.parts {
            match p {
                Part::Text(b) => out.extend_from_slice(b),
                Part::RetryAfter => {
                    if let Some(s) = a.retry_after {
                        out.extend_from_slice(digits.format(s).as_bytes());
                    }
                }
                Part::RequestId => out.extend_from_slice(a.request_id.unwrap_or_default()),
            }
        }
        out.freeze()
    }
}

/// The per-request field `bytes` begins with, and its length.
fn field_at(bytes: &[u8]) -> Option<(Part, usize)> {
    if bytes.starts_with(RETRY_AFTER) {
        Some((Part::RetryAfter, RETRY_AFTER.len()))
    } else if bytes.starts_with(REQUEST_ID) {
        Some((Part::RequestId, REQUEST_ID.len()))
    } else {
        None
    }
}

impl ErrorBodies {
    /// `pages`: (status, page), any order, one per status.
    pub fn new(format: Format, mut pages: Vec<(u16, Page)>) -> ErrorBodies {
        pages.sort_by_key(|(s, _)| *s);
        let mut bodies = ErrorBodies {
            format,
            pages,
            header_timeout: None,
        };
        if format != Format::Text || bodies.page(408).is_some() {
            bodies.header_timeout = Some(bodies.render_header_timeout());
        }
        bodies
    }

    /// The whole HTTP/1.1 response to a header block that took too long, rendered at
    /// load, when it is not the stream's plain-text one.
    pub fn header_timeout_response(&self) -> Option<&Bytes> {
        self.header_timeout.as_ref()
    }

    fn page(&self, status: u16) -> Option<&Page> {
        // A handful at most: a scan is as fast as any index.
        self.pages
            .iter()
            .find(|(s, _)| *s == status)
            .map(|(_, p)| p)
    }

    /// Whether the body of a `status` answer shows the request's id (the caller then
    /// finds or makes one). False for the text format: its answers cost no id.
    pub fn shows_request_id(&self, status: u16) -> bool {
        match self.page(status) {
            Some(p) => p.shows_request_id(),
            None => self.format == Format::ProblemJson,
        }
    }

    /// The body of `a`: its status's page, else the format's.
    pub fn render(&self, a: &Answer<'_>) -> Body {
        if let Some(p) = self.page(a.status) {
            return Body {
                content_type: p.content_type.clone(),
                bytes: p.render(a),
            };
        }
        match self.format {
            Format::Text => Body {
                content_type: TEXT_PLAIN,
                bytes: Bytes::from_static(a.text.as_bytes()),
            },
            Format::ProblemJson => Body {
                content_type: PROBLEM_JSON,
                bytes: problem_json(a),
            },
        }
    }

    /// The whole HTTP/1.1 response to a header block that took too long, written by the
    /// client stream itself before any request exists (so without a request id).
    fn render_header_timeout(&self) -> Bytes {
        let body = self.render(&Answer {
            status: 408,
            kind: Some("header-timeout"),
            text: "portcullis: request header timed out\n",
            retry_after: None,
            request_id: None,
        });
        let mut out = BytesMut::with_capacity(160 + body.bytes.len());
        out.extend_from_slice(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: ");
        out.extend_from_slice(body.content_type.as_bytes());
        out.extend_from_slice(b"\r\ncontent-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(body.bytes.len()).as_bytes());
        out.extend_from_slice(b"\r\nconnection: close\r\n\r\n");
        out.extend_from_slice(&body.bytes);
        out.freeze()
    }
}

/// RFC 9457 problem details of `a`: `type`, `title`, `status`, `detail`, then
/// `retry_after` when the response has `Retry-After` and `request_id` when known.
fn problem_json(a: &Answer<'_>) -> Bytes {
    let title = http::StatusCode::from_u16(a.status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let detail = a.text.strip_prefix("portcullis: ").unwrap_or(a.text);
    let detail = detail.trim_end_matches('\n');
    let id_len = a.request_id.map_or(0, <[u8]>::len);
    let mut out = Vec::with_capacity(128 + title.len() + detail.len() + 2 * id_len);
    let mut digits = itoa::Buffer::new();
    match a.kind {
        Some(kind) => {
            out.extend_from_slice(b"{\"type\":\"urn:portcullis:problem:");
            out.extend_from_slice(kind.as_bytes());
        }
        None => out.extend_from_slice(b"{\"type\":\"about:blank"),
    }
    out.extend_from_slice(b"\",\"title\":\"");
    json_escaped(&mut out, title.as_bytes());
    out.extend_from_slice(b"\",\"status\":");
    out.extend_from_slice(digits.format(a.status).as_bytes());
    out.extend_from_slice(b",\"detail\":\"");
    json_escaped(&mut out, detail.as_bytes());
    out.push(b'"');
    if let Some(secs) = a.retry_after {
        out.extend_from_slice(b",\"retry_after\":");
        out.extend_from_slice(digits.format(secs).as_bytes());
    }
    if let Some(id) = a.request_id {
        out.extend_from_slice(b",\"request_id\":\"");
        json_escaped(&mut out, id);
        out.push(b'"');
    }
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

/// `s` (UTF-8, or visible ASCII) as the inside of a JSON string.
fn json_escaped(out: &mut Vec<u8>, s: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &b in s {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0..=0x1f | 0x7f => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]),
            _ => out.push(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited<'a>(id: Option<&'a [u8]>) -> Answer<'a> {
        Answer {
            status: 429,
            kind: Some("rate-limited"),
            text: "portcullis: rate limited\n",
            retry_after: Some(7),
            request_id: id,
        }
    }

    fn html() -> HeaderValue {
        HeaderValue::from_static("text/html")
    }

    #[test]
    fn text_is_the_refusals_own_body() {
        let b = ErrorBodies::default().render(&limited(None));
        assert_eq!(b.content_type, "text/plain; charset=utf-8");
        assert_eq!(&b.bytes[..], b"portcullis: rate limited\n");
        assert!(!ErrorBodies::default().shows_request_id(429));
    }

    #[test]
    fn problem_json_has_every_field_and_parses() {
        let bodies = ErrorBodies::new(Format::ProblemJson, Vec::new());
        assert!(bodies.shows_request_id(503));
        let b = bodies.render(&limited(Some(b"id\"with\\odd")));
        assert_eq!(b.content_type, "application/problem+json");
        let v: serde_json::Value = serde_json::from_slice(&b.bytes).unwrap();
        assert_eq!(v["type"], "urn:portcullis:problem:rate-limited");
        assert_eq!(v["title"], "Too Many Requests");
        assert_eq!(v["status"], 429);
        assert_eq!(v["detail"], "rate limited");
        assert_eq!(v["retry_after"], 7);
        assert_eq!(v["request_id"], "id\"with\\odd");
        // no Retry-After, no id: neither field
        let b = bodies.render(&Answer {
            status: 401,
            kind: None,
            text: "portcullis: API key required\n",
            retry_after: None,
            request_id: None,
        });
        let v: serde_json::Value = serde_json::from_slice(&b.bytes).unwrap();
        assert_eq!(v["type"], "about:blank");
        assert_eq!(v["title"], "Unauthorized");
        assert!(v.get("retry_after").is_none() && v.get("request_id").is_none());
    }

    #[test]
    fn a_page_fills_its_fields_and_wins_over_the_format() {
        let page = Page::new(
            429,
            b"<p>{status}: retry in {retry_after}s ({request_id}) {other} {</p>{",
            html(),
        );
        let bodies = ErrorBodies::new(Format::ProblemJson, vec![(429, page)]);
        assert!(bodies.shows_request_id(429));
        let b = bodies.render(&limited(Some(b"abc")));
        assert_eq!(b.content_type, "text/html");
        assert_eq!(
            &b.bytes[..],
            b"<p>429: retry in 7s (abc) {other} {</p>{".as_slice()
        );
        // without Retry-After or id, the fields are empty
        let b = bodies.render(&Answer {
            retry_after: None,
            ..limited(None)
        });
        assert_eq!(
            &b.bytes[..],
            b"<p>429: retry in s () {other} {</p>{".as_slice()
        );
        // another status: the format
        let b = bodies.render(&Answer {
            status: 503,
            ..limited(None)
        });
        assert_eq!(b.content_type, "application/problem+json");
    }

    #[test]
    fn a_page_without_per_request_fields_is_shared_not_copied() {
        let page = Page::new(503, b"busy: {status}", html());
        assert!(!page.shows_request_id());
        let bodies = ErrorBodies::new(Format::Text, vec![(503, page)]);
        assert!(!bodies.shows_request_id(503));
        let a = bodies.render(&Answer {
            status: 503,
            ..limited(None)
        });
        let b = bodies.render(&Answer {
            status: 503,
            ..limited(None)
        });
        assert_eq!(&a.bytes[..], b"busy: 503");
        assert_eq!(a.bytes.as_ptr(), b.bytes.as_ptr());
        let empty = Page::new(503, b"", html());
        assert!(empty.render(&limited(None)).is_empty());
    }

    #[test]
    fn the_header_timeout_response_is_whole() {
        assert!(ErrorBodies::default().header_timeout_response().is_none());
        let text = ErrorBodies::default().render_header_timeout();
        assert_eq!(
            &text[..],
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 37\r\nconnection: close\r\n\r\nportcullis: request header timed out\n".as_slice()
        );
        let json = ErrorBodies::new(Format::ProblemJson, Vec::new());
        let json = json.header_timeout_response().unwrap();
        let s = String::from_utf8(json.to_vec()).unwrap();
        let (head, body) = s.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("content-type: application/problem+json"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["status"], 408);
        assert!(v.get("request_id").is_none());
    }

    #[test]
    fn control_bytes_are_escaped() {
        let mut out = Vec::new();
        json_escaped(&mut out, b"a\nb\x01\x7f");
        assert_eq!(out, b"a\\u000ab\\u0001\\u007f");
    }
}
