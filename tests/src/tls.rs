//! Test certificates, made at test time with the `openssl` command-line tool: a certificate
//! authority and server certificates it signs, all in a server's temp dir.
//!
//! Keys are ECDSA P-256 (fast to generate, accepted by Redis' OpenSSL and by rustls); every
//! certificate is valid for two days.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The `subjectAltName` of the certificates [`ServerCerts::generate`] makes: the loopback
/// address only, so `rediss://127.0.0.1:PORT` verifies and `rediss://localhost:PORT` does not.
pub const SERVER_SAN: &str = "IP:127.0.0.1";

/// A certificate authority: `<name>.crt` (PEM) and its key `<name>.key` in a directory.
#[derive(Clone, Debug)]
pub struct Authority {
    /// The CA certificate (PEM), what a client trusts.
    pub cert: PathBuf,
    key: PathBuf,
}

impl Authority {
    /// A new self-signed CA named `name` (common name `sage-lock test CA <name>`) in `dir`.
    ///
    /// # Panics
    /// When `openssl` is missing or fails (the message includes its output).
    pub fn generate(dir: &Path, name: &str) -> Authority {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        openssl(&[
            "req",
            "-x509",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN=sage-lock test CA {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            path_str(&key),
            "-out",
            path_str(&cert),
        ]);
        Authority { cert, key }
    }

    /// The CA certificate's PEM text.
    pub fn pem(&self) -> Vec<u8> {
        fs::read(&self.cert).unwrap_or_else(|e| panic!("reading {}: {e}", self.cert.display()))
    }

    /// A server certificate for `san` (e.g. `IP:127.0.0.1` or `DNS:localhost`) signed by this
    /// CA: `<name>.crt` and `<name>.key` in `dir`. Returns (certificate, key).
    pub fn issue(&self, dir: &Path, name: &str, san: &str) -> (PathBuf, PathBuf) {
        self.issue_with(dir, name, san, Issue::Valid)
    }

    /// [`Authority::issue`], of the kind `issue` says: valid, expired, or an X.509 v1
    /// certificate (no extensions, so no subject alternative name either).
    pub fn issue_with(
        &self,
        dir: &Path,
        name: &str,
        san: &str,
        issue: Issue,
    ) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        let csr = dir.join(format!("{name}.csr"));
        let ext = dir.join(format!("{name}.ext"));
        openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            path_str(&key),
            "-out",
            path_str(&csr),
        ]);
        let extensions = format!(
            "subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n"
        );
        fs::write(&ext, extensions).unwrap_or_else(|e| panic!("writing {}: {e}", ext.display()));
        let days = if issue == Issue::Expired { "-1" } else { "2" };
        let mut args = vec![
            "x509",
            "-req",
            "-in",
            path_str(&csr),
            "-CA",
            path_str(&self.cert),
            "-CAkey",
            path_str(&self.key),
            "-CAcreateserial",
            "-days",
            days,
            "-out",
            path_str(&cert),
        ];
        if issue != Issue::Version1 {
            args.extend(["-extfile", path_str(&ext)]);
        }
        openssl(&args);
        (cert, key)
    }
}

/// The kind of certificate [`Authority::issue_with`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Issue {
    /// Valid for two days, X.509 v3 with the subject alternative name.
    Valid,
    /// Like `Valid`, but its validity ended a day ago.
    Expired,
    /// X.509 v1: no extensions.
    Version1,
}

/// What a TLS server needs: its CA and a certificate for [`SERVER_SAN`]; plus a client
/// certificate the same CA signed, for servers with `tls-auth-clients yes`.
#[derive(Clone, Debug)]
pub struct ServerCerts {
    pub ca: Authority,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl ServerCerts {
    /// A CA (`ca.crt`), a server certificate for [`SERVER_SAN`] (`server.crt`, `server.key`)
    /// and a client certificate (`client.crt`, `client.key`) in `dir`.
    pub fn generate(dir: &Path) -> ServerCerts {
        ServerCerts::generate_with(dir, Issue::Valid)
    }

    /// [`ServerCerts::generate`], with a server certificate of kind `issue`.
    pub fn generate_with(dir: &Path, issue: Issue) -> ServerCerts {
        let ca = Authority::generate(dir, "ca");
        let (cert, key) = ca.issue_with(dir, "server", SERVER_SAN, issue);
        let (client_cert, client_key) = ca.issue(dir, "client", "DNS:sage-lock-test-client");
        ServerCerts {
            ca,
            cert,
            key,
            client_cert,
            client_key,
        }
    }

    /// Config lines for a TLS-only server; with `auth_clients`, clients must present a
    /// certificate the CA signed (`tls-auth-clients yes`), else none is asked for.
    pub fn conf_lines(&self, auth_clients: bool) -> Vec<String> {
        vec![
            format!("tls-cert-file {}", self.cert.display()),
            format!("tls-key-file {}", self.key.display()),
            format!("tls-ca-cert-file {}", self.ca.cert.display()),
            format!(
                "tls-auth-clients {}",
                if auth_clients { "yes" } else { "no" }
            ),
        ]
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str()
        .unwrap_or_else(|| panic!("{} is not UTF-8", path.display()))
}

/// Runs `openssl args...`, panicking with its output when it fails.
fn openssl(args: &[&str]) {
    let output = Command::new("openssl").args(args).output();
    match output {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "openssl {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "running openssl: {e}; install it (`apt-get install openssl`, or run `bash \
             scripts/setup.sh`)"
        ),
    }
}
