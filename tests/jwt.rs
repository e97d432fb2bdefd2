//! JWT keys end to end (CONTRACT §14, `key = "jwt:CLAIM"` with `[jwt]`): the real binary,
//! a real backend, keys made by the `openssl` CLI in each test (RSA 2048 and EC P-256), a
//! JWKS the test writes from them (n and e; x and y), and tokens signed with `openssl dgst`
//! (ES256's DER signature turned into the raw r||s a JWT carries).
//!
//! Counting tests use a one-hour window so that no window boundary changes the outcome.

// The helpers below are test code too (clippy allows unwrap only inside #[test] functions).
#![allow(clippy::unwrap_used)]

use portcullis_test_kit as support;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};
use support::*;

const ISSUER: &str = "https://idp.test";
const AUDIENCE: &str = "portcullis";
const SECRET: &str = "an-hs256-secret-of-at-least-32-bytes!";

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
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// An ECDSA-Sig-Value (DER: SEQUENCE of two INTEGERs) as the raw r||s of JWS (RFC 7518 §3.4).
fn der_to_raw(der: &[u8]) -> Vec<u8> {
    assert_eq!(der[0], 0x30, "not a DER sequence");
    let mut i = if der[1] & 0x80 != 0 {
        2 + usize::from(der[1] & 0x7f)
    } else {
        2
    };
    let mut out = Vec::with_capacity(64);
    for _ in 0..2 {
        assert_eq!(der[i], 0x02, "not a DER integer");
        let len = usize::from(der[i + 1]);
        let v = &der[i + 2..i + 2 + len];
        let v = &v[v.iter().position(|b| *b != 0).unwrap_or(v.len())..];
        assert!(v.len() <= 32);
        out.extend(std::iter::repeat_n(0u8, 32 - v.len()));
        out.extend_from_slice(v);
        i += 2 + len;
    }
    out
}

/// An RSA and an EC key pair made by openssl in `dir`, and the JWKS of their public halves.
struct Keys {
    dir: tempfile::TempDir,
    rsa: PathBuf,
    ec: PathBuf,
}

impl Keys {
    fn new() -> Keys {
        let dir = tempfile::tempdir().unwrap();
        let rsa = dir.path().join("rsa.pem");
        let ec = dir.path().join("ec.pem");
        let p = |p: &Path| p.to_str().unwrap().to_string();
        openssl(
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
                &p(&rsa),
            ],
            b"",
        );
        openssl(
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                &p(&ec),
            ],
            b"",
        );
        Keys { dir, rsa, ec }
    }

    /// The RSA key's JWK (kid `rsa-1`): n from `openssl rsa -modulus`, e = 65537.
    fn rsa_jwk(&self) -> Value {
        let out = openssl(
            &[
                "rsa",
                "-in",
                self.rsa.to_str().unwrap(),
                "-noout",
                "-modulus",
            ],
            b"",
        );
        let text = String::from_utf8(out).unwrap();
        let hex = text.trim().strip_prefix("Modulus=").unwrap();
        let n: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        json!({"kty": "RSA", "kid": "rsa-1", "use": "sig", "alg": "RS256", "n": b64(&n), "e": "AQAB"})
    }

    /// The EC key's JWK (kid `ec-1`): x and y from the DER public key's uncompressed point.
    fn ec_jwk(&self) -> Value {
        let der = openssl(
            &[
                "pkey",
                "-in",
                self.ec.to_str().unwrap(),
                "-pubout",
                "-outform",
                "DER",
            ],
            b"",
        );
        let point = &der[der.len() - 65..];
        assert_eq!(point[0], 0x04, "uncompressed point");
        json!({"kty": "EC", "kid": "ec-1", "crv": "P-256", "x": b64(&point[1..33]), "y": b64(&point[33..])})
    }

    fn write_jwks(&self, keys: &[Value]) -> PathBuf {
        let path = self.dir.path().join("jwks.json");
        let tmp = self.dir.path().join("jwks.json.tmp");
        std::fs::write(&tmp, json!({ "keys": keys }).to_string()).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    }

    fn write_secret(&self) -> PathBuf {
        let path = self.dir.path().join("hs256.secret");
        std::fs::write(&path, format!("{SECRET}\n")).unwrap();
        path
    }

    /// A token: `header` and `claims` as given, signed by the algorithm the header names
    /// (RS256 and ES256 with this pair's keys, HS256 with `SECRET`; anything else unsigned).
    fn token(&self, header: Value, claims: Value) -> String {
        let msg = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let sig = match header["alg"].as_str() {
            Some("RS256") => openssl(
                &["dgst", "-sha256", "-sign", self.rsa.to_str().unwrap()],
                msg.as_bytes(),
            ),
            Some("ES256") => der_to_raw(&openssl(
                &["dgst", "-sha256", "-sign", self.ec.to_str().unwrap()],
                msg.as_bytes(),
            )),
            Some("HS256") => openssl(
                &[
                    "dgst",
                    "-sha256",
                    "-mac",
                    "HMAC",
                    "-macopt",
                    &format!("key:{SECRET}"),
                    "-binary",
                ],
                msg.as_bytes(),
            ),
            _ => Vec::new(),
        };
        format!("{msg}.{}", b64(&sig))
    }

    fn rs256(&self, claims: Value) -> String {
        self.token(
            json!({"alg": "RS256", "typ": "JWT", "kid": "rsa-1"}),
            claims,
        )
    }

    fn es256(&self, claims: Value) -> String {
        self.token(json!({"alg": "ES256", "typ": "JWT", "kid": "ec-1"}), claims)
    }
}

