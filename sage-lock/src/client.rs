//! [`LockClient`]: the connection to Redis/Valkey that lock families are made from.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::error::Error;

use crate::connection::{Connection, Startup};
use crate::engine::Engine;
use crate::error::LockError;
use crate::key::{KeyCodec, LockKeys};
use crate::observe::LockStats;
use crate::options::LockOptions;
use crate::pool::{DedicatedConnection, Lane, PoolError};
use crate::primitives::mutex::Locks;
use crate::primitives::rwlock::RwLocks;
use crate::primitives::semaphore::{Semaphores, validate_permits};
use crate::retry::deadline_after;
use crate::topology::Deployment;

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
    pub(crate) fn from_parts(
        fred: Client,
        startup: Startup,
        deployment: Deployment,
        max_connections: usize,
        command_timeout: Duration,
        renewal_batch_limit: usize,
        node_checked: bool,
    ) -> LockClient {
        let conn = Connection::new(fred, startup, deployment, max_connections, command_timeout);
        let conn = if node_checked || deployment == Deployment::Cluster {
            conn
        } else {
            conn.checking_node()
        };
        LockClient {
            inner: Arc::new(Engine::new(conn, renewal_batch_limit)),
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
    /// [`LockError::InvalidArgument`] (naming the option) when the lease is below 30 ms or over
    /// one year, `hold_at_least` is over one year, or the namespace is empty, blank or padded
    /// with whitespace.
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
    /// [`LockError::InvalidArgument`] (naming the option) when the lease is below 30 ms or over
    /// one year, `hold_at_least` is over one year, or the namespace is empty, blank or padded
    /// with whitespace.
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
    /// [`LockError::InvalidArgument`] (naming the option) when `permits` is 0, the lease is below
    /// 30 ms or over one year, `hold_at_least` is over one year, or the namespace is empty, blank
    /// or padded with whitespace.
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

    /// The underlying fred client (shared connection), for commands of your own. It has the
    /// settings of [`LockClient::from_fred`]: in a cluster, a `MOVED` or `ASK` reply comes back
    /// as an error (`ErrorKind::Routing`, after fred refreshed its routing for `MOVED`) instead
    /// of being followed. Called inside a Tokio runtime, it starts the connection of a client
    /// [`LockClient::from_fred`] made outside one.
    ///
    /// After [`LockClient::quit`] it stays closed: a command sent on it is not sent to the
    /// server and fails with fred's `ErrorKind::Timeout` once the command timeout passes (5 s
    /// unless [`command_timeout`](crate::LockClientBuilder::command_timeout) says otherwise).
    #[must_use]
    pub fn fred(&self) -> &Client {
        self.inner.conn.fred()
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

    /// The server-side key that holds the mutex ([`Locks`]) on `key` in `namespace`, `{ns:key}`
    /// (for inspection and tests). A read-write lock ([`RwLocks`]) holds `{ns:key}:w` (its
    /// writer) and `{ns:key}:r` (its readers) instead, a semaphore ([`Semaphores`])
    /// `{ns:key}:sem`; all share the fencing counter `{ns:key}:fence`. `namespace` is not
    /// checked: an empty or padded one gives a key no lock family uses.
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
    /// operations), waiting at most `timeout` for a free one. It has the settings of
    /// [`LockClient::fred`] (in a cluster, `MOVED`/`ASK` come back as errors). Dropped, it is
    /// closed, so nothing done on it reaches lock operations (see [`DedicatedConnection`]).
    ///
    /// A borrowed connection counts against
    /// [`max_connections`](crate::LockClientBuilder::max_connections) until dropped. In a
    /// replicated deployment, acquisitions and renewals wait for a free one too: holding all
    /// of them makes acquisitions time out with
    /// [`TimeoutReason::PoolExhausted`](crate::TimeoutReason::PoolExhausted) and can make this
    /// client's own held locks be lost ([`LockError::LockLost`]) when their renewals find none
    /// in time.
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// use std::time::Duration;
    ///
    /// let connection = client.dedicated_connection(Duration::from_secs(1)).await?;
    /// // `connection` dereferences to a fred client: run blocking commands on it.
    /// drop(connection); // closed, its slot back in the pool
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Backend`] when no connection became free within `timeout`, connecting
    /// failed, the call is outside a Tokio runtime, or the client was closed by
    /// [`LockClient::quit`] (at once; nothing is opened). It is not retried: apart from `quit`
    /// and a missing runtime, a later call may succeed.
    pub async fn dedicated_connection(
        &self,
        timeout: Duration,
    ) -> Result<DedicatedConnection, LockError> {
        crate::runtime::ensure().map_err(|e| LockError::backend("no dedicated connection", e))?;
        let pool = &self.inner.conn.pool;
        match pool
            .take(deadline_after(timeout), Lane::InTurn, Duration::ZERO)
            .await
        {
            Ok(loan) => Ok(DedicatedConnection::new(loan)),
            Err(PoolError::Exhausted) => Err(LockError::backend(
                format!(
                    "all {} dedicated connections stayed busy for {timeout:?}; raise max_connections",
                    pool.max_connections()
                ),
                Error::new(fred::error::ErrorKind::Timeout, "dedicated pool exhausted"),
            )),
            Err(PoolError::Unanswered(held)) => Err(LockError::backend(
                format!(
                    "no dedicated connection came free within {timeout:?}: the server did not \
                     answer the {held} calls holding them (is it stopped or overloaded?)"
                ),
                Error::new(
                    fred::error::ErrorKind::Timeout,
                    "dedicated connections held by unanswered calls",
                ),
            )),
            Err(PoolError::Connect(error)) => Err(LockError::backend(
                "could not open a dedicated connection",
                error,
            )),
            Err(PoolError::Closed) => Err(LockError::backend(
                "no dedicated connection",
                crate::connection::closed_error(),
            )),
        }
    }

    /// Closes the shared, dedicated and subscriber connections, for every clone of this client,
    /// once the tasks waiting for a lock have left the server's queues and the releases under
    /// way (those of cancelled `with_lock` calls included) are through, or after
    /// [`RELEASE_TIMEOUT`](crate::RELEASE_TIMEOUT) at most. The client's background
    /// tasks end with them, even while the client itself is kept (say, in a `static`).
    ///
    /// Afterwards every call made from this client (waiting, trying, operator tools,
    /// [`LockClient::dedicated_connection`]) fails at once with [`LockError::Backend`] quoting
    /// `LockClient::quit()`, and opens no connection (commands of your own on
    /// [`LockClient::fred`] fail too, after the command timeout); tasks waiting for a lock stop waiting the
    /// same way. Locks still held are not released and not renewed: a body still running keeps
    /// its lock until the usable lease runs out, then fails with [`LockError::LockLost`] (its
    /// release fails too); the server lets the lock expire with its lease. Quit after the bodies
    /// finished to release their locks at once.
    ///
    /// Called outside a Tokio runtime, it closes the client on a runtime of its own, blocking
    /// the calling thread until done (a second at most per connection).
    pub async fn quit(&self) {
        if !crate::runtime::is_current() {
            self.quit_without_runtime();
            return;
        }
        let releases = tokio::time::Instant::now() + crate::connection::RELEASE_TIMEOUT;
        // Waiting tasks stop, and leave their places in the server's queues first (else the
        // next release hands the lock to a waiter that is gone, and a live one waits out that
        // hand-off).
        self.inner.quitting.start();
        self.inner.waiting.settled(releases).await;
        // A shutdown that cancels its holders and then quits: their releases, started in the
        // background, reach the server before the connections close.
        self.inner.releases.settled(releases).await;
        self.inner.conn.close().await;
        // Nothing is renewed any more: the scheduler's task ends.
        self.inner.renewer.close();
        // Waiters sleeping until their next attempt try now, and fail.
        self.inner.waiters.wake_all();
        self.inner.notifier.close().await;
        self.inner.conn.quit_shared().await;
    }

    /// [`LockClient::quit`] outside a Tokio runtime: on a current-thread runtime made for it
    /// (fred's connection tasks run on their own runtime; only `quit`'s timers run on this one).
    #[cold]
    fn quit_without_runtime(&self) {
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(self.quit()),
            Err(error) => tracing::warn!(
                %error,
                "quit() outside a Tokio runtime could not start one: the client stays open \
                 (its connections close when its last clone is dropped)"
            ),
        }
    }
}
