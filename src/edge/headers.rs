//! Header rules at the edge: per-route set/remove on the upstream request and
//! on the response, hop-by-hop fields, the headers a gate reads, and
//! `X-Request-Id` hygiene. Pure functions over header maps.
//!
//! Pingora 0.9.1 already strips the standard hop-by-hop request fields and the
//! fields a request's `Connection` nominates before `upstream_request_filter`
//! (refusing nominations of `Host` and `X-Forwarded-*`). That would let a
//! client drop the API-key header a gate counted (`Connection: x-api-key`), so
//! [`restore`] puts the fields a gate reads back as the client sent them.

use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION};
use pingora::http::{RequestHeader, ResponseHeader};

/// The names the proxy adds to every request or response, parsed once: an
/// insert under one neither parses nor copies the name (the vendored
/// pingora-http's `StaticHeaderName`, vendor/README.md).
pub mod names {
    use pingora::http::StaticHeaderName;

    pub static X_FORWARDED_FOR: StaticHeaderName = StaticHeaderName::new("x-forwarded-for");
    pub static X_FORWARDED_PROTO: StaticHeaderName = StaticHeaderName::new("x-forwarded-proto");
    pub static X_REQUEST_ID: StaticHeaderName = StaticHeaderName::new("x-request-id");
    pub static TRACEPARENT: StaticHeaderName = StaticHeaderName::new("traceparent");
    pub static RATELIMIT_POLICY: StaticHeaderName = StaticHeaderName::new("ratelimit-policy");
    pub static RATELIMIT: StaticHeaderName = StaticHeaderName::new("ratelimit");

    /// Names only looked up, never added: a `HeaderName` skips parsing the name on each
    /// look-up (a `&str` key is parsed every time). The names above serve look-ups too,
    /// through `StaticHeaderName::name`.
    pub mod lookup {
        use http::HeaderName;
        pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
        pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
    }
}

/// `v` marked as a value unique to one request or response (a request id, a
/// `traceparent`, the `RateLimit` remaining count): HTTP/2 then sends it as an HPACK
/// literal that is never indexed, as HAProxy and nginx send every field. Indexed, each
/// such value entered the connection's 4 KB dynamic table, made the `h2` encoder compare
/// it with every entry already held under its name (about 50 per response once the table
/// was full of old request ids), and evicted the fields that repeat, which every 27th
/// response then sent again in full. The literal costs its name (about 15 bytes per
/// response here). HTTP/1 ignores the mark.
pub fn unique(mut v: HeaderValue) -> HeaderValue {
    v.set_sensitive(true);
    v
}

/// A header block the rules edit: an `http::HeaderMap`, or Pingora's request
/// and response headers (which must be edited through their own methods to
/// keep their case map in step).
pub trait Headers {
    fn map(&self) -> &HeaderMap;
    fn remove(&mut self, name: &HeaderName);
    fn insert(&mut self, name: &HeaderName, value: &HeaderValue);
    fn append(&mut self, name: &HeaderName, value: &HeaderValue);
}

impl Headers for HeaderMap {
    fn map(&self) -> &HeaderMap {
        self
    }
    fn remove(&mut self, name: &HeaderName) {
        HeaderMap::remove(self, name);
    }
    fn insert(&mut self, name: &HeaderName, value: &HeaderValue) {
        HeaderMap::insert(self, name.clone(), value.clone());
    }
    fn append(&mut self, name: &HeaderName, value: &HeaderValue) {
        HeaderMap::append(self, name.clone(), value.clone());
    }
}

macro_rules! pingora_headers {
    ($t:ty) => {
        impl Headers for $t {
            fn map(&self) -> &HeaderMap {
                &self.headers
            }
            fn remove(&mut self, name: &HeaderName) {
                self.remove_header(name);
            }
            // Names and values are valid already: these cannot fail.
            fn insert(&mut self, name: &HeaderName, value: &HeaderValue) {
                let _ = self.insert_header(name.clone(), value.clone());
            }
            fn append(&mut self, name: &HeaderName, value: &HeaderValue) {
                let _ = self.append_header(name.clone(), value.clone());
            }
        }
    };
}
pingora_headers!(RequestHeader);
pingora_headers!(ResponseHeader);

