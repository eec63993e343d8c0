//! TLS: servers verified against CA certificates the caller supplies (rustls with the `ring`
//! provider), and connect failures that say what went wrong with the handshake.

use std::sync::Arc;

use fred::error::Error;
use fred::types::config::{TlsConfig, TlsConnector};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, RootCertStore};

use crate::error::LockError;

/// URL schemes that connect with TLS.
pub(crate) fn scheme_uses_tls(scheme: &str) -> bool {
    let scheme = scheme.to_ascii_lowercase();
    scheme.starts_with("rediss") || scheme.starts_with("valkeys")
}

/// Makes rustls' process-wide default usable whatever crypto features the application's other
/// dependencies enable (with two providers compiled in, rustls would refuse to pick one): installs
/// `ring` unless a provider is installed already.
pub(crate) fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: some provider is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A TLS configuration that trusts exactly the CA certificates in `pem` (one or more
/// `-----BEGIN CERTIFICATE-----` blocks; other blocks are ignored). `source` names the input in
/// errors.
pub(crate) fn trusting_pem(pem: &[u8], source: &str) -> Result<TlsConfig, LockError> {
    let invalid = |message: String| LockError::invalid("tls_ca", message);
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| {
            invalid(format!(
                "{source} is not valid PEM ({e}); expected the CA certificate as \
                 -----BEGIN CERTIFICATE----- blocks"
            ))
        })?;
        roots.add(cert).map_err(|e| {
            invalid(format!(
                "{source} holds a certificate that cannot be used as a trust anchor ({e})"
            ))
        })?;
    }
    if roots.is_empty() {
        return Err(invalid(format!(
            "{source} holds no -----BEGIN CERTIFICATE----- block; pass the CA certificate that \
             signed the server's certificate, in PEM format"
        )));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("no TLS protocol version available: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(config).into())
}

/// [`trusting_pem`] on the contents of the file at `path`.
pub(crate) fn trusting_file(path: &std::path::Path) -> Result<TlsConfig, LockError> {
    let source = path.display().to_string();
    let pem = std::fs::read(path).map_err(|e| {
        LockError::invalid(
            "tls_ca",
            format!("cannot read the CA certificate file {source}: {e}"),
        )
    })?;
    trusting_pem(&pem, &source)
}

/// What to tell the user about a failed first connection, given whether it used TLS.
pub(crate) fn connect_hint(error: &Error, tls: bool) -> &'static str {
    let details = error.details();
    let mentions = |words: &[&str]| words.iter().any(|word| details.contains(word));
    if mentions(&["NotValidForName", "NotValidForNameContext"]) {
        "TLS certificate verification failed: the server's certificate does not name the host \
         in the URL; connect by a host name or IP address listed in the certificate's subject \
         alternative names"
    } else if mentions(&[
        "UnknownIssuer",
        "BadSignature",
        "InvalidCertificate",
        "certificate",
    ]) {
        "TLS certificate verification failed: the server's certificate is not signed by a \
         trusted CA; pass the CA that signed it with LockClientBuilder::tls_ca_file or \
         tls_ca_pem"
    } else if tls && mentions(&["InvalidContentType", "CorruptMessage", "received corrupt"]) {
        "the TLS handshake failed: does the server accept TLS on this port (tls-port)? Use \
         redis:// for a plaintext port"
    } else if tls {
        "is the server running, reachable, and accepting TLS on this port?"
    } else {
        "is the server running and reachable? If it only accepts TLS (tls-port), connect with \
         rediss://"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_ca_input_is_an_invalid_argument() {
        for (pem, expected) in [
            (&b"not a certificate"[..], "no -----BEGIN CERTIFICATE"),
            (
                &b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"[..],
                "trust anchor",
            ),
            (
                &b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n"[..],
                "not valid PEM",
            ),
        ] {
            let Err(error) = trusting_pem(pem, "ca.pem") else {
                panic!("accepted {pem:?}")
            };
            let text = error.to_string();
            assert!(
                matches!(error, LockError::InvalidArgument { .. }) && text.contains(expected),
                "{text}"
            );
            assert!(text.contains("ca.pem"), "{text}");
        }
        let Err(missing) = trusting_file(std::path::Path::new("/nonexistent/ca.pem")) else {
            panic!("read a missing file")
        };
        assert!(
            missing
                .to_string()
                .contains("cannot read the CA certificate file /nonexistent/ca.pem"),
            "{missing}"
        );
    }

    #[test]
    fn tls_schemes() {
        assert!(scheme_uses_tls("rediss") && scheme_uses_tls("rediss-cluster"));
        assert!(scheme_uses_tls("VALKEYS") && !scheme_uses_tls("redis"));
        assert!(!scheme_uses_tls("redis-sentinel"));
    }
}
