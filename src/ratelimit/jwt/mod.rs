//! JWT keys (`key = "jwt:CLAIM"` with `[jwt]`, CONTRACT §14): a bearer token is verified
//! before one of its claims becomes the request's rate-limit key.
//!
//! * Keys: the public keys of a JWKS (RSA for RS256, EC P-256 for ES256) and an HS256
//!   secret; both read by the config's validation ([`Verifier::new`] takes their bytes), so
//!   the request path never reads a file and a reload that finds a bad file keeps the old
//!   verifier.
//! * Algorithms: RS256, ES256 and HS256 only, each with its own kind of key. `alg: none` and
//!   every other algorithm is refused (`none` is no algorithm the crate parses). An RS256 or
//!   ES256 token's `kid` names its JWKS key; without one it takes the only JWKS key of its
//!   algorithm. An HS256 token takes the secret.
//! * Claims: `exp` is required, `nbf` checked when present, both with [`LEEWAY_SECS`];
//!   `iss` and `aud` must be present and match when `[jwt]` sets them.
//! * Cost: a signature check is an RSA or ECDSA verification, done by OpenSSL (already
//!   linked for Pingora) through the crate's `CryptoProvider` hook ([`install_provider`]):
//!   RustCrypto's pure-Rust RSA and P-256 measured several times slower here. Tokens that
//!   verified are kept (whole, so a hit is the same token byte for byte) with their claims
//!   until they expire, in a bounded cache ([`CACHE_ENTRIES`]); a refused token is never
//!   kept there.
//! * Refusals: a forged token costs a signature check, about 30 times the cached check of
//!   a valid one, so a client repeating one could starve the others. A refused token's
//!   keyed 64-bit hash (never the token) is kept with its reason for [`REFUSED_TTL_SECS`]
//!   in a bounded cache ([`REFUSED_ENTRIES`]) and refused from there at the cost of that
//!   hash; a hit only ever refuses (a token that verified is looked up first, among the
//!   verified ones, by its whole bytes). Tokens that fail their check are counted per client
//!   address ([`MAX_FAILURES_PER_ADDRESS`] per [`FAILURE_WINDOW_SECS`], an IPv6 address by
//!   its /64, at most [`ADDRESSES`] addresses tracked): past that, the address's tokens
//!   that are in neither cache are refused unchecked (`address_limited`) until the window
//!   ends, so changing the token each time buys no signature checks either.
//!
//! Time comes in as `now_secs` (Unix seconds): the checks are plain functions of it.

use std::collections::HashSet;
use std::fmt;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Arc;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

mod keys;
mod memo;
mod ossl;

use keys::parse_jwks;
use memo::{Cache, Failures, Refused};

/// Clock skew allowed on `exp` and `nbf`, in seconds.
pub const LEEWAY_SECS: u64 = 30;
/// Longest token verified; a longer one is refused unread.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// Shortest HS256 secret (RFC 7518 §3.2: at least the hash's 256 bits).
pub const MIN_SECRET_BYTES: usize = 32;
/// Verified tokens kept at most (over all shards).
pub const CACHE_ENTRIES: usize = CACHE_SHARDS * CACHE_PER_SHARD;
const CACHE_SHARDS: usize = 8;
const CACHE_PER_SHARD: usize = 512;
/// Refused tokens remembered at most (over all shards), each for [`REFUSED_TTL_SECS`].
pub const REFUSED_ENTRIES: usize = CACHE_SHARDS * REFUSED_PER_SHARD;
const REFUSED_PER_SHARD: usize = 512;
pub const REFUSED_TTL_SECS: u64 = 60;
/// Tokens that failed their check, per client address and window, before the address's
/// further unknown tokens are refused unchecked.
pub const MAX_FAILURES_PER_ADDRESS: u32 = 20;
pub const FAILURE_WINDOW_SECS: u64 = 10;
/// Client addresses whose failures are counted at most (over all shards).
pub const ADDRESSES: usize = CACHE_SHARDS * ADDRESSES_PER_SHARD;
const ADDRESSES_PER_SHARD: usize = 512;

/// A token's claims.
pub type Claims = Map<String, Value>;

/// Why a token is refused (all answered 401 `invalid_token`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    /// Not three base64url parts of JSON, too long, or without a numeric `exp`.
    Malformed,
    /// An algorithm other than RS256, ES256 or HS256, or not the one of its key.
    Algorithm,
    /// No key for its `kid`, or no single key for its algorithm.
    UnknownKey,
    Signature,
    Expired,
    NotYetValid,
    Issuer,
    Audience,
    /// Not checked: its client address sent too many tokens that failed lately.
    AddressLimited,
}

impl Invalid {
    pub const ALL: [Invalid; 9] = [
        Invalid::Malformed,
        Invalid::Algorithm,
        Invalid::UnknownKey,
        Invalid::Signature,
        Invalid::Expired,
        Invalid::NotYetValid,
        Invalid::Issuer,
        Invalid::Audience,
        Invalid::AddressLimited,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Invalid::Malformed => "malformed",
            Invalid::Algorithm => "algorithm",
            Invalid::UnknownKey => "unknown_key",
            Invalid::Signature => "signature",
            Invalid::Expired => "expired",
            Invalid::NotYetValid => "not_yet_valid",
            Invalid::Issuer => "issuer",
            Invalid::Audience => "audience",
            Invalid::AddressLimited => "address_limited",
        }
    }
}

/// Which input of [`Verifier::new`] an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Jwks,
    Secret,
}

/// One verification key.
struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
    /// The crate's checks for this key: its algorithm, `iss` and `aud`; the times are ours.
    validation: Validation,
}

