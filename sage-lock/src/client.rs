//! [`LockClient`]: the connection to Redis/Valkey that lock families are made from.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::error::Error;
use fred::interfaces::ClientLike;
use fred::types::Builder;
use fred::types::config::{Config, ReconnectPolicy};

use crate::connection::Connection;
use crate::engine::Engine;
use crate::error::LockError;
use crate::key::{KeyCodec, LockKeys};
use crate::observe::LockStats;
use crate::options::LockOptions;
use crate::pool::{DedicatedConnection, PoolError};
use crate::primitives::mutex::Locks;
use crate::primitives::rwlock::RwLocks;
use crate::primitives::semaphore::{Semaphores, validate_permits};
use crate::retry::deadline_after;
use crate::topology::Deployment;
use crate::url::{describe, parse_url};

/// Default size of the dedicated connection pool; change it with
/// [`LockClientBuilder::max_connections`] (see [`LockClientBuilder`]'s example).
pub const DEFAULT_MAX_CONNECTIONS: usize = 16;
/// Default time allowed for the initial connection; change it with
/// [`LockClientBuilder::connect_timeout`] (see [`LockClientBuilder`]'s example).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to a Redis or Valkey deployment, shared by all lock families made from it.
///
/// Cheap to clone (an `Arc`). Commands from all clones share one auto-pipelined connection per
/// server; replica-acknowledged operations (which block their connection with `WAIT`) use a
/// bounded pool of dedicated connections instead.
///
/// ```no_run
/// # async fn demo() -> Result<(), sage_lock::LockError> {
/// use sage_lock::LockClient;
///
/// let client = LockClient::connect("redis://127.0.0.1:6379").await?;
/// let locks = client.lock::<String>();
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<Engine>,
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("deployment", &self.inner.conn.deployment)
            .field("max_connections", &self.inner.conn.pool.max_connections())
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// Connects to the deployment `url` names (fred's URL syntax):
    ///
    /// - `redis://[user:pw@]host:port[/db]` (or `valkey://`, `rediss://` for TLS): standalone
    /// - `redis-sentinel://host:26379[/db]?sentinelServiceName=NAME&node=host2:26380`: primary
    ///   and replicas found through Sentinel
    /// - `redis-cluster://host:port?node=host2:port2`: cluster
    ///
    /// For a primary with replicas but no Sentinel, use [`LockClient::builder`] and
    /// [`LockClientBuilder::replicated`].
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a malformed URL, [`LockError::Backend`] when the server
    /// cannot be reached within [`DEFAULT_CONNECT_TIMEOUT`].
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
    /// Sentinel or cluster settings), its connection settings (connect timeout, TCP options, ...)
    /// and its performance settings. Enforced whatever `client` says, because lock safety relies
    /// on them: fred never re-sends a command (`max_command_attempts = 1`; a replayed `WAIT`
    /// would fake an acknowledgement), it reconnects forever (20 ms doubling to 1 s), also after
    /// `READONLY` and `MASTERDOWN` replies, and commands time out after 5 s. The lock client
    /// opens connections of its own (`client` is left untouched) and closes them when its last
    /// clone is dropped. The deployment is read from the configuration; to declare a plain
    /// server replicated, use `LockClient::builder().fred_client(&client).replicated(true)`.
    ///
    /// Call it inside a Tokio runtime: the connection starts at once, in the background.
    #[must_use]
    pub fn from_fred(client: Client) -> LockClient {
        let deployment = Deployment::of(&client.client_config().server);
        let settings = LockClientBuilder::default();
        let rebuilt = build_fred(
            client.client_config(),
            client.connection_config().clone(),
            client.perf_config(),
            &settings,
        );
        let Ok(fred) = rebuilt else {
            tracing::warn!("could not rebuild the fred client; using it as configured");
            return LockClient::from_parts(
                client,
                None,
                deployment,
                DEFAULT_MAX_CONNECTIONS,
                settings.command_timeout,
            );
        };
        let task = tokio::runtime::Handle::try_current()
            .ok()
            .map(|_| fred.connect());
        LockClient::from_parts(
            fred,
            task,
            deployment,
            DEFAULT_MAX_CONNECTIONS,
            settings.command_timeout,
        )
    }

    fn from_parts(
        fred: Client,
        task: Option<fred::types::ConnectHandle>,
        deployment: Deployment,
        max_connections: usize,
        command_timeout: Duration,
    ) -> LockClient {
        let conn = Connection::new(fred, task, deployment, max_connections, command_timeout);
        LockClient {
            inner: Arc::new(Engine::new(conn)),
        }
    }

    /// A lock family with the service-wide defaults (30 s lease, namespace `lock`, replica
    /// acknowledgement on, unless changed through [`crate::global::set_defaults`]).
    #[must_use]
    pub fn lock<K: ?Sized>(&self) -> Locks<K> {
        Locks::new(Arc::clone(&self.inner), LockOptions::new().resolve())
    }

    /// A lock family with explicit options; unset options take the service-wide defaults.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] when the lease is below 30 ms or the namespace is empty.
    pub fn lock_with<K: ?Sized>(&self, options: LockOptions) -> Result<Locks<K>, LockError> {
        let settings = options.resolve();
        settings.validate()?;
        Ok(Locks::new(Arc::clone(&self.inner), settings))
    }

    /// A family of read-write locks (many readers or one writer per key) with the service-wide
    /// default options.
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// use std::time::Duration;
    ///
    /// let rw = client.rw_lock::<str>();
    /// rw.read("config", Duration::from_secs(2), async { /* shared */ }).await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn rw_lock<K: ?Sized>(&self) -> RwLocks<K> {
        RwLocks::new(Arc::clone(&self.inner), LockOptions::new().resolve())
    }

    /// A family of read-write locks with explicit options; unset options take the service-wide
    /// defaults.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] when the lease is below 30 ms or the namespace is empty.
    pub fn rw_lock_with<K: ?Sized>(&self, options: LockOptions) -> Result<RwLocks<K>, LockError> {
        let settings = options.resolve();
        settings.validate()?;
        Ok(RwLocks::new(Arc::clone(&self.inner), settings))
    }

    /// A family of expirable semaphores with `permits` holders per key and the service-wide
    /// default options. With `permits == 0` every call of the family fails with
    /// [`LockError::InvalidArgument`]; [`LockClient::semaphore_with`] rejects it up front.
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// use std::time::Duration;
    ///
    /// let uploads = client.semaphore::<str>(3);
    /// uploads.acquire("s3", Duration::from_secs(5), async { /* at most 3 at once */ }).await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn semaphore<K: ?Sized>(&self, permits: u32) -> Semaphores<K> {
        Semaphores::new(
            Arc::clone(&self.inner),
            LockOptions::new().resolve(),
            permits,
        )
    }

    /// A family of expirable semaphores with `permits` holders per key and explicit options.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] when `permits` is 0, the lease is below 30 ms or the
    /// namespace is empty.
    pub fn semaphore_with<K: ?Sized>(
        &self,
        permits: u32,
        options: LockOptions,
    ) -> Result<Semaphores<K>, LockError> {
        validate_permits(permits)?;
        let settings = options.resolve();
        settings.validate()?;
        Ok(Semaphores::new(Arc::clone(&self.inner), settings, permits))
    }

    /// The deployment this client talks to.
    ///
    /// ```no_run
    /// # fn demo(client: sage_lock::LockClient) {
    /// if client.deployment().is_replicated() {
    ///     println!("acquisitions wait for replicas to acknowledge");
    /// }
    /// # }
    /// ```
    #[must_use]
    pub fn deployment(&self) -> Deployment {
        self.inner.conn.deployment
    }

    /// The underlying fred client (shared connection), for commands of your own.
    #[must_use]
    pub fn fred(&self) -> &Client {
        &self.inner.conn.fred
    }

    /// Counters of this client's lock activity.
    ///
    /// ```no_run
    /// # fn demo(client: sage_lock::LockClient) {
    /// let stats = client.stats();
    /// println!("{} acquired, {} timed out", stats.acquisitions, stats.timeouts);
    /// # }
    /// ```
    #[must_use]
    pub fn stats(&self) -> LockStats {
        self.inner.conn.stats.snapshot()
    }

    /// The server-side key that holds the lock on `key` in `namespace` (for inspection and tests).
    ///
    /// ```
    /// let server_key = sage_lock::LockClient::server_key("billing", "account:42");
    /// assert_eq!(server_key, b"{billing:account:42}");
    /// ```
    #[must_use]
    pub fn server_key<Q: KeyCodec + ?Sized>(namespace: &str, key: &Q) -> Vec<u8> {
        let mut encoded = Vec::new();
        key.encode_key(&mut encoded);
        LockKeys::new(namespace, &encoded).lock.to_vec()
    }

    /// Borrows a connection from the dedicated pool (shared with replica-acknowledged lock
    /// operations), waiting at most `timeout` for a free one.
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// use std::time::Duration;
    ///
    /// let connection = client.dedicated_connection(Duration::from_secs(1)).await?;
    /// // `connection` dereferences to a fred client: run blocking commands on it.
    /// drop(connection); // back to the pool
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Backend`] when no connection became free within `timeout`, or connecting
    /// failed.
    pub async fn dedicated_connection(
        &self,
        timeout: Duration,
    ) -> Result<DedicatedConnection, LockError> {
        let pool = &self.inner.conn.pool;
        match pool.take(deadline_after(timeout)).await {
            Ok(loan) => Ok(DedicatedConnection::new(loan, Arc::downgrade(pool))),
            Err(PoolError::Exhausted) => Err(LockError::backend(
                format!(
                    "all {} dedicated connections stayed busy for {timeout:?}; raise max_connections",
                    pool.max_connections()
                ),
                Error::new(fred::error::ErrorKind::Timeout, "dedicated pool exhausted"),
            )),
            Err(PoolError::Connect(error)) => Err(LockError::backend(
                "could not open a dedicated connection",
                error,
            )),
        }
    }

    /// Closes the shared, dedicated and subscriber connections. Locks still held expire with their lease.
    pub async fn quit(&self) {
        self.inner.conn.pool.close().await;
        self.inner.notifier.close().await;
        let _ = tokio::time::timeout(Duration::from_secs(1), self.inner.conn.fred.quit()).await;
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
        }
    }
}

impl LockClientBuilder {
    /// The server URL (see [`LockClient::connect`] for the schemes).
    #[must_use]
    pub fn url(mut self, url: &str) -> Self {
        self.config = parse_url(url);
        self
    }

    /// A complete fred configuration instead of a URL.
    #[must_use]
    pub fn config(mut self, config: Config) -> Self {
        self.config = Ok(config);
        self
    }

    /// The server configuration of an existing fred client (servers, credentials, TLS,
    /// database), with this builder's connection settings. The lock client opens connections of
    /// its own; `client` is left untouched. Use it to declare a caller's plain client
    /// [`replicated`](LockClientBuilder::replicated).
    #[must_use]
    pub fn fred_client(self, client: &Client) -> Self {
        self.config(client.client_config())
    }

    /// Declares that a plain `redis://` server is the primary of a replicated deployment, so
    /// lock operations check `ROLE` and wait for replicas. Sentinel and cluster URLs are
    /// replicated already.
    #[must_use]
    pub fn replicated(mut self, replicated: bool) -> Self {
        self.replicated = Some(replicated);
        self
    }

    /// Size of the dedicated connection pool used for `WAIT` (default 16, at least 1).
    #[must_use]
    pub fn max_connections(mut self, max_connections: usize) -> Self {
        self.max_connections = max_connections;
        self
    }

    /// Longest time one command may take before it counts as a (transient) failure (default 5 s).
    #[must_use]
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Longest time the initial connection may take (default 10 s).
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

    /// Connects and returns the client.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a bad URL or setting, [`LockError::Backend`] when the
    /// server cannot be reached in time.
    pub async fn connect(mut self) -> Result<LockClient, LockError> {
        let config = std::mem::replace(&mut self.config, Ok(Config::default()))?;
        if self.max_connections == 0 {
            return Err(LockError::invalid(
                "max_connections",
                "must be at least 1, got 0",
            ));
        }
        if self.command_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(LockError::invalid(
                "command_timeout",
                "timeouts must be positive, e.g. Duration::from_secs(5)",
            ));
        }
        let mut deployment = Deployment::of(&config.server);
        if deployment == Deployment::Standalone && self.replicated == Some(true) {
            deployment = Deployment::Replicated;
        }
        let target = describe(&config);
        let fred = build_fred(
            config,
            fred::types::config::ConnectionConfig::default(),
            fred::types::config::PerformanceConfig::default(),
            &self,
        )
        .map_err(|e| LockError::backend(format!("could not configure a client for {target}"), e))?;
        let connected = tokio::time::timeout(self.connect_timeout, fred.init()).await;
        let (failure, task) = match connected {
            Ok(Ok(task)) => (None, Some(task)),
            Ok(Err(error)) => (Some(error), None),
            Err(_) => (
                Some(Error::new(
                    fred::error::ErrorKind::Timeout,
                    format!("no connection within {:?}", self.connect_timeout),
                )),
                None,
            ),
        };
        if let Some(error) = failure {
            let _ = tokio::time::timeout(Duration::from_secs(1), fred.quit()).await;
            return Err(LockError::backend(
                format!("could not connect to {target}: is the server running and reachable?"),
                error,
            ));
        }
        Ok(LockClient::from_parts(
            fred,
            task,
            deployment,
            self.max_connections,
            self.command_timeout,
        ))
    }
}

/// A fred client for `config` with the settings lock safety relies on (see
/// [`LockClient::from_fred`]); `connection` and `perf` supply everything else.
fn build_fred(
    config: Config,
    mut connection: fred::types::config::ConnectionConfig,
    mut perf: fred::types::config::PerformanceConfig,
    settings: &LockClientBuilder,
) -> Result<Client, Error> {
    // The lock layer owns retries: fred must never re-send a command on its own.
    connection.max_command_attempts = 1;
    connection.connection_timeout = settings.connect_timeout;
    connection.internal_command_timeout = settings.command_timeout;
    // A demoted primary answers READONLY without dropping the connection: reconnect (through
    // Sentinel, to the new primary) instead of failing writes until then.
    for error in [
        fred::types::config::ReconnectError::MasterDown,
        fred::types::config::ReconnectError::ReadOnly,
    ] {
        if !connection.reconnect_errors.contains(&error) {
            connection.reconnect_errors.push(error);
        }
    }
    perf.default_command_timeout = settings.command_timeout;
    let mut builder = Builder::from_config(config);
    builder
        .set_policy(settings.reconnect.clone())
        .set_connection_config(connection)
        .set_performance_config(perf);
    builder.build()
}
