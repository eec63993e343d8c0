//! Making a [`LockClient`]: [`LockClient::connect`], [`LockClient::builder`] and
//! [`LockClientBuilder`], [`LockClient::from_fred`], and the fred settings lock safety relies on.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use fred::clients::Client;
use fred::error::Error;
use fred::interfaces::ClientLike;
use fred::types::config::{Config, ReconnectPolicy};

use crate::client::LockClient;
use crate::connection::Startup;
use crate::error::LockError;
use crate::tls;
use crate::topology::Deployment;
use crate::url::{describe, parse_url, redact};

mod checks;
mod fred_settings;
mod refused;
mod sentinel_probe;

use checks::check_limits;
use fred_settings::{AbortOnDrop, build_fred, first_connection};

/// Default size of the dedicated connection pool; change it with
/// [`LockClientBuilder::max_connections`] (as [`LockClientBuilder`]'s example does).
pub const DEFAULT_MAX_CONNECTIONS: usize = 16;
/// Default time allowed for the initial connection; change it with
/// [`LockClientBuilder::connect_timeout`]. The handshake's commands are also bounded by the
/// command timeout (5 s by default), so a server that accepts the connection but never answers
/// fails after the shorter of the two.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default most leases renewed by one script call; change it with
/// [`LockClientBuilder::renewal_batch_limit`].
pub const DEFAULT_RENEWAL_BATCH_LIMIT: usize = 256;

impl LockClient {
    /// Connects to the deployment `url` names (fred's URL syntax):
    ///
    /// - `redis://[user:pw@]host:port[/db]` (or `valkey://`, `rediss://` for TLS): standalone
    /// - `redis-sentinel://host:26379[/db]?sentinelServiceName=NAME&node=host2:26380`: primary
    ///   and replicas found through Sentinel
    /// - `redis-cluster://host:port?node=host2:port2`: cluster
    ///
    /// The query takes `node` (repeatable) and `sentinelServiceName` only; any other parameter
    /// is refused. The Sentinels get the URL's own user and password. Whitespace around the URL
    /// is ignored.
    ///
    /// For a primary with replicas but no Sentinel, use [`LockClient::builder`] and
    /// [`LockClientBuilder::replicated`].
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`] (argument `url`): a malformed URL; or the URL is a plain
    ///   one and the server is a replica, a cluster node or a Sentinel (found after asking it).
    /// - [`LockError::Backend`]: the server cannot be reached within
    ///   [`DEFAULT_CONNECT_TIMEOUT`], or accepts the connection but does not answer within the
    ///   command timeout (5 s, the shorter bound; a `rediss://` URL at a plaintext port waits
    ///   for its TLS handshake, so the connect timeout); wrong credentials; a database the
    ///   server does not have; a call outside a Tokio runtime.
    pub async fn connect(url: &str) -> Result<LockClient, LockError> {
        LockClient::builder().url(url).connect().await
    }

    /// A builder for fred settings, deployment shape and pool size.
    #[must_use]
    pub fn builder() -> LockClientBuilder {
        LockClientBuilder::default()
    }

