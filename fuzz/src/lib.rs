//! Fuzz harnesses of the parsers portcullis owns (README, "Fuzzing"). Each takes arbitrary
//! bytes and panics only on a defect: a panic inside the proxy's code, or a result that
//! breaks the property the harness states (a mis-parse). `src/bin/` wraps each in
//! `afl::fuzz!`; `tests/corpus.rs` replays the committed corpus (`corpus/<target>/`).

use std::borrow::Cow;
use std::cell::RefCell;
use std::net::IpAddr;

use portcullis::balance::{key::hash_bytes, HashKey};
use portcullis::edge::proxy_protocol::{self, Parsed};
use portcullis::framing;
use portcullis::ratelimit::jwt::Verifier;
use portcullis::ratelimit::{extract_key, extract_request_key, KeyOutcome, KeySource};

/// A harness: arbitrary bytes in, a panic on a defect.
pub type Harness = fn(&[u8]);

/// Every target, by the name `scripts/fuzz.sh` takes.
pub const TARGETS: &[(&str, Harness)] = &[
    ("proxy_protocol", proxy_protocol),
    ("http1", http1),
    ("key", key),
    ("config", config),
    ("admin", admin),
    ("jwt", jwt),
    ("tenants", tenants),
    ("haproxy", haproxy),
];

/// The PROXY v1/v2 header parser (`edge::proxy_protocol::parse`), as bytes arrive:
/// a header it accepts is accepted the same from exactly its own bytes and with anything
/// after it, every shorter prefix of it is `Incomplete` (never judged early), and its
/// length is within the bytes read.
pub fn proxy_protocol(data: &[u8]) {
    let parsed = proxy_protocol::parse(data);
    match parsed {
        Parsed::Done { len, .. } => {
            assert!(
                len > 0 && len <= data.len(),
                "{parsed:?} of {} bytes",
                data.len()
            );
            assert_eq!(proxy_protocol::parse(&data[..len]), parsed, "own bytes");
            let mut more = data[..len].to_vec();
            more.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
            assert_eq!(proxy_protocol::parse(&more), parsed, "with a request after");
            for i in 0..len {
                assert_eq!(
                    proxy_protocol::parse(&data[..i]),
                    Parsed::Incomplete,
                    "prefix of {i} bytes of a {len}-byte header"
                );
            }
        }
        Parsed::Incomplete => {
            assert!(
                data.len() < proxy_protocol::MAX_HEADER,
                "incomplete past the cap"
            );
            for i in 0..data.len() {
                assert_eq!(proxy_protocol::parse(&data[..i]), Parsed::Incomplete, "{i}");
            }
        }
        Parsed::Invalid => {}
    }
}

thread_local! {
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    RUNTIME.with(|rt| {
        let mut rt = rt.borrow_mut();
        let rt = rt.get_or_insert_with(|| {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap_or_else(|e| panic!("runtime: {e}"))
        });
        rt.block_on(f)
    })
}

