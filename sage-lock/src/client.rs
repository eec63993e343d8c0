//! [`LockClient`]: the connection to Redis/Valkey that lock families are made from.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::clients::Client;
use fred::error::Error;
use fred::interfaces::ClientLike;
use fred::interfaces::ClusterInterface;
use fred::types::config::Server;
use fred::types::config::{Config, ReconnectPolicy};
use fred::types::{Builder, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::LockError;
use crate::key::{KeyCodec, LockKeys};
use crate::locks::{LockOptions, Locks};
use crate::observe::{LockStats, Stats};
use crate::pool::{DedicatedConnection, DedicatedPool, PoolError, close_in_background};
use crate::renewal::Renewer;
use crate::retry::deadline_after;
use crate::scripts::{AcquireReply, ScriptCall, Scripts, is_noscript, parse_acquire, parse_flag};
use crate::topology::{Checked, Deployment, ReplicaHints, run_checked};

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
    pub(crate) inner: Arc<ClientInner>,
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("deployment", &self.inner.deployment)
            .field("max_connections", &self.inner.pool.max_connections())
            .finish_non_exhaustive()
    }
}

pub(crate) struct ClientInner {
    pub(crate) fred: Client,
    pub(crate) deployment: Deployment,
    pub(crate) pool: DedicatedPool,
    pub(crate) scripts: Scripts,
    pub(crate) hints: ReplicaHints,
    pub(crate) stats: Stats,
    pub(crate) command_timeout: Duration,
    pub(crate) renewer: Renewer,
    /// Tasks of this process waiting for a key, woken when this process releases it.
    waiters: Mutex<HashMap<Vec<u8>, Arc<Notify>>>,
    /// How many tasks are registered in `waiters` (skips the lock on release when none).
    waiting: std::sync::atomic::AtomicUsize,
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

    /// Wraps an existing fred client. It should already be connected (`init`), and should not
    /// re-send commands on its own (`max_command_attempts = 1`), so that the lock layer owns
    /// retries. The deployment is read from its configuration.
    #[must_use]
    pub fn from_fred(client: Client) -> LockClient {
        let deployment = Deployment::of(&client.client_config().server);
        LockClient::from_parts(
            client,
            deployment,
            DEFAULT_MAX_CONNECTIONS,
            Duration::from_secs(5),
        )
    }

    fn from_parts(
        fred: Client,
        deployment: Deployment,
        max_connections: usize,
        command_timeout: Duration,
    ) -> LockClient {
        let pool = DedicatedPool::new(fred.clone(), max_connections);
        LockClient {
            inner: Arc::new(ClientInner {
                fred,
                deployment,
                pool,
                scripts: Scripts::new(),
                hints: ReplicaHints::default(),
                stats: Stats::default(),
                command_timeout,
                renewer: Renewer::default(),
                waiters: Mutex::new(HashMap::new()),
                waiting: std::sync::atomic::AtomicUsize::new(0),
            }),
        }
    }

    /// A lock family with the service-wide defaults (30 s lease, namespace `lock`, replica
    /// acknowledgement on, unless changed through [`crate::global::set_defaults`]).
    #[must_use]
    pub fn lock<K: ?Sized>(&self) -> Locks<K> {
        Locks::new(self.clone(), LockOptions::new().resolve())
    }

    /// A lock family with explicit options; unset options take the service-wide defaults.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] when the lease is below 30 ms or the namespace is empty.
    pub fn lock_with<K: ?Sized>(&self, options: LockOptions) -> Result<Locks<K>, LockError> {
        let settings = options.resolve();
        settings.validate()?;
        Ok(Locks::new(self.clone(), settings))
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
        self.inner.deployment
    }

    /// The underlying fred client (shared connection), for commands of your own.
    #[must_use]
    pub fn fred(&self) -> &Client {
        &self.inner.fred
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
        self.inner.stats.snapshot()
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
        match self.inner.pool.take(deadline_after(timeout)).await {
            Ok(loan) => Ok(DedicatedConnection::new(loan, Arc::downgrade(&self.inner))),
            Err(PoolError::Exhausted) => Err(LockError::backend(
                format!(
                    "all {} dedicated connections stayed busy for {timeout:?}; raise max_connections",
                    self.inner.pool.max_connections()
                ),
                Error::new(fred::error::ErrorKind::Timeout, "dedicated pool exhausted"),
            )),
            Err(PoolError::Connect(error)) => Err(LockError::backend(
                "could not open a dedicated connection",
                error,
            )),
        }
    }