    /// A lock client for the deployment an existing fred client is configured for.
    ///
    /// Taken from `client`: its server configuration (servers, credentials, TLS, database,
    /// Sentinel or cluster settings, protocol: RESP2 or RESP3, blocking policy), its other
    /// connection settings (TCP options, ...) and its performance settings. Every connection the
    /// lock client opens (shared, subscriber, dedicated) uses them; a database other than 0
    /// holds the lock keys, and release notifications reach waiters whatever the database.
    /// Enforced whatever `client` says, because lock safety relies on them: fred never re-sends
    /// a command (`max_command_attempts = 1`; a replayed `WAIT` would fake an acknowledgement)
    /// nor follows a cluster redirection (`max_redirections = 0`: the lock layer re-runs a
    /// redirected script with its checks on the right node), it reconnects forever (20 ms
    /// doubling to 1 s), also after `READONLY` and `MASTERDOWN` replies, a first connection
    /// fails fast (`fail_fast = true`: a refused connection, wrong credentials or a missing
    /// database is reported at once with its cause, not retried until the connect timeout),
    /// connections are not named (`auto_client_setname = false`: the README's ACL rule does not
    /// grant `CLIENT SETNAME`), connecting may take 10 s (its handshake's commands 5 s) and
    /// commands time out after 5 s. The lock client
    /// opens connections of its own (`client` is left untouched) and closes them when its last
    /// clone is dropped. The deployment is read from the configuration; to declare a plain
    /// server replicated, use `LockClient::builder().fred_client(&client).replicated(true)`.
    ///
    /// A node that cannot hold locks through `client`'s configuration (a cluster node in a
    /// plain, single-server configuration; a Sentinel; a replica given directly) makes every
    /// lock and operator call fail with [`LockError::InvalidArgument`] naming the configuration
    /// to use, as [`LockClient::connect`] refuses such a URL; the node is asked (`INFO`) on the
    /// first call, then remembered. While the server does not answer, the first call waits up
    /// to 1 s for that answer on top of its own bounds; later calls are not held up by the
    /// check until the connection is up again.
    ///
    /// Needs no Tokio runtime. Called inside one, it starts connecting at once, in the
    /// background; called outside one (in a plain `fn main` before `block_on`, in a `LazyLock`
    /// initializer), it connects on the client's first use inside a runtime: the first lock or
    /// operator call (or [`LockClient::fred`]) starts the connection and waits for it, within
    /// its own deadline.
    #[must_use]
    pub fn from_fred(client: Client) -> LockClient {
        let deployment = Deployment::of(&client.client_config().server);
        let settings = LockClientBuilder::default();
        let rebuilt = build_fred(
            client.client_config(),
            client.connection_config().clone(),
            client.perf_config(),
            settings.connect_timeout,
            settings.command_timeout,
            &settings.reconnect,
        );
        let Ok(fred) = rebuilt else {
            tracing::warn!("could not rebuild the fred client; using it as configured");
            return LockClient::from_parts(
                client,
                Startup::Started(None),
                deployment,
                DEFAULT_MAX_CONNECTIONS,
                settings.command_timeout,
                settings.renewal_batch_limit,
                false,
            );
        };
        // The rebuilt client is new and unconnected, whether or not `client` was connected.
        let startup = match tokio::runtime::Handle::try_current() {
            Ok(_) => Startup::Started(Some(fred.connect())),
            Err(_) => Startup::OnFirstUse,
        };
        LockClient::from_parts(
            fred,
            startup,
            deployment,
            DEFAULT_MAX_CONNECTIONS,
            settings.command_timeout,
            settings.renewal_batch_limit,
            false,
        )
    }
}

/// Builds a [`LockClient`]: where to connect, the deployment's shape, and connection settings.
///
/// ```no_run
/// # async fn demo() -> Result<(), sage_lock::LockError> {
/// use std::time::Duration;
/// use sage_lock::LockClient;
///
/// let client = LockClient::builder()
///     .url("redis://10.0.0.5:6379")
///     .replicated(true)                  // a primary with replicas, no Sentinel
///     .max_connections(32)               // dedicated connections for WAIT
///     .command_timeout(Duration::from_secs(2))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
pub struct LockClientBuilder {
    config: Result<Config, LockError>,
    replicated: Option<bool>,
    max_connections: usize,
    command_timeout: Duration,
    connect_timeout: Duration,
    reconnect: ReconnectPolicy,
    renewal_batch_limit: usize,
    /// CA certificates and client certificate from `tls_ca_*` / `tls_client_cert_*`.
    tls: tls::TlsSettings,
    /// The redacted URL when `url` named a plaintext scheme (TLS settings then contradict it).
    plaintext_url: Option<String>,
}

