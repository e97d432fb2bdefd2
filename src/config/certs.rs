//! Certificate material of the configuration: `[tls]`'s certificates (read and checked,
//! leaf against key, when the configuration is validated), SNI selection among them, an
//! upstream's `ca_file` and `tls.min_version`. The edge's handshake callback
//! (`server::tls`) serves what this holds.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pingora::tls::pkey::{PKey, Private};
use pingora::tls::ssl::SslVersion;
use pingora::tls::x509::X509;

/// `tls.min_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinVersion {
    Tls12,
    Tls13,
}

impl MinVersion {
    pub(crate) fn ssl_version(self) -> SslVersion {
        match self {
            MinVersion::Tls12 => SslVersion::TLS1_2,
            MinVersion::Tls13 => SslVersion::TLS1_3,
        }
    }
}

/// One certificate: its chain (leaf first), key and the names it serves.
pub struct LoadedCert {
    pub cert_path: PathBuf,
    pub(crate) chain: Vec<X509>,
    pub(crate) key: PKey<Private>,
    /// Lower-case DNS names from the SAN (the subject CN when there is no SAN).
    pub names: Vec<String>,
    /// DER of the leaf: two sets are equal when they serve the same certificates.
    leaf_der: Vec<u8>,
}

/// The certificates of `[tls]`, in file order (the first is the default).
#[derive(Clone)]
pub struct CertSet(Arc<Vec<LoadedCert>>);

impl PartialEq for CertSet {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(other.0.iter())
                .all(|(a, b)| a.cert_path == b.cert_path && a.leaf_der == b.leaf_der)
    }
}

impl fmt::Debug for CertSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|c| (&c.cert_path, &c.names)))
            .finish()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    super::read_regular_file(path, super::FileKind::Pem)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

impl CertSet {
    /// Read and check every `(cert, key)` pair. Errors name the entry index,
    /// the field (`cert` or `key`) and why.
    pub fn load(pairs: &[(PathBuf, PathBuf)]) -> Result<Self, (usize, &'static str, String)> {
        let mut out = Vec::with_capacity(pairs.len());
        for (i, (cert_path, key_path)) in pairs.iter().enumerate() {
            let pem = read(cert_path).map_err(|e| (i, "cert", e))?;
            let chain = X509::stack_from_pem(&pem).map_err(|e| {
                (
                    i,
                    "cert",
                    format!("{} is not a PEM certificate: {e}", cert_path.display()),
                )
            })?;
            let Some(leaf) = chain.first() else {
                return Err((
                    i,
                    "cert",
                    format!("{} holds no certificate", cert_path.display()),
                ));
            };
            let key_pem = read(key_path).map_err(|e| (i, "key", e))?;
            let key = PKey::private_key_from_pem(&key_pem).map_err(|e| {
                (
                    i,
                    "key",
                    format!("{} is not a PEM private key: {e}", key_path.display()),
                )
            })?;
            let matches = leaf
                .public_key()
                .map(|pk| pk.public_eq(&key))
                .unwrap_or(false);
            if !matches {
                return Err((
                    i,
                    "key",
                    format!(
                        "{} does not match the certificate {}",
                        key_path.display(),
                        cert_path.display()
                    ),
                ));
            }
            let names = names_of(leaf);
            let leaf_der = leaf.to_der().map_err(|e| (i, "cert", e.to_string()))?;
            out.push(LoadedCert {
                cert_path: cert_path.clone(),
                chain,
                key,
                names,
                leaf_der,
            });
        }
        Ok(Self(Arc::new(out)))
    }

    /// The certificate for `sni` (see [`select`]).
    pub fn pick(&self, sni: Option<&str>) -> Option<&LoadedCert> {
        let idx = select(self.0.iter().map(|c| c.names.as_slice()), sni);
        self.0.get(idx)
    }
}

fn names_of(leaf: &X509) -> Vec<String> {
    let mut names: Vec<String> = leaf
        .subject_alt_names()
        .map(|sans| {
            sans.iter()
                .filter_map(|n| n.dnsname().map(str::to_ascii_lowercase))
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        names = leaf
            .subject_name()
            .entries_by_nid(pingora::tls::nid::Nid::COMMONNAME)
            .filter_map(|e| {
                std::str::from_utf8(e.data().as_slice())
                    .ok()
                    .map(str::to_ascii_lowercase)
            })
            .collect();
    }
    names
}

/// Whether the wildcard name `pattern` (`*.example.com`) covers `host`: exactly
/// one leftmost label (RFC 6125 §6.4.3).
fn wildcard_matches(pattern: &str, host: &str) -> bool {
    let Some(suffix) = pattern.strip_prefix("*.") else {
        return false;
    };
    match host.split_once('.') {
        Some((label, rest)) => !label.is_empty() && rest == suffix,
        None => false,
    }
}

/// Index of the certificate for `sni` among certificates with the given names:
/// an exact name first, then a wildcard, else the first (the default).
pub fn select<'a>(certs: impl Iterator<Item = &'a [String]> + Clone, sni: Option<&str>) -> usize {
    let Some(host) = sni.map(|s| s.trim_end_matches('.').to_ascii_lowercase()) else {
        return 0;
    };
    if let Some(i) = certs.clone().position(|names| names.contains(&host)) {
        return i;
    }
    certs
        .clone()
        .position(|names| names.iter().any(|n| wildcard_matches(n, &host)))
        .unwrap_or(0)
}

/// `ca_file` of an upstream: extra trust anchors.
#[derive(Clone)]
pub struct CaBundle(pub Arc<Box<[X509]>>);

impl PartialEq for CaBundle {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(other.0.iter())
                .all(|(a, b)| a.to_der().ok() == b.to_der().ok())
    }
}

impl fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CaBundle({} certificates)", self.0.len())
    }
}

impl CaBundle {
    pub fn load(path: &Path) -> Result<Self, String> {
        let pem = read(path)?;
        let certs = X509::stack_from_pem(&pem)
            .map_err(|e| format!("{} is not a PEM bundle: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!("{} holds no certificate", path.display()));
        }
        Ok(Self(Arc::new(certs.into_boxed_slice())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&[&str]]) -> Vec<Vec<String>> {
        v.iter()
            .map(|n| n.iter().map(|s| s.to_string()).collect())
            .collect()
    }

    fn pick(certs: &[Vec<String>], sni: Option<&str>) -> usize {
        select(certs.iter().map(Vec::as_slice), sni)
    }

    #[test]
    fn exact_beats_wildcard_whatever_the_order() {
        let c = names(&[
            &["default.test"],
            &["*.example.test"],
            &["api.example.test"],
        ]);
        assert_eq!(pick(&c, Some("api.example.test")), 2);
        assert_eq!(pick(&c, Some("API.Example.TEST.")), 2);
        assert_eq!(pick(&c, Some("www.example.test")), 1);
    }

    #[test]
    fn wildcard_covers_one_label_only() {
        let c = names(&[&["default.test"], &["*.example.test"]]);
        assert_eq!(pick(&c, Some("a.b.example.test")), 0);
        assert_eq!(pick(&c, Some("example.test")), 0);
        assert_eq!(pick(&c, Some(".example.test")), 0);
    }

    #[test]
    fn unknown_or_missing_sni_gets_the_first() {
        let c = names(&[&["a.test"], &["b.test"]]);
        assert_eq!(pick(&c, None), 0);
        assert_eq!(pick(&c, Some("zzz.test")), 0);
        assert_eq!(pick(&c, Some("b.test")), 1);
    }
}
