//! TLS: servers verified against CA certificates the caller supplies (rustls with the `ring`
//! provider), and connect failures that say what went wrong with the handshake.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use fred::error::Error;
use fred::types::config::{TlsConfig, TlsConnector};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
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

/// The TLS settings a builder collects: the CAs to trust (else the system's) and a client
/// certificate; each is checked when set, its error reported at connect.
#[derive(Default)]
pub(crate) struct TlsSettings {
    roots: Option<Result<RootCertStore, LockError>>,
    identity: Option<Result<Identity, LockError>>,
}

/// A client certificate chain and its private key.
struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

/// Which settings are present, never their contents (the private key stays out of output).
impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("ca", &self.roots.as_ref().map(|roots| roots.is_ok()))
            .field(
                "client_cert",
                &self.identity.as_ref().map(|identity| identity.is_ok()),
            )
            .finish()
    }
}

impl TlsSettings {
    /// Whether any TLS setting was given.
    pub(crate) fn is_set(&self) -> bool {
        self.roots.is_some() || self.identity.is_some()
    }

    /// Trust exactly the CA certificates in `pem`; `source` names it in errors.
    pub(crate) fn set_ca_pem(&mut self, pem: &[u8], source: &str) {
        self.roots = Some(roots_from_pem(pem, source));
    }

    /// [`TlsSettings::set_ca_pem`] with the file at `path`.
    pub(crate) fn set_ca_file(&mut self, path: &Path) {
        self.roots = Some(
            read(path, "tls_ca", "CA certificate")
                .and_then(|pem| roots_from_pem(&pem, &path.display().to_string())),
        );
    }

    /// Present the certificate chain `cert_pem` with the private key `key_pem`.
    pub(crate) fn set_client_pem(&mut self, cert_pem: &[u8], key_pem: &[u8], source: &str) {
        self.identity = Some(identity_from_pem(cert_pem, key_pem, source));
    }

    /// [`TlsSettings::set_client_pem`] with the files at `cert` and `key`.
    pub(crate) fn set_client_files(&mut self, cert: &Path, key: &Path) {
        let identity = read(cert, "tls_client_cert", "client certificate").and_then(|cert_pem| {
            let key_pem = read(key, "tls_client_cert", "client private key")?;
            identity_from_pem(
                &cert_pem,
                &key_pem,
                &format!("{} / {}", cert.display(), key.display()),
            )
        });
        self.identity = Some(identity);
    }

    /// The fred TLS configuration, `None` when nothing was set.
    pub(crate) fn build(self) -> Result<Option<TlsConfig>, LockError> {
        if !self.is_set() {
            return Ok(None);
        }
        let roots = match self.roots {
            Some(roots) => roots?,
            None => system_roots()?,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| {
                LockError::invalid("tls_ca", format!("no TLS protocol version available: {e}"))
            })?
            .with_root_certificates(roots);
        let config = match self.identity {
            None => builder.with_no_client_auth(),
            Some(identity) => {
                let Identity { chain, key } = identity?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    let text = format!("{e:?}");
                    let problem = if text.contains("UnsupportedCertVersion") {
                        "the client certificate is an X.509 v1 certificate, which rustls \
                         refuses: reissue it as v3 (with `openssl x509 -req`, give extensions \
                         with -extfile)"
                    } else if text.contains("KeyMismatch") {
                        "the private key does not belong to the certificate: pass the key the \
                         certificate was issued for"
                    } else {
                        "the client certificate and key cannot be used together"
                    };
                    LockError::invalid("tls_client_cert", format!("{problem} ({e})"))
                })?
            }
        };
        Ok(Some(TlsConnector::from(config).into()))
    }
}

fn read(path: &Path, argument: &'static str, what: &str) -> Result<Vec<u8>, LockError> {
    std::fs::read(path).map_err(|e| {
        LockError::invalid(
            argument,
            format!("cannot read the {what} file {}: {e}", path.display()),
        )
    })
}

/// The CA certificates in `pem` (one or more `-----BEGIN CERTIFICATE-----` blocks; other
/// blocks are ignored).
fn roots_from_pem(pem: &[u8], source: &str) -> Result<RootCertStore, LockError> {
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
    Ok(roots)
}

fn identity_from_pem(cert_pem: &[u8], key_pem: &[u8], source: &str) -> Result<Identity, LockError> {
    let invalid = |message: String| LockError::invalid("tls_client_cert", message);
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            invalid(format!(
                "the client certificate of {source} is not valid PEM ({e})"
            ))
        })?;
    if chain.is_empty() {
        return Err(invalid(format!(
            "the client certificate of {source} holds no -----BEGIN CERTIFICATE----- block"
        )));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
        invalid(format!(
            "the private key of {source} is not a PEM private key ({e}); expected a \
             -----BEGIN PRIVATE KEY----- (or EC / RSA PRIVATE KEY) block"
        ))
    })?;
    Ok(Identity { chain, key })
}

/// The system's CA certificates (for a client certificate without `tls_ca_*`).
fn system_roots() -> Result<RootCertStore, LockError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        return Err(LockError::invalid(
            "tls_ca",
            format!(
                "no system CA certificates could be loaded ({:?}); pass the CA that signed the \
                 server's certificate with tls_ca_file or tls_ca_pem",
                found.errors.first()
            ),
        ));
    }
    Ok(roots)
}