/// The header rules of a route: `request_headers_set/remove`,
/// `response_headers_set/remove` and the `request_headers` / `response_headers` tables
/// (`set`, `add`, `remove`), merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderRules {
    pub request: FieldRules,
    pub response: FieldRules,
}

/// Rules on one header block: removes, then sets (replacing), then adds (appending).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldRules {
    pub set: Vec<(HeaderName, HeaderValue)>,
    pub add: Vec<(HeaderName, HeaderValue)>,
    pub remove: Vec<HeaderName>,
}

impl FieldRules {
    pub const fn new() -> Self {
        Self {
            set: Vec::new(),
            add: Vec::new(),
            remove: Vec::new(),
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }

    /// Apply to `headers`: removes, then sets (a set replaces every earlier value), then
    /// adds.
    pub fn apply(&self, headers: &mut impl Headers) {
        apply(headers, &self.remove, &self.set);
        for (name, value) in &self.add {
            headers.append(name, value);
        }
    }
}

impl HeaderRules {
    pub const fn new() -> Self {
        Self {
            request: FieldRules::new(),
            response: FieldRules::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.request.is_empty() && self.response.is_empty()
    }
}

/// Fields no rule may set or remove: framing and the hop-by-hop fields the
/// proxy manages itself.
pub fn is_managed(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "content-length"
            | "transfer-encoding"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "upgrade"
            | "host"
    )
}

/// Apply removes then sets (a set replaces every earlier value).
pub fn apply(headers: &mut impl Headers, remove: &[HeaderName], set: &[(HeaderName, HeaderValue)]) {
    for name in remove {
        headers.remove(name);
    }
    for (name, value) in set {
        headers.insert(name, value);
    }
}

/// Put back `names` as the client sent them where they went missing on the
/// way upstream (a `Connection` nomination).
pub fn restore(original: &HeaderMap, upstream: &mut impl Headers, names: &[&HeaderName]) {
    for name in names {
        if upstream.map().contains_key(*name) {
            continue;
        }
        for v in original.get_all(*name) {
            upstream.append(name, v);
        }
    }
}

/// Strip hop-by-hop fields from a response: `Keep-Alive`, `Proxy-Connection`
/// and what its `Connection` nominates (framing fields excepted: Pingora frames
/// the response). `Connection` itself is Pingora's to write.
pub fn strip_response_hop_by_hop(headers: &mut impl Headers) {
    const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
    const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
    // Tokens of `Connection` that name no field to strip.
    const NOT_NOMINATED: [&str; 5] = [
        "keep-alive",
        "close",
        "content-length",
        "transfer-encoding",
        "upgrade",
    ];
    // One pass over the names instead of a hashed look-up per name: most responses
    // carry at most `Connection: keep-alive`.
    let (mut conn, mut keep_alive, mut proxy_conn) = (false, false, false);
    for k in headers.map().keys() {
        if k == CONNECTION {
            conn = true;
        } else if k == KEEP_ALIVE {
            keep_alive = true;
        } else if k == PROXY_CONNECTION {
            proxy_conn = true;
        }
    }
    let mut nominated: Vec<HeaderName> = Vec::new();
    if conn {
        for v in headers.map().get_all(CONNECTION) {
            for token in v.as_bytes().split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.is_empty()
                    || NOT_NOMINATED
                        .iter()
                        .any(|n| token.eq_ignore_ascii_case(n.as_bytes()))
                {
                    continue;
                }
                if let Ok(name) = HeaderName::from_bytes(token) {
                    nominated.push(name);
                }
            }
        }
    }
    for name in &nominated {
        headers.remove(name);
    }
    if keep_alive {
        headers.remove(&KEEP_ALIVE);
    }
    if proxy_conn {
        headers.remove(&PROXY_CONNECTION);
    }
}

