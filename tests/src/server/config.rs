//! What the harness starts: the config file lines and command-line arguments of one server.

use super::ServerKind;

/// What to start. The harness always writes a config file with loopback bind, no persistence,
/// fast replication (`repl-diskless-sync no`, `repl-diskless-load swapdb`, `rdb-del-sync-files yes`)
/// and `DEBUG` enabled; `conf` lines are appended to it.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub kind: ServerKind,
    /// Extra lines for the config file (e.g. `replicaof 127.0.0.1 1234`, `cluster-enabled yes`).
    /// Lines in the file survive [`Server::restart`](super::Server::restart) and `CONFIG REWRITE`.
    pub conf: Vec<String>,
    /// Extra command-line arguments, after `<conf> [--sentinel] --port P` (e.g. `--maxmemory 10mb`).
    pub args: Vec<String>,
    /// Start as a Sentinel (`<binary> <conf> --sentinel`).
    pub sentinel: bool,
    /// Pick a port whose cluster bus port (`port + 10000`) is free too.
    pub cluster_bus: bool,
    /// TLS only: `--port 0 --tls-port P` with certificates generated in the temp dir (see
    /// [`ServerConfig::tls`]).
    pub tls: bool,
    /// With [`ServerConfig::tls`]: clients must present a certificate (`tls-auth-clients yes`).
    pub tls_auth_clients: bool,
    /// With [`ServerConfig::tls`]: the kind of certificate the server presents.
    pub tls_issue: crate::tls::Issue,
}

impl ServerConfig {
    pub fn new(kind: ServerKind) -> ServerConfig {
        ServerConfig {
            kind,
            conf: Vec::new(),
            args: Vec::new(),
            sentinel: false,
            cluster_bus: false,
            tls: false,
            tls_auth_clients: false,
            tls_issue: crate::tls::Issue::Valid,
        }
    }

    pub fn conf_line(mut self, line: impl Into<String>) -> ServerConfig {
        self.conf.push(line.into());
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> ServerConfig {
        self.args.push(arg.into());
        self
    }

    pub fn sentinel(mut self) -> ServerConfig {
        self.sentinel = true;
        self
    }

    /// TLS only: no plaintext port (`--port 0`), `--tls-port P`, a CA and a server certificate
    /// for [`crate::tls::SERVER_SAN`] generated with `openssl` in the temp dir
    /// ([`Server::tls_certs`](super::Server::tls_certs)), `tls-auth-clients no`. The harness's plaintext admin commands
    /// ([`Server::cmd`](super::Server::cmd)) do not work on it: readiness is read from the log.
    pub fn tls(mut self) -> ServerConfig {
        self.tls = true;
        self
    }

    /// [`ServerConfig::tls`], presenting a certificate of kind `issue` (expired, X.509 v1).
    pub fn tls_presenting(mut self, issue: crate::tls::Issue) -> ServerConfig {
        self.tls = true;
        self.tls_issue = issue;
        self
    }

    /// [`ServerConfig::tls`] with `tls-auth-clients yes`: clients present
    /// [`crate::tls::ServerCerts::client_cert`].
    pub fn tls_mutual(mut self) -> ServerConfig {
        self.tls = true;
        self.tls_auth_clients = true;
        self
    }

    /// Cluster mode: `cluster-enabled yes`, `nodes.conf` in the temp dir, bus port kept free.
    pub fn cluster(mut self, node_timeout_ms: u64) -> ServerConfig {
        self.cluster_bus = true;
        self.conf.push("cluster-enabled yes".to_owned());
        self.conf.push("cluster-config-file nodes.conf".to_owned());
        self.conf
            .push(format!("cluster-node-timeout {node_timeout_ms}"));
        self
    }
}
