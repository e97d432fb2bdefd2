//! OpenSSL verifiers of RS256 and ES256 (the `openssl` crate, as Pingora uses), the
//! verifier factory of the crate's `CryptoProvider` ([`super::install_provider`]).

use jsonwebtoken::crypto::JwtVerifier;
use jsonwebtoken::errors::{Error, ErrorKind};
use jsonwebtoken::signature;
use jsonwebtoken::{Algorithm, DecodingKey, DecodingKeyKind};
use openssl::bn::{BigNum, BigNumContext};
use openssl::ec::{EcGroup, EcKey, EcPoint};
use openssl::ecdsa::EcdsaSig;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Public};

type Sig = Result<(), signature::Error>;

fn bad() -> signature::Error {
    signature::Error::new()
}

struct Rs256(PKey<Public>);
struct Es256(EcKey<Public>);

impl signature::Verifier<Vec<u8>> for Rs256 {
    fn verify(&self, msg: &[u8], sig: &Vec<u8>) -> Sig {
        let mut v = openssl::sign::Verifier::new(MessageDigest::sha256(), &self.0)
            .map_err(signature::Error::from_source)?;
        match v.verify_oneshot(sig, msg) {
            Ok(true) => Ok(()),
            _ => Err(bad()),
        }
    }
}

impl signature::Verifier<Vec<u8>> for Es256 {
    fn verify(&self, msg: &[u8], sig: &Vec<u8>) -> Sig {
        // JWS carries r||s, 32 bytes each (RFC 7518 §3.4).
        if sig.len() != 64 {
            return Err(bad());
        }
        let r = BigNum::from_slice(&sig[..32]).map_err(signature::Error::from_source)?;
        let s = BigNum::from_slice(&sig[32..]).map_err(signature::Error::from_source)?;
        let sig = EcdsaSig::from_private_components(r, s).map_err(signature::Error::from_source)?;
        match sig.verify(&openssl::sha::sha256(msg), &self.0) {
            Ok(true) => Ok(()),
            _ => Err(bad()),
        }
    }
}

impl JwtVerifier for Rs256 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::RS256
    }
}
impl JwtVerifier for Es256 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::ES256
    }
}

fn invalid(kind: ErrorKind) -> Error {
    kind.into()
}

/// The verifier of `alg` with `key`: an error when the key is not of the algorithm's
/// kind or not a valid key (an EC point off the curve). Other algorithms are RustCrypto's,
/// HS256 included (its HMAC is faster there than through an OpenSSL key per token).
pub(super) fn verifier(alg: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>, Error> {
    match (alg, key.kind()) {
        (Algorithm::RS256, DecodingKeyKind::RsaModulusExponent { n, e }) => {
            let rsa = BigNum::from_slice(n)
                .and_then(|n| Ok((n, BigNum::from_slice(e)?)))
                .and_then(|(n, e)| openssl::rsa::Rsa::from_public_components(n, e))
                .and_then(PKey::from_rsa)
                .map_err(|e| invalid(ErrorKind::InvalidRsaKey(e.to_string())))?;
            Ok(Box::new(Rs256(rsa)))
        }
        (Algorithm::ES256, DecodingKeyKind::SecretOrDer(point)) => {
            let ec = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)
                .and_then(|group| {
                    let mut ctx = BigNumContext::new()?;
                    let p = EcPoint::from_bytes(&group, point, &mut ctx)?;
                    // On the curve (checked by the decoding), so of the group's prime
                    // order: P-256's cofactor is 1.
                    EcKey::from_public_key(&group, &p)
                })
                .map_err(|_| invalid(ErrorKind::InvalidEcdsaKey))?;
            Ok(Box::new(Es256(ec)))
        }
        (Algorithm::RS256 | Algorithm::ES256, _) => Err(invalid(ErrorKind::InvalidKeyFormat)),
        _ => (jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.verifier_factory)(alg, key),
    }
}