/// What the verifier was built from: two verifiers are equal when these are (the reload
/// diff of the settings).
#[derive(Clone, PartialEq, Eq)]
struct Source {
    jwks: Option<Vec<u8>>,
    secret: Option<Vec<u8>>,
    issuer: Option<String>,
    audience: Option<String>,
}

/// The keys and rules of `[jwt]`, and the cache of tokens that verified.
pub struct Verifier {
    keys: Vec<Key>,
    source: Source,
    cache: Cache,
    refused: Refused,
    failures: Failures,
    /// `portcullis_ratelimit_jwt_refusals_total{reason}`, one handle per [`Invalid`] (in
    /// `Invalid::ALL` order), set when the runtime is built ([`Verifier::count_refusals`]).
    refusals: std::sync::OnceLock<Vec<prometheus::IntCounter>>,
}

impl PartialEq for Verifier {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        let keys: Vec<String> = self
            .keys
            .iter()
            .map(|k| format!("{:?} kid={:?}", k.alg, k.kid))
            .collect();
        f.debug_struct("Verifier")
            .field("keys", &keys)
            .field("issuer", &self.source.issuer)
            .field("audience", &self.source.audience)
            .finish()
    }
}

impl Verifier {
    /// A verifier of the keys of `jwks` (a JWKS document) and of the HS256 `secret` (its
    /// bytes as read; trailing `\n`/`\r` removed), with `issuer` and `audience` required
    /// when given. At least one of `jwks` and `secret`. The error names the part and says
    /// what is wrong (never the secret's content).
    pub fn new(
        jwks: Option<&[u8]>,
        secret: Option<&[u8]>,
        issuer: Option<&str>,
        audience: Option<&str>,
    ) -> Result<Self, (Part, String)> {
        install_provider();
        let validation = |alg| rules(alg, issuer, audience);
        let mut keys = match jwks {
            Some(text) => parse_jwks(text, &validation).map_err(|e| (Part::Jwks, e))?,
            None => Vec::new(),
        };
        let secret = secret.map(|s| {
            let end = s
                .iter()
                .rposition(|b| *b != b'\n' && *b != b'\r')
                .map_or(0, |i| i + 1);
            s[..end].to_vec()
        });
        if let Some(s) = &secret {
            if s.len() < MIN_SECRET_BYTES {
                return Err((
                    Part::Secret,
                    format!(
                        "the HS256 secret is {} bytes: at least {MIN_SECRET_BYTES} are required",
                        s.len()
                    ),
                ));
            }
            keys.push(Key {
                kid: None,
                alg: Algorithm::HS256,
                key: DecodingKey::from_secret(s),
                validation: validation(Algorithm::HS256),
            });
        }
        if keys.is_empty() {
            return Err((
                Part::Jwks,
                "no key: a JWKS file or an HS256 secret is required".into(),
            ));
        }
        Ok(Self {
            keys,
            source: Source {
                jwks: jwks.map(<[u8]>::to_vec),
                secret,
                issuer: issuer.map(str::to_string),
                audience: audience.map(str::to_string),
            },
            cache: Cache::new(),
            refused: Refused::new(),
            failures: Failures::new(),
            refusals: std::sync::OnceLock::new(),
        })
    }

    /// Count refused tokens by reason in `vec` (label `reason`, [`Invalid::as_str`]).
    /// Set once; a later call is ignored (the handles outlive reloads: the series do).
    pub fn count_refusals(&self, vec: &prometheus::IntCounterVec) {
        let _ = self.refusals.set(
            Invalid::ALL
                .iter()
                .map(|r| vec.with_label_values(&[r.as_str()]))
                .collect(),
        );
    }

    /// The value of `claim` in `token` once the token is verified: `Ok(None)` when the
    /// valid token has no such claim, or one that is neither a string nor a number (a
    /// number is its JSON text).
    /// `client` is the request's address (its failures are counted, [`Verifier::verify_from`]).
    pub fn claim_key(
        &self,
        token: &[u8],
        claim: &str,
        now_secs: u64,
        client: Option<IpAddr>,
    ) -> Result<Option<Vec<u8>>, Invalid> {
        let claims = self.verify_from(token, now_secs, client)?;
        Ok(match claims.get(claim) {
            Some(Value::String(s)) => Some(s.as_bytes().to_vec()),
            Some(Value::Number(n)) => Some(n.to_string().into_bytes()),
            _ => None,
        })
    }

    /// The claims of `token` if it verifies at `now_secs` (no client address: its failures
    /// are not counted).
    pub fn verify(&self, token: &[u8], now_secs: u64) -> Result<Arc<Claims>, Invalid> {
        self.verify_from(token, now_secs, None)
    }

    /// The claims of `token`, sent from `client`, if it verifies at `now_secs`. In order: a
    /// token that verified before (its claims); one refused lately (its reason, from its
    /// hash); from an address past [`MAX_FAILURES_PER_ADDRESS`], refused unchecked; else
    /// every check, a failure remembered and counted against the address.
    pub fn verify_from(
        &self,
        token: &[u8],
        now_secs: u64,
        client: Option<IpAddr>,
    ) -> Result<Arc<Claims>, Invalid> {
        if let Some(claims) = self.cache.get(token, now_secs) {
            return Ok(claims);
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(self.count(Invalid::Malformed));
        }
        let hash = self.cache.hasher.hash_one(token);
        if let Some(reason) = self.refused.get(hash, now_secs) {
            return Err(self.count(reason));
        }
        if let Some(ip) = client {
            if self.failures.over(ip, now_secs) {
                return Err(self.count(Invalid::AddressLimited));
            }
        }
        let (claims, exp) = self.verify_uncached(token, now_secs).map_err(|r| {
            // A token not yet valid may be valid in a moment: checked again then.
            if r != Invalid::NotYetValid {
                self.refused.put(hash, r, now_secs);
            }
            if let Some(ip) = client {
                self.failures.add(ip, now_secs);
            }
            self.count(r)
        })?;
        let claims = Arc::new(claims);
        self.cache.put(
            token,
            exp.saturating_add(LEEWAY_SECS),
            Arc::clone(&claims),
            now_secs,
        );
        Ok(claims)
    }

