//! Validation of `[tls]` (CONTRACT §6): the TLS listeners, the minimum version and
//! the certificates, loaded by `certs.rs`.

use super::certs::{CertSet, MinVersion};
use super::check::{err, listen_addrs, VResult};
use super::schema::*;
use super::settings::*;
use std::path::PathBuf;

pub(super) fn validate_tls(t: &TlsSection) -> VResult<TlsSettings> {
    let listen = listen_addrs("tls.listen", &t.listen)?;
    let min_version = match t.min_version.as_str() {
        "1.2" => MinVersion::Tls12,
        "1.3" => MinVersion::Tls13,
        other => {
            return err(
                "tls.min_version",
                format!("unknown TLS version {other:?}: expected \"1.2\" or \"1.3\""),
            )
        }
    };
    let certificates = certificates(t)?;
    Ok(TlsSettings {
        listen,
        min_version,
        certificates,
    })
}

/// `[[tls.certificates]]`: at least one, each with a cert and a key that load.
fn certificates(t: &TlsSection) -> VResult<CertSet> {
    if t.certificates.is_empty() {
        return err(
            "tls.certificates",
            "at least one [[tls.certificates]] entry is required",
        );
    }
    let mut pairs = Vec::with_capacity(t.certificates.len());
    for (i, c) in t.certificates.iter().enumerate() {
        if c.cert.is_empty() {
            return err(format!("tls.certificates[{i}].cert"), "must not be empty");
        }
        if c.key.is_empty() {
            return err(format!("tls.certificates[{i}].key"), "must not be empty");
        }
        pairs.push((PathBuf::from(&c.cert), PathBuf::from(&c.key)));
    }
    CertSet::load(&pairs)
        .map_err(|(i, field, reason)| (format!("tls.certificates[{i}].{field}"), reason))
}

/// The TLS listeners share no address with the plain ones nor the admin listener.
pub(super) fn distinct_from_server(t: &TlsSettings, server: &ServerSettings) -> VResult<()> {
    for (i, a) in t.listen.iter().enumerate() {
        if server.listen.contains(a) || *a == server.admin_listen {
            return err(
                format!("tls.listen[{i}]"),
                "must differ from every server.listen address and admin_listen",
            );
        }
    }
    Ok(())
}