/// A raw HTTP/1.x request read by the (vendored) Pingora session the proxy serves with,
/// then the checks `proxy::early` makes before anything goes upstream: framing
/// (`Content-Length` beside `Transfer-Encoding`, codings), the target check (a byte no
/// URI holds, or a target Pingora percent-encoded: the twelfth vendored patch), `*` off
/// `OPTIONS`, and `Content-Length` lists. A request they let through must be forwarded as
/// it came: its target is the one received, byte for byte; a `Transfer-Encoding` is one
/// field saying `chunked` and the received header block holds no `Content-Length` field;
/// a `Content-Length` is one plain number.
pub fn http1(data: &[u8]) {
    use pingora::protocols::http::v1::server::HttpSession;
    block_on(async {
        let mut s = HttpSession::new(Box::new(std::io::Cursor::new(data.to_vec())));
        if !matches!(s.read_request().await, Ok(Some(_))) {
            return;
        }
        let raw = s.get_headers_raw_bytes();
        let req = s.req_header();
        let framing_ok = framing::check(&req.headers, || Some(raw.clone())).is_ok();
        let target_ok = !framing::target_has_invalid_byte(req.raw_path())
            && !s.request_target_escaped()
            && !framing::target_has_invalid_byte(framing::raw_target(&raw));
        let asterisk_ok = !framing::asterisk_target_misused(&req.method, req.raw_path());
        let length = framing::content_length_list(&req.headers);
        if !(framing_ok && target_ok && asterisk_ok && length.is_ok()) {
            return;
        }
        // Forwarded. The target as received: the request line's second field (empty
        // lines before the request line are skipped, RFC 9112 §2.2).
        let line = data
            .split(|&b| b == b'\n')
            .find(|l| !l.is_empty() && *l != b"\r")
            .unwrap_or_default();
        let received = line.split(|&b| b == b' ').nth(1).unwrap_or_default();
        assert_eq!(
            req.raw_path(),
            received,
            "target forwarded {:?}, received {:?}",
            String::from_utf8_lossy(req.raw_path()),
            String::from_utf8_lossy(received)
        );
        let te: Vec<_> = req
            .headers
            .get_all(http::header::TRANSFER_ENCODING)
            .iter()
            .collect();
        if !te.is_empty() {
            assert!(
                te.len() == 1
                    && te[0]
                        .as_bytes()
                        .trim_ascii()
                        .eq_ignore_ascii_case(b"chunked"),
                "transfer-encoding {te:?} forwarded"
            );
            // the header block as received, by an independent parse
            let mut fields = [httparse::EMPTY_HEADER; 256];
            let mut parsed = httparse::Request::new(&mut fields);
            if let Ok(httparse::Status::Complete(_)) = parsed.parse(data) {
                assert!(
                    !parsed
                        .headers
                        .iter()
                        .any(|h| h.name.eq_ignore_ascii_case("content-length")),
                    "content-length beside transfer-encoding forwarded"
                );
            }
        }
        if let Ok(Some(one)) = length {
            assert!(!one.is_empty() && one.as_bytes().iter().all(u8::is_ascii_digit));
        }
    });
}

/// Reads the fuzz input as `[source, max, rest…]`: `rest` is lines, the first the query
/// string (after `?`), the others header values of the key header (`x-api-key`, or
/// `Authorization` for `bearer`), and for `query:` the parameter name is `key`.
/// `ratelimit::extract_key` and `balance::key::hash_bytes` must agree with a plain
/// reference reading of the same rules (`reference_key`).
pub fn key(data: &[u8]) {
    let [src, max, rest @ ..] = data else {
        return;
    };
    let max = usize::from(*max);
    let mut lines = rest.split(|&b| b == b'\n');
    let query = lines.next().unwrap_or_default();
    let Ok(query) = std::str::from_utf8(query) else {
        return;
    };
    let Ok(uri) = http::Uri::try_from(format!("/p?{query}")) else {
        return;
    };
    let (source, header) = match src % 3 {
        0 => (
            KeySource::Header(http::HeaderName::from_static("x-api-key")),
            http::HeaderName::from_static("x-api-key"),
        ),
        1 => (
            KeySource::Query("key".into()),
            http::HeaderName::from_static("x-api-key"),
        ),
        _ => (KeySource::Bearer, http::header::AUTHORIZATION),
    };
    let mut headers = http::HeaderMap::new();
    for value in lines {
        if let Ok(v) = http::HeaderValue::from_bytes(value) {
            headers.append(header.clone(), v);
        }
    }
    let got = extract_key(&source, &headers, &uri, max);
    let want = reference_key(&source, &headers, &uri, max);
    assert_eq!(
        got, want,
        "{source:?} max {max} uri {uri} headers {headers:?}"
    );
    if let KeyOutcome::Key(k) = &got {
        assert!(!k.is_empty() && k.len() <= max);
    }
    // The hash key of consistent hashing and shuffle sharding over the same request: the
    // key (up to 64 KiB) when there is one, else the client address.
    let hash = match &source {
        KeySource::Header(h) => HashKey::Header(h.clone()),
        KeySource::Query(q) => HashKey::Query(q.clone()),
        KeySource::Bearer => HashKey::Bearer,
        KeySource::Jwt(_) => return,
    };
    let ip = IpAddr::from([192, 0, 2, 1]);
    let hashed = hash_bytes(&hash, &headers, &uri, Some(ip));
    match reference_key(&source, &headers, &uri, 64 * 1024) {
        KeyOutcome::Key(k) => assert_eq!(&*hashed, &*k),
        _ => assert_eq!(&*hashed, &[192, 0, 2, 1]),
    }
}