    /// Closes the shared and dedicated connections. Locks still held expire with their lease.
    pub async fn quit(&self) {
        self.inner.pool.close().await;
        let _ = tokio::time::timeout(Duration::from_secs(1), self.inner.fred.quit()).await;
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
#[derive(Debug)]
pub struct LockClientBuilder {
    config: Result<Config, LockError>,
    replicated: Option<bool>,
    max_connections: usize,
    command_timeout: Duration,
    connect_timeout: Duration,
    reconnect: ReconnectPolicy,
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
    pub async fn connect(self) -> Result<LockClient, LockError> {
        let config = self.config?;
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
        let mut builder = Builder::from_config(config);
        builder
            .set_policy(self.reconnect)
            .with_connection_config(|conn| {
                // The lock layer owns retries: fred must never re-send a command on its own.
                conn.max_command_attempts = 1;
                conn.connection_timeout = self.connect_timeout;
                conn.internal_command_timeout = self.command_timeout;
                conn.reconnect_errors
                    .push(fred::types::config::ReconnectError::MasterDown);
            })
            .with_performance_config(|perf| {
                perf.default_command_timeout = self.command_timeout;
            });
        let fred = builder.build().map_err(|e| {
            LockError::backend(format!("could not configure a client for {target}"), e)
        })?;
        let connected = tokio::time::timeout(self.connect_timeout, fred.init()).await;
        let failure = match connected {
            Ok(Ok(_task)) => None,
            Ok(Err(error)) => Some(error),
            Err(_) => Some(Error::new(
                fred::error::ErrorKind::Timeout,
                format!("no connection within {:?}", self.connect_timeout),
            )),
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
            deployment,
            self.max_connections,
            self.command_timeout,
        ))
    }
}

/// URL schemes fred understands; anything else is rejected before fred guesses.
const SCHEMES: [&str; 9] = [
    "redis",
    "rediss",
    "valkey",
    "valkeys",
    "redis-cluster",
    "rediss-cluster",
    "redis-sentinel",
    "rediss-sentinel",
    "redis+unix",
];

fn parse_url(url: &str) -> Result<Config, LockError> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    if !scheme.is_some_and(|scheme| SCHEMES.contains(&scheme.to_ascii_lowercase().as_str())) {
        return Err(LockError::invalid(
            "url",
            format!(
                "{} has no supported scheme; expected redis://host:port[/db] (or valkey://, \
                 rediss:// for TLS), redis-sentinel://host:port?sentinelServiceName=NAME or \
                 redis-cluster://host:port?node=host2:port2",
                redact(url)
            ),
        ));
    }
    Config::from_url(url).map_err(|error| {
        LockError::invalid(
            "url",
            format!(
                "{} is not a valid server URL ({}); expected redis://host:port[/db], \
                 redis-sentinel://host:port?sentinelServiceName=NAME or \
                 redis-cluster://host:port?node=host2:port2",
                redact(url),
                error.details()
            ),
        )
    })
}

/// The URL with any password replaced by `***`.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}

fn describe(config: &Config) -> String {
    let hosts: Vec<String> = config
        .server
        .hosts()
        .iter()
        .map(|s| format!("{}:{}", s.host, s.port))
        .collect();
    format!("{} ({:?})", hosts.join(","), Deployment::of(&config.server))
}

/// Why a single server operation did not produce an answer.
#[derive(Debug)]
pub(crate) enum OpError {
    /// The client or server failed (classify it with `retry::classify`).
    Failed(Error),
    /// No dedicated connection became free before the deadline.
    PoolExhausted,
}

impl From<Error> for OpError {
    fn from(error: Error) -> Self {
        OpError::Failed(error)
    }
}

/// What replica checks said about a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ack {
    /// No checks apply (standalone), or they passed.
    Confirmed,
    /// Too few replicas acknowledged in time.
    Short { acknowledged: i64, required: i64 },
    /// The node is no longer a primary.
    NotPrimary(String),
}