    /// Counts a refusal by its reason; the reason.
    fn count(&self, reason: Invalid) -> Invalid {
        if let Some(c) = self.refusals.get() {
            if let Some(i) = Invalid::ALL.iter().position(|x| *x == reason) {
                c[i].inc();
            }
        }
        reason
    }

    /// Every check, no cache: the claims and `exp`.
    pub fn verify_uncached(&self, token: &[u8], now_secs: u64) -> Result<(Claims, u64), Invalid> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Invalid::Malformed);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| Invalid::Malformed)?;
        let key = self.key_for(header.kid.as_deref(), header.alg)?;
        let data = jsonwebtoken::decode::<Claims>(token, &key.key, &key.validation)
            .map_err(|e| refused(e.kind()))?;
        let claims = data.claims;
        let exp = claims
            .get("exp")
            .and_then(numeric_date)
            .ok_or(Invalid::Malformed)?;
        if now_secs >= exp.saturating_add(LEEWAY_SECS) {
            return Err(Invalid::Expired);
        }
        if let Some(nbf) = claims.get("nbf") {
            let nbf = numeric_date(nbf).ok_or(Invalid::Malformed)?;
            if nbf > now_secs.saturating_add(LEEWAY_SECS) {
                return Err(Invalid::NotYetValid);
            }
        }
        Ok((claims, exp))
    }

    /// The key a token with this `kid` and `alg` must be signed with.
    fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Result<&Key, Invalid> {
        if !matches!(alg, Algorithm::RS256 | Algorithm::ES256 | Algorithm::HS256) {
            return Err(Invalid::Algorithm);
        }
        if alg == Algorithm::HS256 {
            // The secret has no `kid`: an HS256 token is checked against it, whatever it names.
            return self
                .keys
                .iter()
                .find(|k| k.alg == Algorithm::HS256)
                .ok_or(Invalid::Algorithm);
        }
        let key = match kid {
            Some(kid) => self
                .keys
                .iter()
                .find(|k| k.kid.as_deref() == Some(kid))
                .ok_or(Invalid::UnknownKey)?,
            None => {
                let mut of_alg = self.keys.iter().filter(|k| k.alg == alg);
                match (of_alg.next(), of_alg.next()) {
                    (Some(k), None) => k,
                    (None, _) => return Err(Invalid::Algorithm),
                    (Some(_), Some(_)) => return Err(Invalid::UnknownKey),
                }
            }
        };
        if key.alg != alg {
            return Err(Invalid::Algorithm);
        }
        Ok(key)
    }

    /// Tokens in the cache (for tests and the bench).
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// Refused tokens remembered (for tests and the bench).
    pub fn refused_cached(&self) -> usize {
        self.refused.len()
    }
}

/// The crate's checks of a token for a key of `alg`: the algorithm, and `iss`/`aud`
/// present and equal when set. `exp` and `nbf` are checked against the caller's `now`.
fn rules(alg: Algorithm, issuer: Option<&str>, audience: Option<&str>) -> Validation {
    let mut v = Validation::new(alg);
    v.validate_exp = false;
    v.validate_nbf = false;
    v.leeway = 0;
    v.required_spec_claims = HashSet::new();
    if let Some(iss) = issuer {
        v.set_issuer(&[iss]);
        v.required_spec_claims.insert("iss".into());
    }
    match audience {
        Some(aud) => {
            v.set_audience(&[aud]);
            v.required_spec_claims.insert("aud".into());
        }
        // Unset: any `aud` (the crate would refuse every token that has one).
        None => v.validate_aud = false,
    }
    v
}

fn refused(kind: &ErrorKind) -> Invalid {
    match kind {
        ErrorKind::InvalidSignature => Invalid::Signature,
        ErrorKind::InvalidAlgorithm => Invalid::Algorithm,
        ErrorKind::InvalidIssuer => Invalid::Issuer,
        ErrorKind::InvalidAudience => Invalid::Audience,
        ErrorKind::MissingRequiredClaim(c) if c == "iss" => Invalid::Issuer,
        ErrorKind::MissingRequiredClaim(c) if c == "aud" => Invalid::Audience,
        ErrorKind::ExpiredSignature => Invalid::Expired,
        ErrorKind::ImmatureSignature => Invalid::NotYetValid,
        _ => Invalid::Malformed,
    }
}

/// A NumericDate (RFC 7519 §2): seconds, possibly fractional; negative is 0.
fn numeric_date(v: &Value) -> Option<u64> {
    let n = v.as_number()?;
    n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| f.is_finite())
            .map(|f| f.max(0.0) as u64)
    })
}

/// Makes OpenSSL verify RS256 and ES256 signatures for the crate (its `CryptoProvider`:
/// RustCrypto's, with those verifiers replaced). Once per process, before
/// the first verification; if another provider was set first, that one stays (it verifies
/// as correctly, more slowly).
pub fn install_provider() {
    static PROVIDER: std::sync::OnceLock<jsonwebtoken::crypto::CryptoProvider> =
        std::sync::OnceLock::new();
    let p = PROVIDER.get_or_init(|| {
        let mut p = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.clone();
        p.verifier_factory = ossl::verifier;
        p
    });
    let _ = p.install_default();
}