/// The key rules read plainly (src/ratelimit/key.rs's doc): one value or `Duplicate`,
/// trimmed, `Missing` when empty, `TooLong` past `max` bytes; a query value fully
/// percent-decoded before it is measured.
fn reference_key<'a>(
    source: &KeySource,
    headers: &'a http::HeaderMap,
    uri: &'a http::Uri,
    max: usize,
) -> KeyOutcome<'a> {
    fn judge(v: &[u8], max: usize) -> KeyOutcome<'static> {
        let t = v.trim_ascii();
        if t.is_empty() {
            KeyOutcome::Missing
        } else if t.len() > max {
            KeyOutcome::TooLong
        } else {
            KeyOutcome::Key(Cow::Owned(t.to_vec()))
        }
    }
    let one = |name: &http::HeaderName| -> Result<Option<&'a [u8]>, KeyOutcome<'a>> {
        let all: Vec<_> = headers.get_all(name).iter().collect();
        match all[..] {
            [] => Ok(None),
            [v] if !v.as_bytes().contains(&b',') => Ok(Some(v.as_bytes())),
            _ => Err(KeyOutcome::Duplicate),
        }
    };
    match source {
        KeySource::Header(name) => match one(name) {
            Ok(Some(v)) => judge(v, max),
            Ok(None) => KeyOutcome::Missing,
            Err(d) => d,
        },
        KeySource::Bearer => match one(&http::header::AUTHORIZATION) {
            Ok(Some(v)) => {
                let v = v.trim_ascii();
                match v.get(..7) {
                    Some(p)
                        if p[..6].eq_ignore_ascii_case(b"bearer")
                            && matches!(p[6], b' ' | b'\t') =>
                    {
                        judge(&v[7..], max)
                    }
                    _ => KeyOutcome::Missing,
                }
            }
            Ok(None) => KeyOutcome::Missing,
            Err(d) => d,
        },
        KeySource::Jwt(_) => KeyOutcome::Invalid,
        KeySource::Query(name) => {
            let Some(q) = uri.query() else {
                return KeyOutcome::Missing;
            };
            let values: Vec<&str> = q
                .split(['&', ';'])
                .filter_map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    (reference_decode(k) == name.as_bytes()).then_some(v)
                })
                .collect();
            match values[..] {
                [] => KeyOutcome::Missing,
                [v] => judge(&reference_decode(v), max),
                _ => KeyOutcome::Duplicate,
            }
        }
    }
}

/// `%XX` to its byte; anything else, an invalid escape included, as is.
fn reference_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let hex = |c: &u8| (*c as char).to_digit(16);
        if b[i] == b'%' {
            if let (Some(h), Some(l)) = (b.get(i + 1).and_then(hex), b.get(i + 2).and_then(hex)) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// The config loader (`config::parse`, what `--check` and a reload run): never panics on
/// any text, and an error it returns formats.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = portcullis::config::parse("fuzz.toml", text) {
        let _ = e.to_string();
    }
}