/// What to tell the user about a failed first connection, given whether it used TLS.
pub(crate) fn connect_hint(error: &Error, tls: bool) -> &'static str {
    let details = error.details();
    let mentions = |words: &[&str]| words.iter().any(|word| details.contains(word));
    if mentions(&["NOAUTH"]) {
        "the server requires a password, and none was given: add it to the URL, \
         redis://:PASSWORD@host:port or redis://USER:PASSWORD@host:port (percent-encode \
         characters such as @ : / in it), or set it in the fred Config"
    } else if mentions(&["WRONGPASS", "invalid password", "invalid username-password"]) {
        "the server refused the credentials: check the user name and password in the URL (or \
         the fred Config; a URL with a user name and no password authenticates with an empty \
         one)"
    } else if mentions(&["CertificateRequired"]) {
        "the server requires a client certificate (tls-auth-clients yes): pass one its CA \
         signed with LockClientBuilder::tls_client_cert_file or tls_client_cert_pem"
    } else if mentions(&[
        "AlertReceived(UnknownCA)",
        "AlertReceived(BadCertificate)",
        "AlertReceived(CertificateUnknown)",
        "AlertReceived(DecryptError)",
    ]) {
        "the server rejected the client certificate: it must be signed by a CA in the \
         server's tls-ca-cert-file (see tls_client_cert_file)"
    } else if mentions(&["Expired", "NotValidYet"]) {
        "TLS certificate verification failed: the server's certificate has expired, or is not \
         valid yet: renew it (or check this machine's clock)"
    } else if mentions(&["UnsupportedCertVersion"]) {
        "TLS certificate verification failed: the server's certificate is an X.509 v1 \
         certificate, which rustls refuses: reissue it as v3 (with `openssl x509 -req`, give \
         extensions with -extfile, including the subject alternative names)"
    } else if mentions(&["NotValidForName", "NotValidForNameContext"]) {
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
    } else if mentions(&["Connection refused", "os error 111"]) {
        "nothing accepts connections there: is the server running, and are the host and port \
         right?"
    } else if !tls && mentions(&["Decode Error", "Invalid frame type"]) {
        "something answers there, but it does not answer in the Redis protocol: check the \
         port (another service may listen on it); if the server only accepts TLS there \
         (tls-port), connect with rediss://"
    } else if mentions(&[
        "Connection reset",
        "os error 104",
        "unexpected end of file",
        "UnexpectedEof",
        "Broken pipe",
        "os error 32",
    ]) {
        "the peer closed the connection at once: check the port (is a Redis or Valkey server \
         listening on it?); a server that only accepts TLS there (tls-port, connect with \
         rediss://) also does this"
    } else if mentions(&["max number of clients reached"]) {
        crate::retry::AT_MAXCLIENTS
    } else if tls {
        "is the server running, reachable, and accepting TLS on this port (tls-port)? A \
         plaintext port does not answer a TLS handshake (the connection times out): use \
         redis:// for one"
    } else {
        "is the server running and reachable? If it only accepts TLS (tls-port), connect with \
         rediss://"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(settings: TlsSettings) -> LockError {
        match settings.build() {
            Ok(_) => panic!("accepted bad TLS input"),
            Err(error) => error,
        }
    }

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
            let mut settings = TlsSettings::default();
            settings.set_ca_pem(pem, "ca.pem");
            let error = built(settings);
            let text = error.to_string();
            assert!(
                matches!(
                    error,
                    LockError::InvalidArgument {
                        argument: "tls_ca",
                        ..
                    }
                ) && text.contains(expected)
                    && text.contains("ca.pem"),
                "{text}"
            );
        }
        let mut settings = TlsSettings::default();
        settings.set_ca_file(Path::new("/nonexistent/ca.pem"));
        let text = built(settings).to_string();
        assert!(
            text.contains("cannot read the CA certificate file /nonexistent/ca.pem"),
            "{text}"
        );
        let mut settings = TlsSettings::default();
        settings.set_client_pem(b"no cert", b"no key", "test");
        let text = built(settings).to_string();
        assert!(
            text.contains("tls_client_cert") && text.contains("no -----BEGIN"),
            "{text}"
        );
        assert!(
            TlsSettings::default()
                .build()
                .is_ok_and(|tls| tls.is_none())
        );
    }

    #[test]
    fn tls_schemes() {
        assert!(scheme_uses_tls("rediss") && scheme_uses_tls("rediss-cluster"));
        assert!(scheme_uses_tls("VALKEYS") && !scheme_uses_tls("redis"));
        assert!(!scheme_uses_tls("redis-sentinel"));
    }

    /// A refused connection (nothing listens on the port: a server down, a primary killed in a
    /// failover) is no TLS matter: the hint does not suggest `rediss://`. A soak audit saw
    /// "Connection refused; ... If it only accepts TLS (tls-port), connect with rediss://" for a
    /// killed cluster primary.
    #[test]
    fn a_refused_connection_suggests_no_tls() {
        let refused = Error::new(
            fred::error::ErrorKind::IO,
            "Connection refused (os error 111)",
        );
        let hint = connect_hint(&refused, false);
        assert!(
            !hint.contains("rediss://") && hint.contains("running"),
            "{hint}"
        );
    }

    /// A `rediss://` URL on a plaintext port gets no answer to its handshake: the hint names
    /// `redis://` (it only asked whether the port accepts TLS).
    #[test]
    fn a_silent_tls_connection_suggests_a_plaintext_url() {
        let timeout = Error::new(fred::error::ErrorKind::Timeout, "Connection timed out.");
        let hint = connect_hint(&timeout, true);
        assert!(
            hint.contains("redis://") && hint.contains("tls-port"),
            "{hint}"
        );
        assert!(connect_hint(&timeout, false).contains("rediss://"));
    }
}