/// Shows where the builder connects, never credentials (fred's `Config` prints its password).
impl fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match &self.config {
            Ok(config) => describe(config),
            Err(error) => format!("invalid: {error}"),
        };
        let has_password = self
            .config
            .as_ref()
            .is_ok_and(|config| config.password.is_some());
        f.debug_struct("LockClientBuilder")
            .field("target", &target)
            .field(
                "password",
                &if has_password { "<redacted>" } else { "none" },
            )
            .field("replicated", &self.replicated)
            .field("max_connections", &self.max_connections)
            .field("command_timeout", &self.command_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("renewal_batch_limit", &self.renewal_batch_limit)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl Default for LockClientBuilder {
    fn default() -> Self {
        LockClientBuilder {
            config: Ok(Config::default()),
            replicated: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            command_timeout: Duration::from_secs(5),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            reconnect: ReconnectPolicy::new_exponential(0, 20, 1_000, 2),
            renewal_batch_limit: DEFAULT_RENEWAL_BATCH_LIMIT,
            tls: tls::TlsSettings::default(),
            plaintext_url: None,
        }
    }
}

impl LockClientBuilder {
    /// The server URL (see [`LockClient::connect`] for the schemes).
    #[must_use]
    pub fn url(mut self, url: &str) -> Self {
        self.config = parse_url(url);
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        self.plaintext_url = (!tls::scheme_uses_tls(scheme)).then(|| redact(url));
        self
    }

    /// A complete fred configuration instead of a URL (its `tls` field included, and its
    /// protocol: `version: RespVersion::RESP3` for RESP3), with the overrides
    /// [`LockClient::from_fred`] lists.
    #[must_use]
    pub fn config(mut self, config: Config) -> Self {
        self.config = Ok(config);
        self.plaintext_url = None;
        self
    }

    /// Verifies the server's TLS certificate against the CA certificates in `pem` (one or more
    /// `-----BEGIN CERTIFICATE-----` blocks), and only against them: use it for servers whose
    /// certificates a private CA signed. Needs a TLS URL (`rediss://`, `rediss-sentinel://`,
    /// `rediss-cluster://`) or a [`config`](LockClientBuilder::config); without it, `rediss://`
    /// trusts the system's CA certificates. The server's certificate must name the URL's host
    /// (DNS name or IP address) in its subject alternative names.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let ca = std::fs::read("/etc/redis/ca.crt")?; // or tls_ca_file
    /// let client = sage_lock::LockClient::builder()
    ///     .url("rediss://redis.internal:6380")
    ///     .tls_ca_pem(ca)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Bad input (no certificate in `pem`, invalid PEM or DER) makes
    /// [`connect`](LockClientBuilder::connect) fail with [`LockError::InvalidArgument`]
    /// (argument `tls_ca`); so does a plaintext `redis://` URL.
    #[must_use]
    pub fn tls_ca_pem(mut self, pem: impl AsRef<[u8]>) -> Self {
        self.tls
            .set_ca_pem(pem.as_ref(), "the PEM given to tls_ca_pem");
        self
    }

    /// [`tls_ca_pem`](LockClientBuilder::tls_ca_pem) with the PEM read from the file at `path`
    /// (an unreadable file is a [`LockError::InvalidArgument`] at connect).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), sage_lock::LockError> {
    /// let client = sage_lock::LockClient::builder()
    ///     .url("rediss://10.0.0.5:6380")
    ///     .tls_ca_file("/etc/redis/ca.crt")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn tls_ca_file(mut self, path: impl AsRef<Path>) -> Self {
        self.tls.set_ca_file(path.as_ref());
        self
    }

    /// Presents a client certificate (for servers with `tls-auth-clients yes`, Redis' default
    /// once TLS is on): `cert_pem` is the certificate chain (leaf first), `key_pem` its private
    /// key (PKCS#8, SEC1 or PKCS#1 PEM). Needs a TLS URL like
    /// [`tls_ca_pem`](LockClientBuilder::tls_ca_pem); the server is verified against the CAs
    /// given there, else the system's. The key never appears in any output.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let cert = std::fs::read("/etc/app/redis-client.crt")?;
    /// let key = std::fs::read("/etc/app/redis-client.key")?;
    /// let client = sage_lock::LockClient::builder()
    ///     .url("rediss://10.0.0.5:6380")
    ///     .tls_ca_file("/etc/redis/ca.crt")
    ///     .tls_client_cert_pem(cert, key)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Unusable input (no certificate, no or a mismatched private key) makes
    /// [`connect`](LockClientBuilder::connect) fail with [`LockError::InvalidArgument`]
    /// (argument `tls_client_cert`); a plaintext `redis://` URL with it, with argument `tls_ca`.
    #[must_use]
    pub fn tls_client_cert_pem(
        mut self,
        cert_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Self {
        self.tls.set_client_pem(
            cert_pem.as_ref(),
            key_pem.as_ref(),
            "the PEM given to tls_client_cert_pem",
        );
        self
    }

    /// [`tls_client_cert_pem`](LockClientBuilder::tls_client_cert_pem) with the certificate
    /// chain and the private key read from the files at `cert` and `key`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), sage_lock::LockError> {
    /// let client = sage_lock::LockClient::builder()
    ///     .url("rediss://10.0.0.5:6380")
    ///     .tls_ca_file("/etc/redis/ca.crt")
    ///     .tls_client_cert_file("/etc/app/redis-client.crt", "/etc/app/redis-client.key")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn tls_client_cert_file(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Self {
        self.tls.set_client_files(cert.as_ref(), key.as_ref());
        self
    }

    /// The server configuration of an existing fred client (servers, credentials, TLS,
    /// database, protocol), with this builder's connection settings and the overrides
    /// [`LockClient::from_fred`] lists. The lock client opens connections of
    /// its own; `client` is left untouched. Use it to declare a caller's plain client
    /// [`replicated`](LockClientBuilder::replicated).
    #[must_use]
    pub fn fred_client(self, client: &Client) -> Self {
        self.config(client.client_config())
    }

    /// Declares that a plain `redis://` server is the primary of a replicated deployment, so
    /// lock operations check `ROLE` and wait for replicas (default: off for a plain URL).
    /// Sentinel and cluster URLs are replicated already: `replicated(false)` has no effect on
    /// them (turn acknowledgement off per family with
    /// [`LockOptions::replica_acknowledgement`](crate::LockOptions::replica_acknowledgement)).
    #[must_use]
    pub fn replicated(mut self, replicated: bool) -> Self {
        self.replicated = Some(replicated);
        self
    }

    /// Size of the dedicated connection pool used for `WAIT` (default 16, at least 1;
    /// `usize::MAX` for, in effect, no limit: values above Tokio's semaphore limit, about
    /// 2.3 × 10¹⁸, count as that limit). Callers wait for a free connection in turn,
    /// except renewals, which go ahead of queued acquisitions.
    #[must_use]
    pub fn max_connections(mut self, max_connections: usize) -> Self {
        self.max_connections = max_connections;
        self
    }

    /// Longest time one command may take before it counts as a (transient) failure (default 5 s;
    /// at least 1 ms).
    #[must_use]
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Longest time the initial connection may take (default 10 s; at least 1 ms). The
    /// handshake's commands are bounded by [`command_timeout`](LockClientBuilder::command_timeout)
    /// too: a server that accepts the connection but never answers fails after the shorter of
    /// the two, so raising this past the command timeout needs a longer command timeout too.
    /// A cluster client, which connects to every primary the cluster lists, tries again within
    /// this time while a primary refuses the connection (down, not failed over yet) or the
    /// cluster's state is not ok, as long as one of the URL's addresses accepts connections; so
    /// does a client through Sentinel while the primary the Sentinels name refuses it.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How fred reconnects after a connection loss (default: forever, 20 ms doubling to 1 s).
    #[must_use]
    pub fn reconnect_policy(mut self, policy: ReconnectPolicy) -> Self {
        self.reconnect = policy;
        self
    }

    /// Most leases one renewal script call renews (default
    /// [`DEFAULT_RENEWAL_BATCH_LIMIT`], at least 1).
    ///
    /// The client renews every lease due at about the same time together, one call per server
    /// (per node on a cluster), split into calls of at most this many leases. A call holds the
    /// single-threaded server for about 4 µs per lease (measured on Redis 7 and Valkey 9), so
    /// the default bounds each call's stall of other clients to about 1 ms. Raise it to renew
    /// thousands of locks in one call per node and tick, when the server can absorb a longer
    /// stall (10,000 leases: about 40 ms).
    #[must_use]
    pub fn renewal_batch_limit(mut self, leases: usize) -> Self {
        self.renewal_batch_limit = leases;
        self
    }

    /// Connects and returns the client. Without [`url`](LockClientBuilder::url),
    /// [`config`](LockClientBuilder::config) or
    /// [`fred_client`](LockClientBuilder::fred_client), it connects to fred's default,
    /// `redis://127.0.0.1:6379`.
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`]: a bad URL or setting (the argument names it), TLS
    ///   settings with a plaintext URL (argument `tls_ca`), or a replica, cluster node or
    ///   Sentinel behind a plain URL (argument `url`, found after asking the server).
    /// - [`LockError::Backend`]: as for [`LockClient::connect`]: the server cannot be reached
    ///   within the connect timeout, or does not answer the handshake within the shorter of
    ///   the connect and command timeouts; wrong credentials; a missing database; a call
    ///   outside a Tokio runtime.
    pub async fn connect(mut self) -> Result<LockClient, LockError> {
        let mut config = std::mem::replace(&mut self.config, Ok(Config::default()))?;
        let tls = std::mem::take(&mut self.tls);
        if let (true, Some(url)) = (tls.is_set(), &self.plaintext_url) {
            return Err(LockError::invalid(
                "tls_ca",
                format!(
                    "TLS settings were given but {url} is a plaintext URL; use rediss:// (or \
                     rediss-sentinel://, rediss-cluster://) to connect with TLS"
                ),
            ));
        }
        if let Some(tls) = tls.build()? {
            config.tls = Some(tls);
        }
        check_limits(
            self.max_connections,
            self.renewal_batch_limit,
            self.command_timeout,
            self.connect_timeout,
        )?;
        let mut deployment = Deployment::of(&config.server);
        if deployment == Deployment::Standalone && self.replicated == Some(true) {
            deployment = Deployment::Replicated;
        }
        let target = describe(&config);
        crate::runtime::ensure()
            .map_err(|e| LockError::backend(format!("could not connect to {target}"), e))?;
        let uses_tls = config.tls.is_some();
        let connect_deadline = tokio::time::Instant::now() + self.connect_timeout;
        // Through Sentinel, fred starts with the Sentinel that answered first (see there).
        let probe = self.connect_timeout.min(self.command_timeout) / 2;
        crate::sentinel::answering_sentinel_first(&mut config, tokio::time::Instant::now() + probe)
            .await;
        let mut warned = false;
        let (fred, task) = loop {
            let fred = build_fred(
                config.clone(),
                fred::types::config::ConnectionConfig::default(),
                fred::types::config::PerformanceConfig::default(),
                self.connect_timeout,
                self.command_timeout,
                &self.reconnect,
            )
            .map_err(|e| {
                LockError::backend(format!("could not configure a client for {target}"), e)
            })?;
            // Aborted if this future is dropped before the client is made (the caller gave
            // up): its connection closes then, not at the end of its handshake's timeout.
            let mut task = AbortOnDrop(None);
            let handle = task.0.insert(fred.connect());
            let error =
                match tokio::time::timeout_at(connect_deadline, first_connection(&fred, handle))
                    .await
                {
                    Ok(Ok(())) => break (fred, task),
                    Ok(Err(error)) => error,
                    Err(_) => Error::new(
                        fred::error::ErrorKind::Timeout,
                        format!("no connection within {:?}", self.connect_timeout),
                    ),
                };
            // The task, ended or still in its handshake, is aborted here (a `quit` would wait
            // for the handshake, bounded only by the command timeout, and log a warning if it
            // ended).
            drop(task);
            if let Some(why) = refused::not_whole_yet(&error, &config, connect_deadline).await {
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!(
                        "connecting to {target}: {why}; trying again until the connect \
                         timeout, while the URL's addresses accept connections: {error}"
                    );
                }
                tokio::time::sleep(refused::RETRY_AFTER).await;
                continue;
            }
            return Err(
                refused::connect_error(error, &target, &config, deployment, uses_tls).await,
            );
        };
        let mut delifeq = None;
        if deployment != Deployment::Cluster
            && let Ok(report) = crate::connection::wrong_node_problem(
                &fred,
                &target,
                deployment.is_replicated(),
                self.command_timeout,
            )
            .await
        {
            if let Some(problem) = report.problem {
                let _ = tokio::time::timeout(Duration::from_secs(1), fred.quit()).await;
                drop(task);
                return Err(LockError::invalid("url", problem));
            }
            delifeq = report.delifeq;
        }
        let client = LockClient::from_parts(
            fred,
            Startup::Started(task.keep()),
            deployment,
            self.max_connections,
            self.command_timeout,
            self.renewal_batch_limit,
            true,
        );
        if let Some(present) = delifeq {
            // Read with the node check: the first releases need not ask.
            client.inner.conn.learn_delifeq(present);
        }
        Ok(client)
    }
}