/// The admin API's request parsing: `POST /backends/{upstream}/{address}/{action}`
/// (`fleet::api`: the path's segments percent-decoded, the body for the action) and a
/// `POST /claims` body (`fleet::claims_api`). The input is the path after `/backends/`, a
/// newline, and the body. Accepted requests hold what the checks promise: segments
/// decoded by the plain rule (`%` and two hex digits), a reason on one line within
/// `MAX_REASON` bytes, a lease between 1 s and 31 days, a claim between 1 s and a day.
pub fn admin(data: &[u8]) {
    use portcullis_fuzz_limits::*;
    let (path, body) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    if let Ok(path) = std::str::from_utf8(path) {
        if let Ok((up, addr, req)) = portcullis::fleet::api::fuzz_parse(path, body) {
            let segs: Vec<&str> = path.split('/').collect();
            assert_eq!(
                Some(up.as_str()),
                strict_decode(segs[0]).as_deref(),
                "{path:?}"
            );
            assert_eq!(
                Some(addr.as_str()),
                strict_decode(segs[1]).as_deref(),
                "{path:?}"
            );
            if let Some(req) = req {
                assert!(
                    req.reason.len() <= MAX_REASON,
                    "reason of {}",
                    req.reason.len()
                );
                assert!(
                    !req.reason.contains(|c: char| c.is_control()),
                    "{:?}",
                    req.reason
                );
                if let Some(ms) = req.ttl_ms {
                    assert!((1000..=MAX_LEASE_S * 1000).contains(&ms), "{ms}");
                }
            }
        }
    }
    if let Ok((seconds, reason)) = portcullis::fleet::claims_api::fuzz_parse(body) {
        assert!((1..=MAX_CLAIM_S).contains(&seconds), "{seconds}");
        assert!(!reason.trim().is_empty() && reason.len() <= MAX_REASON);
    }
}

mod portcullis_fuzz_limits {
    pub const MAX_REASON: usize = 512;
    pub const MAX_LEASE_S: u64 = 31 * 24 * 3600;
    pub const MAX_CLAIM_S: u64 = 24 * 3600;
}

/// `%` and two hex digits to a byte, then UTF-8; `None` otherwise.
fn strict_decode(seg: &str) -> Option<String> {
    let b = seg.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = (*b.get(i + 1)? as char).to_digit(16)?;
            let l = (*b.get(i + 2)? as char).to_digit(16)?;
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The public halves of src/ratelimit/testdata/ (kids `r1`, RS256, and `e1`, ES256).
const JWT_JWKS: &str = include_str!("jwt.jwks");
/// The HS256 secret of src/ratelimit/jwt/'s tests.
const JWT_SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

/// JWT verification (`ratelimit::jwt::Verifier`, the `jwt:CLAIM` key) on arbitrary bytes as a
/// token, against a JWKS of an RSA and an EC key and an HS256 secret: never a panic; the
/// cached verdict is the uncached one (a token that fails is never admitted from the cache);
/// and through the request path (`Authorization: Bearer <bytes>`), a key comes only from a
/// token that verifies, within `max_key_bytes`.
pub fn jwt(data: &[u8]) {
    static VERIFIER: std::sync::OnceLock<Option<Verifier>> = std::sync::OnceLock::new();
    let Some(v) = VERIFIER.get_or_init(|| {
        Verifier::new(Some(JWT_JWKS.as_bytes()), Some(JWT_SECRET), None, None).ok()
    }) else {
        panic!("the fuzz JWKS does not load");
    };
    // 2027-01-15: the seeds' tokens expire in 2100.
    let now = 1_800_000_000;
    let plain = v.verify_uncached(data, now).map(|(claims, _)| claims);
    let cached = v.verify(data, now);
    match (&plain, &cached) {
        (Ok(a), Ok(b)) => assert_eq!(a, &**b),
        (Err(a), Err(b)) => assert_eq!(a, b),
        _ => panic!("uncached {plain:?}, cached {cached:?}"),
    }
    let Ok(value) = http::HeaderValue::from_bytes(&[b"Bearer ", data].concat()) else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::AUTHORIZATION, value);
    let uri = http::Uri::from_static("/p");
    let src = KeySource::Jwt("sub".into());
    match extract_request_key(&src, Some(v), &headers, &uri, 64, now, None) {
        KeyOutcome::Key(k) => {
            assert!(!k.is_empty() && k.len() <= 64);
            assert!(v.verify(data.trim_ascii(), now).is_ok());
        }
        KeyOutcome::Invalid => assert!(v.verify(data.trim_ascii(), now).is_err()),
        KeyOutcome::Missing | KeyOutcome::TooLong | KeyOutcome::Duplicate => {}
    }
}