impl ClientInner {
    /// Runs a lock script with the checks the deployment needs, within `deadline`. Also returns
    /// the node that answered (replicated deployments), for role-change detection.
    pub(crate) async fn run(
        &self,
        call: &ScriptCall<'_>,
        replica_ack: bool,
        deadline: Instant,
        granted_by: Option<&Server>,
    ) -> Result<(Value, Ack, Option<Server>), OpError> {
        let limit = deadline.min(deadline_after(self.command_timeout));
        if !self.deployment.is_replicated() {
            return match tokio::time::timeout_at(limit, run_plain(&self.fred, call)).await {
                Ok(result) => Ok((result?, Ack::Confirmed, None)),
                Err(_) => Err(OpError::Failed(timeout_error())),
            };
        }
        if !replica_ack {
            let checked = run_checked(&self.fred, &self.hints, call, None);
            return match tokio::time::timeout_at(limit, checked).await {
                Ok(result) => {
                    let node = serving_node(&self.fred, call.slot);
                    Ok(judge(result?, &self.fred, node, granted_by))
                }
                Err(_) => Err(OpError::Failed(timeout_error())),
            };
        }
        let loan = match self.pool.take(deadline).await {
            Ok(loan) => loan,
            Err(PoolError::Exhausted) => return Err(OpError::PoolExhausted),
            Err(PoolError::Connect(error)) => return Err(OpError::Failed(error)),
        };
        // WAIT may use most of what is left of the deadline, leaving a tenth (5 to 100 ms) for
        // its reply, so a renewal reports before the usable lease ends.
        let left = crate::retry::remaining(deadline);
        let slack = (left / 10).clamp(Duration::from_millis(5), Duration::from_millis(100));
        let wait_until = deadline.checked_sub(slack).unwrap_or(deadline);
        let checked = run_checked(&loan.conn, &self.hints, call, Some(wait_until));
        let grace = Duration::from_millis(250).min(self.command_timeout);
        match tokio::time::timeout_at(deadline + grace, checked).await {
            Ok(Ok(checked)) => {
                let node = serving_node(&loan.conn, call.slot);
                let judged = judge(checked, &loan.conn, node, granted_by);
                if judged.1 == Ack::Confirmed {
                    self.pool.put_back(loan);
                } else {
                    // A failover may be under way: let every dedicated connection reconnect.
                    close_in_background(loan.conn);
                    self.pool.discard_idle();
                }
                Ok(judged)
            }
            failed => {
                // The connection may still be blocked in WAIT or broken: never reuse it.
                close_in_background(loan.conn);
                self.pool.discard_idle();
                Err(OpError::Failed(match failed {
                    Ok(Err(error)) => error,
                    _ => timeout_error(),
                }))
            }
        }
    }

    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        lease: Duration,
        replica_ack: bool,
        deadline: Instant,
    ) -> Result<(AcquireReply, Ack, Option<Server>), OpError> {
        let args = vec![Value::Bytes(token.clone()), Value::Integer(millis(lease))];
        let call = self.scripts.acquire.on_lock(keys, args);
        let (value, ack, node) = self.run(&call, replica_ack, deadline, None).await?;
        Ok((parse_acquire(value)?, ack, node))
    }

    /// Deletes the key if it still holds `token`; wakes this process's waiters for it.
    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        deadline: Instant,
    ) -> Result<bool, OpError> {
        let call = self
            .scripts
            .release
            .on_lock(keys, vec![Value::Bytes(token.clone())]);
        let released = match tokio::time::timeout_at(deadline, run_plain(&self.fred, &call)).await {
            Ok(result) => parse_flag(&result?)?,
            Err(_) => return Err(OpError::Failed(timeout_error())),
        };
        self.wake_one(&keys.lock);
        Ok(released)
    }

    /// The notifier local waiters for `lock_key` sleep on.
    pub(crate) fn waiter(&self, lock_key: &[u8]) -> Arc<Notify> {
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Ok(mut waiters) = self.waiters.lock() else {
            return Arc::new(Notify::new());
        };
        Arc::clone(
            waiters
                .entry(lock_key.to_vec())
                .or_insert_with(|| Arc::new(Notify::new())),
        )
    }

    /// Drops the notifier for `lock_key` when no waiter holds it any more.
    pub(crate) fn forget_waiter(&self, lock_key: &[u8], notify: Arc<Notify>) {
        drop(notify);
        self.waiting
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut waiters) = self.waiters.lock()
            && waiters
                .get(lock_key)
                .is_some_and(|n| Arc::strong_count(n) == 1)
        {
            waiters.remove(lock_key);
        }
    }

    fn wake_one(&self, lock_key: &[u8]) {
        if self.waiting.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return;
        }
        let notify = self
            .waiters
            .lock()
            .ok()
            .and_then(|w| w.get(lock_key).cloned());
        if let Some(notify) = notify {
            notify.notify_one();
        }
    }
}

