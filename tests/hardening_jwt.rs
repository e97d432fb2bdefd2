//! Forged bearer JWTs under a `jwt:CLAIM` key, end to end: a refused token is remembered
//! (refused again without a signature check) and a client address whose tokens keep
//! failing has its new tokens refused unchecked for a while, each refusal counted in
//! `portcullis_ratelimit_jwt_refusals_total{reason}`; valid tokens keep working.
//!
//! The proxy's limits: 20 tokens that fail their check per address per 10 s.

// The helpers below are test code too (clippy allows unwrap only inside #[test] functions).
#![allow(clippy::unwrap_used)]

use portcullis_test_kit as support;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};
use support::*;

/// `MAX_FAILURES_PER_ADDRESS` in src/ratelimit/jwt/.
const MAX_FAILURES: usize = 20;

fn b64(b: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(b)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn openssl(args: &[&str], input: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run openssl");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "openssl {args:?}");
    out.stdout
}

/// An ECDSA-Sig-Value (DER) as the raw r||s of JWS (RFC 7518 §3.4).
fn der_to_raw(der: &[u8]) -> Vec<u8> {
    let mut i = if der[1] & 0x80 != 0 {
        2 + usize::from(der[1] & 0x7f)
    } else {
        2
    };
    let mut out = Vec::with_capacity(64);
    for _ in 0..2 {
        let len = usize::from(der[i + 1]);
        let v = &der[i + 2..i + 2 + len];
        let v = &v[v.iter().position(|b| *b != 0).unwrap_or(v.len())..];
        out.extend(std::iter::repeat_n(0u8, 32 - v.len()));
        out.extend_from_slice(v);
        i += 2 + len;
    }
    out
}

/// An EC P-256 key made by openssl, its JWKS (kid `ec-1`) written beside it.
struct Key {
    _dir: tempfile::TempDir,
    pem: PathBuf,
    jwks: PathBuf,
}

impl Key {
    fn new() -> Key {
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join("ec.pem");
        let p = pem.to_str().unwrap();
        openssl(
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                p,
            ],
            b"",
        );
        let der = openssl(&["pkey", "-in", p, "-pubout", "-outform", "DER"], b"");
        let point = &der[der.len() - 65..];
        let jwk = json!({"kty": "EC", "kid": "ec-1", "crv": "P-256",
            "x": b64(&point[1..33]), "y": b64(&point[33..])});
        let jwks = dir.path().join("jwks.json");
        std::fs::write(&jwks, json!({ "keys": [jwk] }).to_string()).unwrap();
        Key {
            _dir: dir,
            pem,
            jwks,
        }
    }

    fn message(claims: &Value) -> String {
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": "ec-1"});
        format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        )
    }

    /// A token for `sub`, signed with this key.
    fn token(&self, sub: &str) -> String {
        let msg = Self::message(&claims(sub));
        let der = openssl(
            &["dgst", "-sha256", "-sign", self.pem.to_str().unwrap()],
            msg.as_bytes(),
        );
        format!("{msg}.{}", b64(&der_to_raw(&der)))
    }
}

fn claims(sub: &str) -> Value {
    json!({"sub": sub, "exp": now() + 3600})
}

/// A token for `sub` with a signature of the right shape that no key made: a forgery.
fn forged(sub: &str) -> String {
    format!("{}.{}", Key::message(&claims(sub)), b64(&[0x5a; 64]))
}

fn config(b: &Backend, jwks: &std::path::Path) -> String {
    format!(
        "{}[culling]\nenabled = false\n[rate_limit]\nkey = \"jwt:sub\"\nlimit = 100000\n\
         window_seconds = 3600\nmissing_key = \"reject\"\n[jwt]\njwks_file = {:?}\n",
        one_upstream(b),
        jwks.to_str().unwrap()
    )
}

fn status(c: &mut Conn, token: &str) -> u16 {
    let auth = format!("Bearer {token}");
    c.request("GET", "/x", &[("Authorization", &auth)], b"")
        .unwrap()
        .status
}

fn refusals(p: &Proxy, reason: &str) -> f64 {
    p.metric(&format!(
        "portcullis_ratelimit_jwt_refusals_total{{reason=\"{reason}\"}}"
    ))
    .unwrap_or(0.0)
}

/// One forged ES256 token sent 200 times is refused each time and counted each time, yet
/// costs its address one failed check, not 200: 19 more forgeries later, a token never seen
/// from that address is still checked and admitted. The 20th distinct forgery puts the
/// address over its limit: its next new token is refused unchecked (401, counted as
/// `address_limited`), while a token that verified before still passes and another address
/// is checked as usual. Before this, every repetition was a signature check (30 times the
/// cost of a cached valid token: one forged token cut a valid client from 23.7k to 834
/// requests a second) and nothing limited an address's forgeries: the new token after the
/// forgeries was admitted, and there was no `address_limited` refusal.
#[test]
fn forged_tokens_are_remembered_and_limited_per_address() {
    let b = Backend::start("b");
    let key = Key::new();
    let p = Proxy::start(&config(&b, &key.jwks));
    let valid = key.token("alice");
    let fresh = key.token("bob");
    let fresh2 = key.token("carol");

    let mut c = Conn::open(&p.addr()).unwrap();
    assert_eq!(status(&mut c, &valid), 200);
    let repeated = forged("mallory");
    for i in 0..200 {
        assert_eq!(status(&mut c, &repeated), 401, "repetition {i}");
    }
    // Counted before the answer is written.
    assert_eq!(refusals(&p, "signature"), 200.0);
    // The valid token still works beside it.
    assert_eq!(status(&mut c, &valid), 200);

    // One failure so far for this address: 18 more leave it under the limit.
    for i in 1..MAX_FAILURES - 1 {
        assert_eq!(status(&mut c, &forged(&format!("m{i}"))), 401);
    }
    assert_eq!(
        status(&mut c, &fresh),
        200,
        "a new valid token, under the limit"
    );
    // The 20th forgery reaches it.
    assert_eq!(status(&mut c, &forged("last")), 401);
    let r = c
        .request(
            "GET",
            "/x",
            &[("Authorization", &format!("Bearer {fresh2}"))],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 401, "a new token from an address over its limit");
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer error=\"invalid_token\"")
    );
    assert_eq!(refusals(&p, "address_limited"), 1.0);
    // Tokens that verified before are not held up; another address is checked.
    assert_eq!(status(&mut c, &valid), 200);
    assert_eq!(status(&mut c, &fresh), 200);
    let mut other = Conn::open_from(&p.addr(), "127.0.0.2").unwrap();
    assert_eq!(status(&mut other, &fresh2), 200, "from another address");
    assert_eq!(refusals(&p, "signature"), 200.0 + (MAX_FAILURES - 1) as f64);
    // Nothing refused reached the backend: 2 + 1 + 2 + 1 admitted.
    assert_eq!(b.requests(), 6);
}
