//! TLS termination: certificates chosen per handshake by SNI, re-read on reload.
//!
//! Backend: OpenSSL through Pingora's `openssl` feature, linked against the
//! system libssl (`OPENSSL_NO_VENDOR`, see `.cargo/config.toml`). Pingora's
//! `TlsAccept::certificate_callback` runs in the middle of every handshake and
//! is only supported for openssl/boringssl (not rustls in 0.9.1): it is where
//! the certificate is picked, from the configuration current at that moment,
//! so a reload changes the certificate of new handshakes without touching open
//! connections and without a restart. BoringSSL would need cmake and Go.
//!
//! The certificate files are read and checked (leaf matches key) when the
//! configuration is validated; a reload with an unreadable or mismatched pair
//! fails validation, keeps the old configuration (certificates included) and
//! counts as a reload error.

use std::sync::Arc;

use async_trait::async_trait;
use pingora::listeners::tls::TlsSettings;
use pingora::listeners::TlsAccept;
use pingora::protocols::tls::TlsRef;
use pingora::tls::ext;
use pingora::tls::ssl::NameType;

pub use crate::config::certs::{select, CaBundle, CertSet, LoadedCert, MinVersion};
use crate::state::Shared;

/// Picks the certificate of each handshake from the current configuration.
pub struct SniCallback {
    shared: Arc<Shared>,
}

#[async_trait]
impl TlsAccept for SniCallback {
    async fn certificate_callback(&self, ssl: &mut TlsRef) {
        let rt = self.shared.runtime.load();
        let Some(tls) = rt.config.tls.as_ref() else {
            // [tls] was removed by a reload: no certificate, the handshake fails.
            return;
        };
        let sni = ssl.servername(NameType::HOST_NAME).map(str::to_owned);
        let Some(cert) = tls.certificates.pick(sni.as_deref()) else {
            return;
        };
        let mut chain = cert.chain.iter();
        let used = chain
            .next()
            .map(|leaf| ext::ssl_use_certificate(ssl, leaf))
            .transpose()
            .and_then(|_| ext::ssl_use_private_key(ssl, &cert.key))
            .and_then(|_| chain.try_for_each(|c| ext::ssl_add_chain_cert(ssl, c)));
        if let Err(e) = used {
            tracing::error!(event = "tls_handshake", error = %e, "cannot use the certificate");
        }
    }
}

/// Settings for one TLS listener: SNI selection, ALPN h2 + http/1.1, minimum version.
pub fn listener_settings(
    shared: &Arc<Shared>,
    min_version: MinVersion,
) -> pingora::Result<TlsSettings> {
    let mut settings = TlsSettings::with_callbacks(Box::new(SniCallback {
        shared: Arc::clone(shared),
    }))?;
    settings.enable_h2();
    settings
        .set_min_proto_version(Some(min_version.ssl_version()))
        .map_err(|e| {
            pingora::Error::because(
                pingora::ErrorType::InternalError,
                "cannot set tls.min_version",
                e,
            )
        })?;
    Ok(settings)
}