/// The tenants file (`config::tenants::parse_tenants`, what `--check` and a reload read)
/// and the tenants kept in the store (`store_tenants`, the `redis_sync` hash: each input
/// line after a line `--store` is `NAME<TAB>JSON`): never a panic; what is accepted holds
/// the rules (names valid and unique, each key a hash owned by one tenant, a known tier);
/// and no message about a key shows it: a string literal that holds `SECRET` (the seeds
/// write it only in key positions) never appears in an error about `keys` or in a store
/// entry's reason (quoted values shown as `"…"`; backquoted field names are the
/// parser's own words and are left out of the check).
pub fn tenants(data: &[u8]) {
    use portcullis::config::tenants::{parse_tenants, store_tenants, valid_name};
    use portcullis::config::{TenantSettings, Tier, UnknownKey};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let tier = |name: &str| Tier {
        name: name.into(),
        limit: 10,
        concurrency: 0,
        priority: None,
        quota: 0,
        period: portcullis_policy::tenant::Period::Day,
    };
    let tiers = vec![tier("gold"), tier("pro")];
    // Backquoted text is the parser's naming of fields, not a value.
    let shown = |msg: &str| -> bool {
        let mut outside = String::new();
        for (i, part) in msg.split('`').enumerate() {
            if i % 2 == 0 {
                outside.push_str(part);
            }
        }
        outside.contains("SECRET")
    };
    let (file, store) = match text.split_once("\n--store\n") {
        Some((f, s)) => (f, Some(s)),
        None => (text, None),
    };
    let tenants = match parse_tenants(file, &tiers) {
        Ok(t) => t,
        Err((path, why)) => {
            // The key path is shown anyway: a field name in it is not news in the message.
            let field = path.rsplit('.').next().unwrap_or_default();
            let why_rest = if field.is_empty() {
                why.clone()
            } else {
                why.replace(field, "")
            };
            assert!(
                !(path.contains("keys") && shown(&why_rest)),
                "{path}: {why} shows a key"
            );
            Vec::new()
        }
    };
    let check = |all: &[portcullis::config::Tenant]| {
        let mut names = std::collections::HashSet::new();
        let mut keys = std::collections::HashSet::new();
        for t in all {
            assert!(valid_name(&t.name), "{:?}", t.name);
            assert!(names.insert(t.name.clone()), "{:?} twice", t.name);
            assert!(t.tier < tiers.len());
            for k in &t.keys {
                assert!(keys.insert(*k), "a key of two tenants");
            }
        }
    };
    check(&tenants);
    let Some(store) = store else {
        return;
    };
    let entries: Vec<(String, String)> = store
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    let settings = TenantSettings {
        file: None,
        redis_sync: true,
        unknown_key: UnknownKey::Allow,
        tiers: tiers.clone(),
        tenants,
        ..TenantSettings::default()
    };
    let (joined, skipped) = store_tenants(&settings, &entries);
    for why in &skipped {
        // "tenant NAME in the store: REASON": the name is shown, the reason never shows a key.
        let reason = why
            .split_once(" in the store: ")
            .map_or(why.as_str(), |(_, r)| r);
        assert!(!reason.contains("SECRET"), "{why} shows a key");
    }
    let mut all = settings.tenants.clone();
    all.extend(joined);
    check(&all);
}

/// The HAProxy importer (`portcullis import-haproxy`: lexer, sections, conditions, route
/// compilation, TOML output) on any text: no panic, the work bounded (the route table
/// and condition expansion are capped), and what it writes is TOML that parses.
pub fn haproxy(data: &[u8]) {
    use portcullis::import::haproxy as hx;
    let text = String::from_utf8_lossy(data);
    let env = |n: &str| (n == "FUZZ").then(|| "127.0.0.1:1".to_string());
    let read = |_: &str| Some(b"HTTP/1.0 503 x\r\n\r\nbody".to_vec());
    let opts = hx::Options {
        read_file: &read,
        pages_dir: Some("/nonexistent".into()),
    };
    if let hx::Outcome::Done(t) = hx::import(&text, &env, &opts) {
        if let Err(e) = t.toml.parse::<toml::Table>() {
            panic!("the output is not TOML: {e}\n{}", t.toml);
        }
        assert!(
            t.report.windows(2).all(|w| w[0].line < w[1].line),
            "one line each, in order"
        );
    }
}