/// The node `conn` sends `slot`'s commands to, as far as the client's routing knows.
fn serving_node(conn: &Client, slot: u16) -> Option<Server> {
    if conn.is_clustered() {
        conn.cached_cluster_state()
            .and_then(|routing| routing.get_server(slot).cloned())
    } else {
        conn.active_connections().into_iter().next()
    }
}

/// Whether the primary that granted a lock has lost its role: another node now serves the
/// lock's slot and (in a cluster) the granting node serves no slots as a primary any more. A
/// cluster slot migration, which moves the key with its token and TTL, is not a role change.
fn role_change(
    conn: &Client,
    node: Option<&Server>,
    granted_by: Option<&Server>,
) -> Option<String> {
    let (now, granter) = (node?, granted_by?);
    if now == granter {
        return None;
    }
    if conn.is_clustered()
        && conn.cached_cluster_state().is_some_and(|routing| {
            routing
                .slots()
                .iter()
                .any(|range| &range.primary == granter)
        })
    {
        return None;
    }
    Some(format!(
        "{}:{} granted the lock but {}:{} is the primary of its slot now",
        granter.host, granter.port, now.host, now.port
    ))
}

/// Turns the replica checks into an [`Ack`]; `node` answered, `granted_by` granted the lock.
fn judge(
    checked: Checked,
    conn: &Client,
    node: Option<Server>,
    granted_by: Option<&Server>,
) -> (Value, Ack, Option<Server>) {
    let moved = role_change(conn, node.as_ref(), granted_by);
    let ack = if !checked.role.is_primary() {
        Ack::NotPrimary(format!("ROLE reports {}", checked.role.name))
    } else if let Some(moved) = moved {
        Ack::NotPrimary(moved)
    } else {
        match checked.acknowledged {
            Some((acknowledged, required)) if acknowledged < required => Ack::Short {
                acknowledged,
                required,
            },
            _ => Ack::Confirmed,
        }
    };
    (checked.reply, ack, node)
}

/// `EVALSHA` on the shared connection, `EVAL` after `NOSCRIPT`.
async fn run_plain(fred: &Client, call: &ScriptCall<'_>) -> Result<Value, Error> {
    let (cmd, args) = call.command(false);
    match fred.custom::<Value, Value>(cmd, args).await {
        Err(error) if is_noscript(&error) => {
            let (cmd, args) = call.command(true);
            fred.custom(cmd, args).await
        }
        other => other,
    }
}

/// The detail text of a command cut short by the caller's deadline.
pub(crate) const DEADLINE_REACHED: &str = "no reply before the deadline";

fn timeout_error() -> Error {
    Error::new(fred::error::ErrorKind::Timeout, DEADLINE_REACHED)
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_are_invalid_arguments_without_passwords() {
        let Err(err) = parse_url("http://user:secret@host:1") else {
            panic!("accepted an http URL")
        };
        let text = err.to_string();
        assert!(
            text.contains("url") && text.contains("redis://host:port"),
            "{text}"
        );
        assert!(!text.contains("secret"), "{text}");
    }

    #[test]
    fn deployment_comes_from_the_url() {
        let cluster = parse_url("redis-cluster://127.0.0.1:7000?node=127.0.0.1:7001");
        assert_eq!(
            cluster.ok().map(|c| Deployment::of(&c.server)),
            Some(Deployment::Cluster)
        );
        let plain = parse_url("valkey://127.0.0.1:6379");
        assert_eq!(
            plain.ok().map(|c| Deployment::of(&c.server)),
            Some(Deployment::Standalone)
        );
    }
}