/// An `X-Request-Id` is kept only if it is 1–128 visible ASCII characters.
pub fn valid_request_id(id: &[u8]) -> bool {
    (1..=128).contains(&id.len()) && id.iter().all(|b| (0x21..=0x7e).contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn a_static_name_inserts_as_its_spelling_does() {
        let statics = [
            &names::X_FORWARDED_FOR,
            &names::X_FORWARDED_PROTO,
            &names::X_REQUEST_ID,
            &names::TRACEPARENT,
            &names::RATELIMIT_POLICY,
            &names::RATELIMIT,
        ];
        let spelled = [
            "x-forwarded-for",
            "x-forwarded-proto",
            "x-request-id",
            "traceparent",
            "ratelimit-policy",
            "ratelimit",
        ];
        let wire = |h: &RequestHeader| {
            let mut buf = bytes::BytesMut::new();
            h.header_to_h1_wire(&mut buf);
            buf
        };
        let mut by_static = RequestHeader::build("GET", b"/", Some(1)).unwrap();
        let mut by_str = RequestHeader::build("GET", b"/", Some(1)).unwrap();
        for (n, s) in statics.iter().zip(spelled) {
            assert_eq!(n.name().as_str(), s);
            // insert, insert again (replaces), then append (adds)
            for (v, append) in [("v1", false), ("v2", false), ("v3", true)] {
                let v = HeaderValue::from_static(v);
                if append {
                    by_static.append_header(*n, v.clone()).unwrap();
                    by_str.append_header(s, v).unwrap();
                } else {
                    by_static.insert_header(*n, v.clone()).unwrap();
                    by_str.insert_header(s, v).unwrap();
                }
            }
        }
        assert_eq!(by_static.headers, by_str.headers);
        assert_eq!(wire(&by_static), wire(&by_str));
        assert_eq!(by_static.headers.get_all("traceparent").iter().count(), 2);
    }

    #[test]
    fn request_ids() {
        assert!(valid_request_id(b"a"));
        assert!(valid_request_id(&[b'~'; 128]));
        assert!(!valid_request_id(&[b'a'; 129]));
        assert!(!valid_request_id(b""));
        for bad in [&b"a b"[..], b"a\tb", b"caf\xc3\xa9", b"a\x7f", b"x\x01"] {
            assert!(!valid_request_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn removes_then_sets() {
        let mut h = map(&[("x-a", "1"), ("x-a", "2"), ("x-b", "keep"), ("x-c", "drop")]);
        apply(
            &mut h,
            &[HeaderName::from_static("x-c")],
            &[(
                HeaderName::from_static("x-a"),
                HeaderValue::from_static("3"),
            )],
        );
        assert_eq!(h.get_all("x-a").iter().collect::<Vec<_>>(), ["3"]);
        assert_eq!(h["x-b"], "keep");
        assert!(h.get("x-c").is_none());
    }

    #[test]
    fn a_gate_header_comes_back_with_all_its_values() {
        let key = HeaderName::from_static("x-api-key");
        let original = map(&[("x-api-key", "k1"), ("x-other", "o")]);
        let mut upstream = map(&[("x-other", "o")]);
        restore(&original, &mut upstream, &[&key]);
        assert_eq!(upstream["x-api-key"], "k1");
        // present already: untouched
        let mut again = map(&[("x-api-key", "set-by-rule")]);
        restore(&original, &mut again, &[&key]);
        assert_eq!(again.get_all("x-api-key").iter().count(), 1);
    }

    #[test]
    fn response_hop_by_hop_is_stripped() {
        let mut h = map(&[
            ("connection", "x-secret, close"),
            ("x-secret", "s"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("content-length", "3"),
            ("x-fine", "f"),
        ]);
        strip_response_hop_by_hop(&mut h);
        assert!(h.get("x-secret").is_none());
        assert!(h.get("keep-alive").is_none());
        assert!(h.get("proxy-connection").is_none());
        assert_eq!(h["content-length"], "3");
        assert_eq!(h["x-fine"], "f");

        // Without `Connection`; framing tokens in any case are never stripped.
        let mut h = map(&[("keep-alive", "timeout=5"), ("x-fine", "f")]);
        strip_response_hop_by_hop(&mut h);
        assert!(h.get("keep-alive").is_none());
        assert_eq!(h["x-fine"], "f");
        let mut h = map(&[
            ("connection", "Keep-Alive, CONTENT-LENGTH, X-Other"),
            ("content-length", "3"),
            ("x-other", "o"),
            ("proxy-connection", "close"),
        ]);
        strip_response_hop_by_hop(&mut h);
        assert_eq!(h["content-length"], "3");
        assert!(h.get("x-other").is_none());
        assert!(h.get("proxy-connection").is_none());
    }
}