/// Test keys and token signing, for this module's tests, the config's and the bench.
#[cfg(test)]
pub(crate) mod testkeys {
    use jsonwebtoken::jwk::{Jwk, JwkSet};
    use jsonwebtoken::{Algorithm, EncodingKey, Header};

    /// Throwaway keys made with `openssl genpkey` for these tests only.
    pub const RSA_PEM: &str = include_str!("../testdata/rsa.pem");
    pub const EC_PEM: &str = include_str!("../testdata/ec.pem");
    pub const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    pub fn rsa() -> EncodingKey {
        EncodingKey::from_rsa_pem(RSA_PEM.as_bytes()).unwrap()
    }

    pub fn ec() -> EncodingKey {
        EncodingKey::from_ec_pem(EC_PEM.as_bytes()).unwrap()
    }

    /// A JWKS of the RSA key (kid `r1`) and the EC key (kid `e1`).
    pub fn jwks() -> String {
        let mut r = Jwk::from_encoding_key(&rsa(), Algorithm::RS256).unwrap();
        r.common.key_id = Some("r1".into());
        let mut e = Jwk::from_encoding_key(&ec(), Algorithm::ES256).unwrap();
        e.common.key_id = Some("e1".into());
        serde_json::to_string(&JwkSet { keys: vec![r, e] }).unwrap()
    }