/// Claims that pass every check, for `sub`.
fn good(sub: &str) -> Value {
    json!({"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": now() + 3600, "iat": now()})
}

fn config(b: &Backend, jwks: &Path, secret: Option<&Path>, rate_limit: &str) -> String {
    let secret = secret
        .map(|s| format!("hs256_secret_file = {:?}\n", s.to_str().unwrap()))
        .unwrap_or_default();
    format!(
        r#"
[[upstreams]]
name = "app"
backends = ["{}"]

[culling]
enabled = false

{rate_limit}

[jwt]
jwks_file = {:?}
{secret}issuer = "{ISSUER}"
audience = "{AUDIENCE}"
"#,
        b.addr(),
        jwks.to_str().unwrap(),
    )
}

const BY_SUB: &str =
    "[rate_limit]\nkey = \"jwt:sub\"\nlimit = 3\nwindow_seconds = 3600\nmissing_key = \"reject\"\n";

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

fn get_with(p: &Proxy, auth: &str) -> Resp {
    p.get("/x", &[("Authorization", auth)])
}

fn assert_invalid_token(r: &Resp, what: &str) {
    assert_eq!(r.status, 401, "{what}: {}", r.body_str());
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer error=\"invalid_token\""),
        "{what}"
    );
    assert!(r.body_str().contains("invalid bearer token"), "{what}");
}

#[test]
fn rs256_and_es256_tokens_are_limited_by_their_sub() {
    let b = Backend::start("b");
    let keys = Keys::new();
    let jwks = keys.write_jwks(&[keys.rsa_jwk(), keys.ec_jwk()]);
    let p = Proxy::start(&config(&b, &jwks, None, BY_SUB));

    let alice = keys.rs256(good("alice"));
    let bob = keys.es256(good("bob"));
    for i in 0..3 {
        assert_eq!(get_with(&p, &bearer(&alice)).status, 200, "alice {i}");
        assert_eq!(get_with(&p, &bearer(&bob)).status, 200, "bob {i}");
    }
    let r = get_with(&p, &bearer(&alice));
    assert_eq!(r.status, 429, "alice's fourth");
    assert!(r.retry_after().is_some());
    assert_eq!(get_with(&p, &bearer(&bob)).status, 429, "bob's fourth");
    // The key is the claim, not the token: alice with another token (ES256) shares her count.
    let alice_es = keys.es256(good("alice"));
    assert_eq!(get_with(&p, &bearer(&alice_es)).status, 429);
    // Another sub has its own count.
    let carol = keys.rs256(good("carol"));
    assert_eq!(get_with(&p, &bearer(&carol)).status, 200);
    assert_eq!(b.requests(), 7);
    // The admitted requests reached the backend with their token.
    let last = b.last_received().unwrap();
    assert_eq!(last.header("authorization"), Some(bearer(&carol).as_str()));
}

