//! Key material: the keys of a JWKS document, each checked at load (an RSA key's size, an
//! EC key's curve), so that the request path only verifies.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, DecodingKeyKind, Validation};

use super::Key;

/// The keys of a JWKS document: RSA keys (RS256, 2048 to 4096 bits) and EC P-256 keys
/// (ES256), each with `use` unset or `sig` and `alg` unset or its algorithm; `kid`s unique.
pub(super) fn parse_jwks(
    text: &[u8],
    rules: &dyn Fn(Algorithm) -> Validation,
) -> Result<Vec<Key>, String> {
    let set: JwkSet =
        serde_json::from_slice(text).map_err(|e| format!("not a JWKS document: {e}"))?;
    if set.keys.is_empty() {
        return Err("the JWKS has no keys".into());
    }
    let mut keys: Vec<Key> = Vec::with_capacity(set.keys.len());
    for (i, jwk) in set.keys.iter().enumerate() {
        let kid = jwk.common.key_id.clone();
        let at = match &kid {
            Some(k) => format!("keys[{i}] (kid {k:?})"),
            None => format!("keys[{i}]"),
        };
        if kid.is_some() && keys.iter().any(|k| k.kid == kid) {
            return Err(format!("{at}: duplicate kid"));
        }
        match &jwk.common.public_key_use {
            None | Some(PublicKeyUse::Signature) => {}
            Some(_) => return Err(format!("{at}: \"use\" must be \"sig\"")),
        }
        let (alg, key) = match &jwk.algorithm {
            AlgorithmParameters::RSA(p) => {
                let key = DecodingKey::from_rsa_components(&p.n, &p.e)
                    .map_err(|e| format!("{at}: invalid RSA key (n, e): {e}"))?;
                check_rsa(&key).map_err(|e| format!("{at}: {e}"))?;
                (Algorithm::RS256, key)
            }
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                let key = DecodingKey::from_ec_components(&p.x, &p.y)
                    .map_err(|e| format!("{at}: invalid EC key (x, y): {e}"))?;
                // The point is checked when a verifier is made of it.
                let len_ok = matches!(key.kind(), DecodingKeyKind::SecretOrDer(b) if b.len() == 65);
                if !len_ok
                    || jsonwebtoken::crypto::verify("AA", b"x", &key, Algorithm::ES256).is_err()
                {
                    return Err(format!("{at}: x, y are not a point of P-256"));
                }
                (Algorithm::ES256, key)
            }
            AlgorithmParameters::EllipticCurve(p) => {
                let crv = serde_json::to_string(&p.curve).unwrap_or_default();
                return Err(format!(
                    "{at}: curve {crv} is not supported (ES256 keys are P-256)"
                ));
            }
            _ => {
                return Err(format!(
                    "{at}: not an RSA or EC key (RS256 and ES256 public keys only; an HS256 \
                     secret goes in hs256_secret_file)"
                ))
            }
        };
        let named = match alg {
            Algorithm::RS256 => KeyAlgorithm::RS256,
            _ => KeyAlgorithm::ES256,
        };
        if let Some(a) = jwk.common.key_algorithm {
            if a != named {
                return Err(format!(
                    "{at}: \"alg\" {a:?} does not fit the key ({named:?})"
                ));
            }
        }
        keys.push(Key {
            kid,
            alg,
            key,
            validation: rules(alg),
        });
    }
    Ok(keys)
}

/// An RSA public key the verifier takes: a modulus of 2048 to 4096 bits, an odd exponent
/// from 3 to 2^33 - 1.
fn check_rsa(key: &DecodingKey) -> Result<(), String> {
    let DecodingKeyKind::RsaModulusExponent { n, e } = key.kind() else {
        return Err("not an RSA key".into());
    };
    let n = strip_zeros(n);
    let bits = n.len() * 8 - n.first().map_or(8, |b| b.leading_zeros() as usize);
    if !(2048..=4096).contains(&bits) {
        return Err(format!(
            "the modulus is {bits} bits: 2048 to 4096 are accepted"
        ));
    }
    let e = strip_zeros(e);
    let ev = if e.len() > 8 {
        u64::MAX
    } else {
        e.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b))
    };
    if ev < 3 || ev % 2 == 0 || ev >= 1 << 33 {
        return Err("the exponent must be odd, from 3 to 2^33 - 1".into());
    }
    Ok(())
}

fn strip_zeros(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|x| *x != 0).unwrap_or(b.len());
    &b[start..]
}