    pub fn sign(alg: Algorithm, kid: Option<&str>, claims: &serde_json::Value) -> String {
        let mut h = Header::new(alg);
        h.kid = kid.map(str::to_string);
        let key = match alg {
            Algorithm::RS256 => rsa(),
            Algorithm::ES256 => ec(),
            _ => EncodingKey::from_secret(SECRET),
        };
        jsonwebtoken::encode(&h, claims, &key).unwrap()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::testkeys::*;
    use super::*;
    use serde_json::json;

    const NOW: u64 = 1_800_000_000;

    fn verifier(iss: Option<&str>, aud: Option<&str>) -> Verifier {
        let jwks = jwks();
        Verifier::new(Some(jwks.as_bytes()), Some(SECRET), iss, aud).unwrap()
    }

    fn b64(b: &[u8]) -> String {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    }

    #[test]
    fn rs256_es256_hs256_tokens_give_their_claim() {
        let v = verifier(None, None);
        let claims = json!({"sub": "alice", "org": 42, "exp": NOW + 60});
        for (alg, kid) in [
            (Algorithm::RS256, Some("r1")),
            (Algorithm::ES256, Some("e1")),
            (Algorithm::HS256, None),
            // without a kid: the only key of the algorithm
            (Algorithm::RS256, None),
            (Algorithm::ES256, None),
        ] {
            let t = sign(alg, kid, &claims);
            assert_eq!(
                v.claim_key(t.as_bytes(), "sub", NOW, None)
                    .unwrap()
                    .as_deref(),
                Some(&b"alice"[..]),
                "{alg:?} {kid:?}"
            );
            assert_eq!(
                v.claim_key(t.as_bytes(), "org", NOW, None)
                    .unwrap()
                    .as_deref(),
                Some(&b"42"[..])
            );
            assert_eq!(v.claim_key(t.as_bytes(), "nope", NOW, None).unwrap(), None);
        }
    }

    #[test]
    fn alg_none_and_other_algorithms_are_refused() {
        let v = verifier(None, None);
        let payload = b64(br#"{"sub":"alice","exp":1900000000}"#);
        for header in [
            r#"{"alg":"none","typ":"JWT"}"#,
            r#"{"alg":"None"}"#,
            r#"{"alg":"RS384","kid":"r1"}"#,
            r#"{"alg":"HS512"}"#,
            r#"{"alg":"PS256","kid":"r1"}"#,
            r#"{"alg":"EdDSA"}"#,
        ] {
            for sig in ["", "AAAA"] {
                let t = format!("{}.{payload}.{sig}", b64(header.as_bytes()));
                assert!(v.verify(t.as_bytes(), NOW).is_err(), "{header} {sig:?}");
            }
        }
        // An RS256 token presented as ES256 with the RSA key's kid: the key decides.
        let t = sign(Algorithm::RS256, Some("r1"), &json!({"exp": NOW + 60}));
        let (_, rest) = t.split_once('.').unwrap();
        let t2 = format!("{}.{rest}", b64(br#"{"alg":"ES256","kid":"r1"}"#));
        assert_eq!(
            v.verify(t2.as_bytes(), NOW).unwrap_err(),
            Invalid::Algorithm
        );
        // HS256 signed with the RSA public key's bytes (the classic confusion): the secret
        // checks it, so it fails.
        let hs = sign(Algorithm::HS256, Some("r1"), &json!({"exp": NOW + 60}));
        let forged = format!("{}.{}", &hs[..hs.rfind('.').unwrap()], b64(&[0u8; 32]));
        assert_eq!(
            v.verify(forged.as_bytes(), NOW).unwrap_err(),
            Invalid::Signature
        );
    }

    #[test]
    fn forged_signatures_and_payloads_are_refused() {
        let v = verifier(None, None);
        let claims = json!({"sub": "alice", "exp": NOW + 60});
        for (alg, kid) in [
            (Algorithm::RS256, Some("r1")),
            (Algorithm::ES256, Some("e1")),
            (Algorithm::HS256, None),
        ] {
            let t = sign(alg, kid, &claims);
            let (msg, sig) = t.rsplit_once('.').unwrap();
            // another payload under the same signature
            let (h, _) = msg.split_once('.').unwrap();
            let other = format!(
                "{h}.{}.{sig}",
                b64(format!(r#"{{"sub":"mallory","exp":{}}}"#, NOW + 60).as_bytes())
            );
            assert_eq!(
                v.verify(other.as_bytes(), NOW).unwrap_err(),
                Invalid::Signature,
                "{alg:?}"
            );
            // a signature flipped in one bit
            let mut raw =
                base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, sig)
                    .unwrap();
            raw[3] ^= 1;
            let flipped = format!("{msg}.{}", b64(&raw));
            assert_eq!(
                v.verify(flipped.as_bytes(), NOW).unwrap_err(),
                Invalid::Signature
            );
            // none of them entered the cache; the real one does
            assert_eq!(v.cached(), 0);
            assert!(v.verify(t.as_bytes(), NOW).is_ok());
            assert_eq!(v.cached(), 1);
            v.cache
                .shards
                .iter()
                .for_each(|s| s.lock().unwrap().clear());
        }
        // a kid the JWKS does not hold
        let t = sign(Algorithm::RS256, Some("zz"), &claims);
        assert_eq!(
            v.verify(t.as_bytes(), NOW).unwrap_err(),
            Invalid::UnknownKey
        );
    }

    #[test]
    fn exp_and_nbf_with_leeway() {
        let v = verifier(None, None);
        let at = |c: serde_json::Value, now| {
            let t = sign(Algorithm::ES256, Some("e1"), &c);
            v.verify_uncached(t.as_bytes(), now).map(|_| ())
        };
        assert_eq!(at(json!({"exp": NOW}), NOW), Ok(()));
        assert_eq!(at(json!({"exp": NOW}), NOW + LEEWAY_SECS - 1), Ok(()));
        assert_eq!(
            at(json!({"exp": NOW}), NOW + LEEWAY_SECS),
            Err(Invalid::Expired)
        );
        assert_eq!(at(json!({"exp": NOW - 3600}), NOW), Err(Invalid::Expired));
        assert_eq!(at(json!({"exp": 1.5e9}), NOW), Err(Invalid::Expired));
        assert_eq!(at(json!({"exp": -5}), NOW), Err(Invalid::Expired));
        // exp is required and numeric
        assert_eq!(at(json!({"sub": "a"}), NOW), Err(Invalid::Malformed));
        assert_eq!(at(json!({"exp": "soon"}), NOW), Err(Invalid::Malformed));
        // nbf
        let c = |nbf| json!({"exp": NOW + 3600, "nbf": nbf});
        assert_eq!(at(c(NOW + LEEWAY_SECS), NOW), Ok(()));
        assert_eq!(at(c(NOW + LEEWAY_SECS + 1), NOW), Err(Invalid::NotYetValid));
        assert_eq!(
            at(json!({"exp": NOW + 60, "nbf": "x"}), NOW),
            Err(Invalid::Malformed)
        );
    }

    #[test]
    fn a_cached_token_still_expires() {
        let v = verifier(None, None);
        let t = sign(
            Algorithm::RS256,
            Some("r1"),
            &json!({"sub": "a", "exp": NOW + 10}),
        );
        assert!(v.verify(t.as_bytes(), NOW).is_ok());
        assert!(v.verify(t.as_bytes(), NOW + 10 + LEEWAY_SECS - 1).is_ok());
        assert_eq!(
            v.verify(t.as_bytes(), NOW + 10 + LEEWAY_SECS).unwrap_err(),
            Invalid::Expired
        );
        assert_eq!(v.cached(), 0);
    }

    /// The verifiers themselves (whichever provider the process installed first): OpenSSL's
    /// for RS256 and ES256, RustCrypto's HMAC for HS256.
    #[test]
    fn the_openssl_verifiers_take_good_signatures_only() {
        let set: jsonwebtoken::jwk::JwkSet = serde_json::from_str(&jwks()).unwrap();
        let rsa = DecodingKey::from_jwk(&set.keys[0]).unwrap();
        let ec = DecodingKey::from_jwk(&set.keys[1]).unwrap();
        let hs = DecodingKey::from_secret(SECRET);
        let claims = json!({"sub": "a", "exp": NOW});
        for (alg, key, kid) in [
            (Algorithm::RS256, &rsa, Some("r1")),
            (Algorithm::ES256, &ec, Some("e1")),
            (Algorithm::HS256, &hs, None),
        ] {
            let t = sign(alg, kid, &claims);
            let (msg, sig) = t.rsplit_once('.').unwrap();
            let mut sig =
                base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, sig)
                    .unwrap();
            let v = ossl::verifier(&alg, key).unwrap();
            assert!(v.verify(msg.as_bytes(), &sig).is_ok(), "{alg:?}");
            assert!(v.verify(b"other message", &sig).is_err(), "{alg:?}");
            sig[5] ^= 0x10;
            assert!(v.verify(msg.as_bytes(), &sig).is_err(), "{alg:?}");
            assert!(
                v.verify(msg.as_bytes(), &sig[..10].to_vec()).is_err(),
                "{alg:?}"
            );
            assert!(v.verify(msg.as_bytes(), &Vec::new()).is_err(), "{alg:?}");
        }
        // A key of the wrong kind, or off the curve: no verifier.
        assert!(ossl::verifier(&Algorithm::RS256, &ec).is_err());
        assert!(ossl::verifier(&Algorithm::ES256, &rsa).is_err());
        let mut off = vec![4u8];
        off.extend([7u8; 64]);
        let off = DecodingKey::from_ec_der(&off);
        assert!(ossl::verifier(&Algorithm::ES256, &off).is_err());
    }

    #[test]
    fn refusals_are_counted_by_reason() {
        let v = verifier(None, None);
        let vec =
            prometheus::IntCounterVec::new(prometheus::Opts::new("t", "t"), &["reason"]).unwrap();
        v.count_refusals(&vec);
        let t = sign(Algorithm::ES256, Some("e1"), &json!({"exp": NOW - 600}));
        assert_eq!(v.verify(t.as_bytes(), NOW).unwrap_err(), Invalid::Expired);
        assert_eq!(v.verify(b"x", NOW).unwrap_err(), Invalid::Malformed);
        let ok = sign(Algorithm::ES256, Some("e1"), &json!({"exp": NOW + 600}));
        assert!(v.verify(ok.as_bytes(), NOW).is_ok());
        let get = |r: &str| vec.with_label_values(&[r]).get();
        assert_eq!(
            (get("expired"), get("malformed"), get("signature")),
            (1, 1, 0)
        );
    }

    #[test]
    fn the_cache_is_bounded() {
        let v = Verifier::new(None, Some(SECRET), None, None).unwrap();
        for i in 0..(CACHE_ENTRIES * 3) {
            let t = sign(Algorithm::HS256, None, &json!({"sub": i, "exp": NOW + 60}));
            assert!(v.verify(t.as_bytes(), NOW).is_ok());
            assert!(v.cached() <= CACHE_ENTRIES);
        }
    }

    #[test]
    fn the_refused_cache_is_bounded_and_expires() {
        let c = Refused::new();
        c.put(7, Invalid::Signature, NOW);
        assert_eq!(c.get(7, NOW), Some(Invalid::Signature));
        assert_eq!(
            c.get(7, NOW + REFUSED_TTL_SECS - 1),
            Some(Invalid::Signature)
        );
        assert_eq!(c.get(8, NOW), None);
        // Expired: gone, and dropped from the shard.
        assert_eq!(c.get(7, NOW + REFUSED_TTL_SECS), None);
        assert_eq!(c.len(), 0);
        // Bounded: never more than its entries, however many refusals.
        let mut rng = fastrand::Rng::with_seed(3);
        for i in 0..(REFUSED_ENTRIES * 4) as u64 {
            c.put(rng.u64(..), Invalid::Malformed, NOW + i / 1000);
            assert!(c.len() <= REFUSED_ENTRIES);
        }
        // A full shard drops its expired entries before anything else.
        let c = Refused::new();
        let fresh = 1u64 << 32; // shard 1
        c.put(fresh, Invalid::Expired, NOW + 100);
        for i in 1..REFUSED_PER_SHARD as u64 {
            c.put((i << 35) | (1 << 32), Invalid::Signature, NOW); // shard 1 too
        }
        assert_eq!(c.len(), REFUSED_PER_SHARD);
        c.put(2 | (1 << 32), Invalid::Signature, NOW + REFUSED_TTL_SECS);
        assert_eq!(c.get(fresh, NOW + REFUSED_TTL_SECS), Some(Invalid::Expired));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn failures_are_counted_per_address_in_windows() {
        let f = Failures::new();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for _ in 0..MAX_FAILURES_PER_ADDRESS - 1 {
            f.add(a, NOW);
        }
        assert!(!f.over(a, NOW));
        f.add(a, NOW + 1);
        assert!(f.over(a, NOW + 1));
        assert!(f.over(a, NOW + FAILURE_WINDOW_SECS - 1));
        assert!(!f.over(b, NOW + 1), "another address");
        // The window ends: counted afresh.
        assert!(!f.over(a, NOW + FAILURE_WINDOW_SECS));
        f.add(a, NOW + FAILURE_WINDOW_SECS);
        assert!(!f.over(a, NOW + FAILURE_WINDOW_SECS));
        // IPv6 by its /64; a v4-mapped address is its IPv4 address.
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        for i in 0..MAX_FAILURES_PER_ADDRESS {
            f.add(v6(&format!("2001:db8:1:2::{:x}", i + 1)), NOW);
        }
        assert!(f.over(v6("2001:db8:1:2:ffff::1"), NOW));
        assert!(!f.over(v6("2001:db8:1:3::1"), NOW));
        for _ in 0..MAX_FAILURES_PER_ADDRESS {
            f.add(b, NOW);
        }
        assert!(f.over(v6("::ffff:192.0.2.2"), NOW));
        // Bounded: a full shard drops ended windows, then tracks no new address, and keeps
        // the addresses it holds.
        let f = Failures::new();
        for i in 0..(ADDRESSES * 3) as u32 {
            f.add(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)), NOW);
            assert!(f.len() <= ADDRESSES);
        }
        for _ in 0..MAX_FAILURES_PER_ADDRESS {
            f.add(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000)), NOW);
        }
        assert!(f.over(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000)), NOW));
        f.add(a, NOW + FAILURE_WINDOW_SECS);
        assert!(f.len() < ADDRESSES, "ended windows dropped");
    }

    /// A repeated forged token is refused from the refused cache (no second signature
    /// check), counted each time; the valid token still verifies; an address past its
    /// failures has its new tokens refused unchecked, but not a token that verified before.
    #[test]
    fn refused_tokens_are_remembered_and_failures_limit_an_address() {
        let v = verifier(None, None);
        let vec =
            prometheus::IntCounterVec::new(prometheus::Opts::new("t", "t"), &["reason"]).unwrap();
        v.count_refusals(&vec);
        let get = |r: &str| vec.with_label_values(&[r]).get();
        let ip: IpAddr = "198.51.100.7".parse().unwrap();
        let good = sign(
            Algorithm::ES256,
            Some("e1"),
            &json!({"sub": "a", "exp": NOW + 600}),
        );
        assert!(v.verify_from(good.as_bytes(), NOW, Some(ip)).is_ok());
        let forged = |n: u64| {
            let t = sign(
                Algorithm::ES256,
                Some("e1"),
                &json!({"sub": n, "exp": NOW + 600}),
            );
            let (msg, _) = t.rsplit_once('.').unwrap();
            format!("{msg}.{}", b64(&[7u8; 64]))
        };
        let f0 = forged(0);
        for _ in 0..50 {
            assert_eq!(
                v.verify_from(f0.as_bytes(), NOW, Some(ip)).unwrap_err(),
                Invalid::Signature
            );
        }
        assert_eq!(get("signature"), 50);
        assert_eq!(v.refused_cached(), 1);
        // One check only: the address has one failure.
        for n in 1..MAX_FAILURES_PER_ADDRESS as u64 {
            assert_eq!(
                v.verify_from(forged(n).as_bytes(), NOW, Some(ip))
                    .unwrap_err(),
                Invalid::Signature
            );
        }
        // Past the limit: a new token is refused unchecked, valid or not.
        let new_good = sign(
            Algorithm::ES256,
            Some("e1"),
            &json!({"sub": "b", "exp": NOW + 600}),
        );
        assert_eq!(
            v.verify_from(new_good.as_bytes(), NOW, Some(ip))
                .unwrap_err(),
            Invalid::AddressLimited
        );
        assert_eq!(get("address_limited"), 1);
        // The token that verified before still does; another address is checked.
        assert!(v.verify_from(good.as_bytes(), NOW, Some(ip)).is_ok());
        let other: IpAddr = "198.51.100.8".parse().unwrap();
        assert!(v.verify_from(new_good.as_bytes(), NOW, Some(other)).is_ok());
        // The window over, the address is checked again.
        let later = NOW + FAILURE_WINDOW_SECS;
        let newer = sign(
            Algorithm::ES256,
            Some("e1"),
            &json!({"sub": "c", "exp": NOW + 600}),
        );
        assert!(v.verify_from(newer.as_bytes(), later, Some(ip)).is_ok());
        // A refused token is never admitted from the refused cache, and one not yet valid
        // is not remembered (it is checked again when it may be valid).
        let soon = sign(
            Algorithm::ES256,
            Some("e1"),
            &json!({"sub": "d", "nbf": NOW + 120, "exp": NOW + 600}),
        );
        assert_eq!(
            v.verify(soon.as_bytes(), NOW).unwrap_err(),
            Invalid::NotYetValid
        );
        assert!(v.verify(soon.as_bytes(), NOW + 120).is_ok());
    }

    #[test]
    fn issuer_and_audience_when_set() {
        let v = verifier(Some("https://idp.example"), Some("api"));
        let t = |c: serde_json::Value| {
            let t = sign(Algorithm::RS256, Some("r1"), &c);
            v.verify_uncached(t.as_bytes(), NOW).map(|_| ())
        };
        let e = NOW + 60;
        assert_eq!(
            t(json!({"exp": e, "iss": "https://idp.example", "aud": "api"})),
            Ok(())
        );
        assert_eq!(
            t(json!({"exp": e, "iss": "https://idp.example", "aud": ["x", "api"]})),
            Ok(())
        );
        assert_eq!(
            t(json!({"exp": e, "iss": "https://evil.example", "aud": "api"})),
            Err(Invalid::Issuer)
        );
        assert_eq!(t(json!({"exp": e, "aud": "api"})), Err(Invalid::Issuer));
        assert_eq!(
            t(json!({"exp": e, "iss": "https://idp.example", "aud": "other"})),
            Err(Invalid::Audience)
        );
        assert_eq!(
            t(json!({"exp": e, "iss": "https://idp.example"})),
            Err(Invalid::Audience)
        );
        // Unset: any issuer and audience.
        let any = verifier(None, None);
        let tok = sign(
            Algorithm::RS256,
            Some("r1"),
            &json!({"exp": e, "iss": "x", "aud": "y"}),
        );
        assert!(any.verify(tok.as_bytes(), NOW).is_ok());
    }

    #[test]
    fn bad_key_material_is_refused_at_load() {
        let new = |jwks: &str| {
            Verifier::new(Some(jwks.as_bytes()), None, None, None)
                .map(|_| ())
                .map_err(|(p, e)| {
                    assert_eq!(p, Part::Jwks);
                    e
                })
        };
        assert!(new("not json").unwrap_err().contains("not a JWKS"));
        assert!(new(r#"{"keys":[]}"#).unwrap_err().contains("no keys"));
        assert!(new(r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#)
            .unwrap_err()
            .contains("not an RSA or EC key"));
        let set: serde_json::Value = serde_json::from_str(&jwks()).unwrap();
        let rsa = set["keys"][0].clone();
        let ec = set["keys"][1].clone();
        let with = |mut k: serde_json::Value, f: &str, v: serde_json::Value| {
            k[f] = v;
            json!({ "keys": [k] }).to_string()
        };
        assert!(new(&with(ec.clone(), "x", json!(b64(&[7u8; 32]))))
            .unwrap_err()
            .contains("not a point of P-256"));
        assert!(new(&with(ec.clone(), "crv", json!("P-384")))
            .unwrap_err()
            .contains("P-384"));
        assert!(new(&with(rsa.clone(), "n", json!(b64(&[0xffu8; 128]))))
            .unwrap_err()
            .contains("1024 bits"));
        assert!(new(&with(rsa.clone(), "e", json!(b64(&[2]))))
            .unwrap_err()
            .contains("exponent"));
        assert!(new(&with(rsa.clone(), "use", json!("enc")))
            .unwrap_err()
            .contains("use"));
        assert!(new(&with(rsa.clone(), "alg", json!("ES256")))
            .unwrap_err()
            .contains("does not fit"));
        let dup = json!({"keys": [rsa.clone(), rsa.clone()]}).to_string();
        assert!(new(&dup).unwrap_err().contains("duplicate kid"));
        assert!(new(&jwks()).is_ok());
        // secrets
        let short = Verifier::new(None, Some(b"short\n"), None, None).unwrap_err();
        assert_eq!(short.0, Part::Secret);
        assert!(short.1.contains("5 bytes"), "{}", short.1);
        assert!(!short.1.contains("short"));
        let mut nl = SECRET.to_vec();
        nl.extend_from_slice(b"\r\n");
        let v = Verifier::new(None, Some(&nl), None, None).unwrap();
        let t = sign(Algorithm::HS256, None, &json!({"sub": "a", "exp": NOW + 9}));
        assert!(v.verify(t.as_bytes(), NOW).is_ok());
        assert!(Verifier::new(None, None, None, None).is_err());
    }

    #[test]
    fn equal_sources_are_equal_verifiers_and_debug_hides_the_secret() {
        let a = verifier(None, None);
        assert_eq!(a, verifier(None, None));
        assert_ne!(a, verifier(Some("i"), None));
        let dbg = format!("{a:?}");
        assert!(!dbg.contains("0123456789abcdef"), "{dbg}");
    }

    #[test]
    fn random_bytes_never_panic() {
        let v = verifier(None, None);
        let mut rng = fastrand::Rng::with_seed(7);
        let valid = sign(Algorithm::RS256, Some("r1"), &json!({"exp": NOW + 60}));
        for _ in 0..2000 {
            let n = rng.usize(0..200);
            let mut b: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
            if rng.bool() {
                // mostly-valid shapes: a real token with bytes changed
                b = valid.as_bytes().to_vec();
                for _ in 0..rng.usize(1..4) {
                    let i = rng.usize(0..b.len());
                    b[i] = rng.u8(..);
                }
            }
            assert!(v.verify(&b, NOW).is_err() || b == valid.as_bytes());
        }
    }

    /// A repeated forged ES256 token as it cost before (every check, each time), as it
    /// costs now (from the refused cache), and a valid cached token, 100 of each, each loop
    /// in its own function for callgrind's inclusive counts (not asserted):
    /// `valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out <lib test binary>
    /// --ignored --exact ratelimit::jwt::tests::repeated_forged_token_cost` then
    /// `callgrind_annotate --inclusive=yes /tmp/cg.out | grep cost_loop`.
    #[test]
    #[ignore = "a measurement"]
    fn repeated_forged_token_cost() {
        install_provider();
        let v = verifier(None, None);
        let good = sign(
            Algorithm::ES256,
            Some("e1"),
            &json!({"sub": "a", "exp": NOW + 600}),
        );
        let (msg, _) = good.rsplit_once('.').unwrap();
        let forged = format!("{msg}.{}", b64(&[0x5a; 64]));
        let ip: IpAddr = "192.0.2.9".parse().unwrap();
        assert!(v.verify_from(good.as_bytes(), NOW, Some(ip)).is_ok());
        assert!(v.verify_from(forged.as_bytes(), NOW, Some(ip)).is_err());
        #[inline(never)]
        fn cost_loop_forged_before(v: &Verifier, t: &[u8]) {
            for _ in 0..100 {
                assert!(std::hint::black_box(v.verify_uncached(t, NOW)).is_err());
            }
        }
        #[inline(never)]
        fn cost_loop_forged_after(v: &Verifier, t: &[u8], ip: IpAddr) {
            for _ in 0..100 {
                assert!(std::hint::black_box(v.verify_from(t, NOW, Some(ip))).is_err());
            }
        }
        #[inline(never)]
        fn cost_loop_valid_cached(v: &Verifier, t: &[u8], ip: IpAddr) {
            for _ in 0..100 {
                assert!(std::hint::black_box(v.verify_from(t, NOW, Some(ip))).is_ok());
            }
        }
        cost_loop_forged_before(&v, forged.as_bytes());
        cost_loop_forged_after(&v, forged.as_bytes(), ip);
        cost_loop_valid_cached(&v, good.as_bytes(), ip);
    }

    /// One verification of each algorithm, uncached and cached (printed, not asserted:
    /// `cargo test --release --lib ratelimit::jwt -- --nocapture --ignored`).
    #[test]
    #[ignore = "a measurement"]
    fn time_one_verification() {
        // OpenSSL's verifiers, as in the proxy (installed before anything signs).
        install_provider();
        let v = verifier(None, None);
        let claims = json!({"sub": "alice", "exp": NOW + 60});
        for (alg, kid) in [
            (Algorithm::RS256, Some("r1")),
            (Algorithm::ES256, Some("e1")),
            (Algorithm::HS256, None),
        ] {
            let t = sign(alg, kid, &claims);
            let n = 200;
            let start = std::time::Instant::now();
            for _ in 0..n {
                assert!(v.verify_uncached(t.as_bytes(), NOW).is_ok());
            }
            let uncached = start.elapsed() / n;
            assert!(v.verify(t.as_bytes(), NOW).is_ok());
            let start = std::time::Instant::now();
            for _ in 0..n * 100 {
                assert!(v.verify(t.as_bytes(), NOW).is_ok());
            }
            let cached = start.elapsed() / (n * 100);
            println!("{alg:?}: verify {uncached:?}, cached {cached:?}");
        }
    }
}