#[test]
fn invalid_tokens_are_401_and_never_forwarded() {
    let b = Backend::start("b");
    let keys = Keys::new();
    let jwks = keys.write_jwks(&[keys.rsa_jwk(), keys.ec_jwk()]);
    let p = Proxy::start(&config(&b, &jwks, None, BY_SUB));
    let valid = keys.rs256(good("alice"));
    let (msg, sig) = valid.rsplit_once('.').unwrap();
    let (head, _) = msg.split_once('.').unwrap();

    let mut expired = good("alice");
    expired["exp"] = json!(now() - 3600);
    let mut not_yet = good("alice");
    not_yet["nbf"] = json!(now() + 3600);
    let mut wrong_iss = good("alice");
    wrong_iss["iss"] = json!("https://evil.test");
    let mut no_iss = good("alice");
    no_iss.as_object_mut().unwrap().remove("iss");
    let mut wrong_aud = good("alice");
    wrong_aud["aud"] = json!("someone-else");
    let mallory = b64(good("mallory").to_string().as_bytes());
    let other_keys = Keys::new();

    let cases: Vec<(&str, String)> = vec![
        (
            "alg none",
            keys.token(json!({"alg": "none", "typ": "JWT"}), good("alice")),
        ),
        (
            "alg none with the valid signature",
            format!(
                "{}.{}.{sig}",
                b64(br#"{"alg":"none"}"#),
                b64(good("alice").to_string().as_bytes())
            ),
        ),
        (
            "payload swapped under a valid signature",
            format!("{head}.{mallory}.{sig}"),
        ),
        (
            "signature altered",
            format!(
                "{msg}.{}{}{}",
                &sig[..10],
                if &sig[10..11] == "A" { "B" } else { "A" },
                &sig[11..]
            ),
        ),
        ("signed by another RSA key", other_keys.rs256(good("alice"))),
        ("signed by another EC key", other_keys.es256(good("alice"))),
        (
            "HS256 without a secret configured",
            keys.token(json!({"alg": "HS256"}), good("alice")),
        ),
        (
            "RS384 (not accepted)",
            keys.token(json!({"alg": "RS384", "kid": "rsa-1"}), good("alice")),
        ),
        (
            "unknown kid",
            keys.token(json!({"alg": "RS256", "kid": "nope"}), good("alice")),
        ),
        ("expired", keys.rs256(expired)),
        ("not yet valid", keys.es256(not_yet)),
        ("wrong issuer", keys.rs256(wrong_iss)),
        ("no issuer", keys.rs256(no_iss)),
        ("wrong audience", keys.es256(wrong_aud)),
        ("not a JWT", "opaque-api-key".to_string()),
    ];
    let rejected_before = p
        .metric("portcullis_requests_total{outcome=\"rejected\"}")
        .unwrap_or(0.0);
    for (what, token) in &cases {
        assert_invalid_token(&get_with(&p, &bearer(token)), what);
    }
    assert_eq!(b.requests(), 0, "an invalid token was forwarded");
    // Counted once the request is logged, just after its answer: polled.
    let rejected = || {
        p.metric("portcullis_requests_total{outcome=\"rejected\"}")
            .unwrap_or(0.0)
            - rejected_before
    };
    eventually(
        DEADLINE,
        || format!("rejected {} of {}", rejected(), cases.len()),
        || rejected() == cases.len() as f64,
    );
    // By reason (the verifier counts before the answer is written).
    let reason = |r: &str| {
        p.metric(&format!(
            "portcullis_ratelimit_jwt_refusals_total{{reason=\"{r}\"}}"
        ))
        .unwrap_or(0.0)
    };
    assert_eq!(reason("expired"), 1.0);
    assert_eq!(reason("not_yet_valid"), 1.0);
    assert_eq!(reason("issuer"), 2.0);
    assert_eq!(reason("audience"), 1.0);
    assert_eq!(reason("unknown_key"), 1.0);
    assert_eq!(reason("signature"), 4.0);
    assert_eq!(reason("algorithm"), 2.0);
    assert_eq!(reason("malformed"), 3.0);
    // The valid token still passes.
    assert_eq!(get_with(&p, &bearer(&valid)).status, 200);
    assert_eq!(b.requests(), 1);
}

#[test]
fn an_hs256_token_verifies_with_the_secret_file() {
    let b = Backend::start("b");
    let keys = Keys::new();
    let jwks = keys.write_jwks(&[keys.ec_jwk()]);
    let secret = keys.write_secret();
    let p = Proxy::start(&config(&b, &jwks, Some(&secret), BY_SUB));
    let t = keys.token(json!({"alg": "HS256", "typ": "JWT"}), good("dave"));
    for _ in 0..3 {
        assert_eq!(get_with(&p, &bearer(&t)).status, 200);
    }
    assert_eq!(get_with(&p, &bearer(&t)).status, 429);
    // The same claims under another secret's MAC.
    let (msg, _) = t.rsplit_once('.').unwrap();
    let mac = openssl(
        &[
            "dgst",
            "-sha256",
            "-mac",
            "HMAC",
            "-macopt",
            "key:another-secret-of-at-least-32-bytes!!",
            "-binary",
        ],
        msg.as_bytes(),
    );
    let forged = format!("{msg}.{}", b64(&mac));
    assert_invalid_token(
        &get_with(&p, &bearer(&forged)),
        "HS256 under another secret",
    );
    assert_eq!(b.requests(), 3);
}

#[test]
fn a_request_without_a_bearer_token_is_a_missing_key() {
    let b = Backend::start("b");
    let keys = Keys::new();
    let jwks = keys.write_jwks(&[keys.rsa_jwk()]);
    let p = Proxy::start(&config(&b, &jwks, None, BY_SUB));
    for (what, headers) in [
        ("no Authorization", vec![]),
        ("Basic", vec![("Authorization", "Basic YWxpY2U6cHc=")]),
        ("Bearer without a token", vec![("Authorization", "Bearer ")]),
    ] {
        let r = p.get("/x", &headers);
        assert_eq!(r.status, 401, "{what}");
        assert_eq!(r.header("www-authenticate"), None, "{what}: a missing key");
        assert!(r.body_str().contains("API key required"), "{what}");
    }
    assert_eq!(b.requests(), 0);

    // With missing_key = "client_ip" the same requests are limited by address.
    let by_ip = BY_SUB.replace("\"reject\"", "\"client_ip\"");
    let p = Proxy::start(&config(&b, &jwks, None, &by_ip));
    let basic = [("Authorization", "Basic YWxpY2U6cHc=")];
    for _ in 0..3 {
        assert_eq!(p.get("/x", &basic).status, 200);
    }
    assert_eq!(p.get("/x", &[]).status, 429, "same address, same count");
    // A valid token has its own count.
    let t = keys.rs256(good("erin"));
    assert_eq!(get_with(&p, &bearer(&t)).status, 200);
}

#[test]
fn a_policy_keyed_by_a_claim() {
    let b = Backend::start("b");
    let keys = Keys::new();
    let jwks = keys.write_jwks(&[keys.rsa_jwk(), keys.ec_jwk()]);
    let rl = r#"[rate_limit]
key = "header:x-api-key"
missing_key = "allow"
limit = 100
window_seconds = 3600

[[rate_limit.policies]]
name = "per-org"
key = "jwt:org"
limit = 2
window_seconds = 3600
path_prefix = "/api"
"#;
    let p = Proxy::start(&config(&b, &jwks, None, rl));
    let with_org = |sub: &str, org: Value| {
        let mut c = good(sub);
        c["org"] = org;
        c
    };
    let a = keys.rs256(with_org("alice", json!("acme")));
    let b2 = keys.es256(with_org("bob", json!("acme")));
    let n = keys.rs256(with_org("nina", json!(7)));
    assert_eq!(
        p.get("/api/x", &[("Authorization", &bearer(&a))]).status,
        200
    );
    assert_eq!(
        p.get("/api/x", &[("Authorization", &bearer(&b2))]).status,
        200
    );
    let r = p.get("/api/x", &[("Authorization", &bearer(&a))]);
    assert_eq!(r.status, 429, "acme's third request");
    assert!(
        r.header("ratelimit-policy")
            .unwrap()
            .contains("\"per-org\""),
        "{:?}",
        r.header("ratelimit-policy")
    );
    // A numeric claim is a key too.
    assert_eq!(
        p.get("/api/x", &[("Authorization", &bearer(&n))]).status,
        200
    );
    // Outside the policy's path, or without a token, the policy does not apply.
    assert_eq!(
        p.get("/other", &[("Authorization", &bearer(&a))]).status,
        200
    );
    assert_eq!(p.get("/api/x", &[]).status, 200);
    // An invalid token under the policy is refused, never forwarded.
    let before = b.requests();
    let mut old = with_org("alice", json!("acme"));
    old["exp"] = json!(now() - 600);
    let r = p.get("/api/x", &[("Authorization", &bearer(&keys.rs256(old)))]);
    assert_invalid_token(&r, "expired, under the policy");
    assert_eq!(b.requests(), before);
}

#[test]
fn a_jwks_that_turns_invalid_on_reload_keeps_the_old_keys() {
    let b = Backend::start("b");
    let keys = Keys::new();
    let jwks = keys.write_jwks(&[keys.rsa_jwk()]);
    let p = Proxy::start(&config(&b, &jwks, None, BY_SUB));
    let rs = keys.rs256(good("alice"));
    let es = keys.es256(good("bob"));
    assert_eq!(get_with(&p, &bearer(&rs)).status, 200);
    assert_invalid_token(
        &get_with(&p, &bearer(&es)),
        "ES256 before its key is listed",
    );

    // The JWKS turns invalid: the reload fails, naming the file, and the old keys stay.
    std::fs::write(&jwks, "{\"keys\": [{\"kty\": \"RSA\", \"n\": \"AQAB\"").unwrap();
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_ne!(r.status, 200, "a reload with a broken JWKS must fail");
    let body = r.body_str();
    assert!(
        body.contains("jwt.jwks_file") && body.contains("jwks.json"),
        "{body}"
    );
    assert_eq!(
        get_with(&p, &bearer(&rs)).status,
        200,
        "old key after the failed reload"
    );
    let rs2 = keys.rs256(good("frank"));
    assert_eq!(
        get_with(&p, &bearer(&rs2)).status,
        200,
        "a new token, old key"
    );

    // An RSA key of 1024 bits is refused too (the file is valid JSON).
    let weak =
        keys.write_jwks(&[json!({"kty": "RSA", "kid": "w", "n": b64(&[0xc5; 128]), "e": "AQAB"})]);
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_ne!(r.status, 200);
    assert!(r.body_str().contains("1024 bits"), "{}", r.body_str());
    assert_eq!(weak, jwks);

    // A valid JWKS of the EC key only: the reload takes it.
    keys.write_jwks(&[keys.ec_jwk()]);
    let r = post(&p.admin_addr(), "/reload", &[], b"");
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(
        get_with(&p, &bearer(&es)).status,
        200,
        "ES256 after the reload"
    );
    assert_invalid_token(&get_with(&p, &bearer(&rs)), "RS256 after its key left");
}

#[test]
fn check_refuses_a_jwt_key_without_keys_and_a_bad_jwks() {
    let keys = Keys::new();
    let (code, _, err, _) = check_config(
        "[[upstreams]]\nname = \"a\"\nbackends = [\"127.0.0.1:9\"]\n[rate_limit]\nkey = \"jwt:sub\"\n",
    );
    assert_ne!(code, 0);
    assert!(
        err.contains(":5:") && err.contains("rate_limit.key") && err.contains("[jwt]"),
        "{err}"
    );
    let jwks = keys.dir.path().join("empty.json");
    std::fs::write(&jwks, "{\"keys\": []}").unwrap();
    let (code, _, err, _) = check_config(&format!(
        "[[upstreams]]\nname = \"a\"\nbackends = [\"127.0.0.1:9\"]\n[rate_limit]\nkey = \"jwt:sub\"\n[jwt]\njwks_file = {:?}\n",
        jwks.to_str().unwrap()
    ));
    assert_ne!(code, 0);
    assert!(
        err.contains("jwt.jwks_file") && err.contains("empty.json") && err.contains("no keys"),
        "{err}"
    );
}

#[test]
fn a_verified_claim_is_looked_up_among_the_tenants() {
    use sha2::{Digest, Sha256};
    let b = Backend::start("b");
    let keys = Keys::new();
    let jwks = keys.write_jwks(&[keys.rsa_jwk(), keys.ec_jwk()]);
    // The tenant's key is the claim's value (its SHA-256 in the tenants file).
    let tenants = keys.dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        format!(
            "[[tenant]]\nname = \"acme\"\ntier = \"pro\"\nkeys = [\"sha256:{}\", \"sha256:{}\"]\n",
            hex::encode(Sha256::digest(b"alice")),
            hex::encode(Sha256::digest(b"bob")),
        ),
    )
    .unwrap();
    let rl = format!(
        "{BY_SUB}\n[tenants]\nfile = {:?}\nunknown_key = \"reject\"\n\n[tiers.pro]\nlimit = 4\n",
        tenants.to_str().unwrap()
    );
    let p = Proxy::start(&config(&b, &jwks, None, &rl));
    // alice and bob are one tenant: 4 requests between them (the tier's limit, not 3 each).
    let alice = keys.rs256(good("alice"));
    let bob = keys.es256(good("bob"));
    for t in [&alice, &bob, &alice, &bob] {
        assert_eq!(get_with(&p, &bearer(t)).status, 200);
    }
    assert_eq!(get_with(&p, &bearer(&alice)).status, 429);
    assert_eq!(get_with(&p, &bearer(&bob)).status, 429);
    // A valid token of no tenant: unknown_key = "reject" (401, not invalid_token).
    let r = get_with(&p, &bearer(&keys.rs256(good("zed"))));
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), None);
    // A forged token claiming a tenant's sub is refused before any lookup, counted once.
    let forged = Keys::new().rs256(good("alice"));
    assert_invalid_token(&get_with(&p, &bearer(&forged)), "forged alice");
    assert_eq!(b.requests(), 4);
    assert_eq!(
        p.metric("portcullis_ratelimit_jwt_refusals_total{reason=\"signature\"}"),
        Some(1.0)
    );
}
