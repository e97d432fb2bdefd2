//! Validation of `[jwt]` (CONTRACT §14): its key files are read and checked here, at load
//! and on every reload (a file that turns invalid fails the reload and the old keys stay),
//! into the verifier `key = "jwt:CLAIM"` uses; such a key without `[jwt]` keys is an error.

use std::path::Path;
use std::sync::Arc;

use super::check::{err, VResult};
use super::schema::JwtSection;
use super::settings::RateLimitSettings;
use super::FileKind;
use crate::ratelimit::jwt::{Part, Verifier};
use crate::ratelimit::{KeySource, PolicyKey};

pub(super) fn validate_jwt(
    section: Option<&JwtSection>,
    rl: &RateLimitSettings,
) -> VResult<Option<Arc<Verifier>>> {
    let verifier = section.map(verifier).transpose()?;
    if verifier.is_none() {
        let uses = std::iter::once(("rate_limit.key".to_string(), &rl.source)).chain(
            rl.policies
                .iter()
                .enumerate()
                .filter_map(|(i, p)| match &p.key {
                    PolicyKey::Source(s) => Some((format!("rate_limit.policies[{i}].key"), s)),
                    PolicyKey::ClientIp => None,
                }),
        );
        for (path, source) in uses {
            if let KeySource::Jwt(claim) = source {
                return err(
                    path,
                    format!(
                        "key \"jwt:{claim}\" needs [jwt] with jwks_file or hs256_secret_file \
                         (the keys its tokens are verified with)"
                    ),
                );
            }
        }
    }
    Ok(verifier.map(Arc::new))
}

fn verifier(j: &JwtSection) -> VResult<Verifier> {
    if j.jwks_file.is_empty() && j.hs256_secret_file.is_empty() {
        return err(
            "jwt",
            "no key source: set jwks_file (RS256/ES256 public keys) or hs256_secret_file",
        );
    }
    let read = |key: &str, path: &str, kind: FileKind| -> VResult<Option<Vec<u8>>> {
        if path.is_empty() {
            return Ok(None);
        }
        match super::read_regular_file(Path::new(path), kind) {
            Ok(b) if b.is_empty() => err(key, format!("{path:?}: the file is empty")),
            Ok(b) => Ok(Some(b)),
            Err(e) => err(key, format!("cannot read {path:?}: {e}")),
        }
    };
    let jwks = read("jwt.jwks_file", &j.jwks_file, FileKind::Jwks)?;
    let secret = read(
        "jwt.hs256_secret_file",
        &j.hs256_secret_file,
        FileKind::Secret,
    )?;
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let (issuer, audience) = (opt(&j.issuer), opt(&j.audience));
    Verifier::new(
        jwks.as_deref(),
        secret.as_deref(),
        issuer.as_deref(),
        audience.as_deref(),
    )
    .or_else(|(part, why)| match part {
        Part::Jwks => err("jwt.jwks_file", format!("{:?}: {why}", j.jwks_file)),
        Part::Secret => err(
            "jwt.hs256_secret_file",
            format!("{:?}: {why}", j.hs256_secret_file),
        ),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::ratelimit::jwt::testkeys;

    fn parse(extra: &str) -> Result<crate::config::Config, crate::config::ConfigError> {
        let text = format!("[[upstreams]]\nname = \"a\"\nbackends = [\"127.0.0.1:9\"]\n{extra}");
        crate::config::parse("t.toml", &text)
    }

    #[test]
    fn a_jwt_key_needs_jwt_keys() {
        let e = parse("[rate_limit]\nkey = \"jwt:sub\"\n").unwrap_err();
        assert_eq!(e.key_path, "rate_limit.key");
        assert!(e.reason.contains("needs [jwt]"), "{e}");
        assert_eq!(e.line_col.map(|l| l.0), Some(5), "{e}");
        let e = parse(
            "[rate_limit]\nkey = \"bearer\"\n[[rate_limit.policies]]\nname = \"p\"\nkey = \"jwt:org\"\n",
        )
        .unwrap_err();
        assert_eq!(e.key_path, "rate_limit.policies[0].key");
        let e = parse("[rate_limit]\nkey = \"jwt:sub\"\n[jwt]\nissuer = \"x\"\n").unwrap_err();
        assert_eq!(e.key_path, "jwt");
        assert!(e.reason.contains("no key source"), "{e}");
        let e = parse("[rate_limit]\nkey = \"jwt:\"\n").unwrap_err();
        assert!(e.reason.contains("jwt:CLAIM"), "{e}");
    }

    #[test]
    fn key_files_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("jwks.json");
        let secret = dir.path().join("secret");
        std::fs::write(&jwks, testkeys::jwks()).unwrap();
        std::fs::write(&secret, [testkeys::SECRET, b"\n"].concat()).unwrap();
        let conf = |j: &std::path::Path, s: &std::path::Path| {
            format!(
                "[rate_limit]\nkey = \"jwt:sub\"\n[jwt]\njwks_file = {:?}\nhs256_secret_file = {:?}\n",
                j.display().to_string(),
                s.display().to_string()
            )
        };
        let c = parse(&conf(&jwks, &secret)).unwrap();
        let v = c.rate_limit.jwt.clone().unwrap();
        let dbg = format!("{v:?}");
        assert!(dbg.contains("RS256") && dbg.contains("r1"), "{dbg}");
        // Equal files, equal settings (the reload diff).
        assert_eq!(c, parse(&conf(&jwks, &secret)).unwrap());

        let missing = dir.path().join("nope.json");
        let e = parse(&conf(&missing, &secret)).unwrap_err();
        assert_eq!(e.key_path, "jwt.jwks_file");
        assert!(e.reason.contains("nope.json"), "{e}");
        assert_eq!(e.line_col.map(|l| l.0), Some(7), "{e}");

        std::fs::write(&jwks, "{\"keys\": [").unwrap();
        let e = parse(&conf(&jwks, &secret)).unwrap_err();
        assert_eq!(e.key_path, "jwt.jwks_file");
        assert!(
            e.reason.contains("jwks.json") && e.reason.contains("not a JWKS"),
            "{e}"
        );

        std::fs::write(&jwks, testkeys::jwks()).unwrap();
        std::fs::write(&secret, "tooshort\n").unwrap();
        let e = parse(&conf(&jwks, &secret)).unwrap_err();
        assert_eq!(e.key_path, "jwt.hs256_secret_file");
        assert!(!e.reason.contains("tooshort"), "{e}");
        assert!(e.reason.contains("at least 32"), "{e}");
    }
}
