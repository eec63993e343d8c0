//! Connection state: the shared fred client, the dedicated pool, the deployment and its
//! replica hints, and how one lock script is run with the checks the deployment needs.
//!
//! This is the bottom layer of the runtime: it knows nothing of leases or primitives.

use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::error::Error;
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::cluster::ClusterRouting;

use crate::observe::Stats;
use crate::pool::{DedicatedPool, Link, close_in_background};
use crate::replicas::ReplicaHints;
use crate::sentinel::SentinelSeed;
use crate::topology::Deployment;

mod delifeq;
mod down;
mod in_flight;
mod node;
mod primary;
mod run;
mod verdict;

pub(crate) use crate::retry::DEADLINE_REACHED;
use delifeq::DELIFEQ_UNKNOWN;
use down::ConnectionErrors;
pub(crate) use node::{NodeCheck, wrong_node_problem};
pub(crate) use run::CALLER_TIMED;
pub(crate) use verdict::{Ack, OpError};

/// How long releasing may take before [`Locks::with_lock`](crate::Locks::with_lock) (and every
/// body-running call) returns anyway: when the server stops answering, a successful call
/// returns up to this long after its body ended, the lock then expiring with its lease.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(1);

/// The detail text of the error every operation of a client fails with once
/// [`LockClient::quit`](crate::LockClient::quit) closed it.
pub(crate) const CLOSED_BY_QUIT: &str = "the LockClient was closed by LockClient::quit()";

/// The error of an operation on a closed client: never retried (see [`crate::retry::classify`]).
pub(crate) fn closed_error() -> Error {
    Error::new(fred::error::ErrorKind::Canceled, CLOSED_BY_QUIT)
}

/// Whether `error` is [`closed_error`].
pub(crate) fn is_closed_error(error: &Error) -> bool {
    *error.kind() == fred::error::ErrorKind::Canceled && error.details() == CLOSED_BY_QUIT
}

/// How the shared connection's task starts.
pub(crate) enum Startup {
    /// Started already (or not ours to start): the handle, if any, is aborted on drop.
    Started(Option<fred::types::ConnectHandle>),
    /// Made outside a Tokio runtime: the first use of [`Connection::fred`] inside one starts it.
    OnFirstUse,
}

/// What every lock operation of one client shares: connections, deployment, counters.
pub(crate) struct Connection {
    /// The shared client: reach it through [`Connection::fred`], which starts its connection.
    fred: Client,
    pub(crate) deployment: Deployment,
    pub(crate) pool: Arc<DedicatedPool>,
    pub(crate) hints: ReplicaHints,
    pub(crate) stats: Stats,
    pub(crate) command_timeout: Duration,
    /// The task driving the shared connection, aborted when the client is dropped.
    task: std::sync::Mutex<Option<fred::types::ConnectHandle>>,
    /// Whether the shared connection's task was started (or never will be: not ours to start,
    /// or closed first); until then, [`Connection::fred`] starts it.
    started: std::sync::atomic::AtomicBool,
    /// Set while a forced reconnection of the shared connection is under way.
    reconnecting: Arc<std::sync::atomic::AtomicBool>,
    /// Whether the server has `DELIFEQ` (Valkey 9+): [`DELIFEQ_UNKNOWN`] until first asked.
    delifeq: std::sync::atomic::AtomicU8,
    /// Set by [`Connection::close`]: nothing may reconnect the shared connection afterwards.
    closed: Arc<std::sync::atomic::AtomicBool>,
    /// Through Sentinel: seeds the replica floor of the first primary written to.
    sentinel_seed: Option<SentinelSeed>,
    /// The shared connection's errors, to say why it is down.
    errors: ConnectionErrors,
    /// Whether the node can hold locks, for a client that did not check at connect.
    node_check: NodeCheck,
    /// When each node last answered the shared connection: busy, or frozen.
    answers: primary::Answers,
    /// When each node (by address, in every deployment) last answered a call on a dedicated
    /// connection: a call cut there while its node answers others was cut by its caller's
    /// deadline, not by a failover.
    dedicated_answers: Arc<primary::Answers>,
}

impl Connection {
    pub(crate) fn new(
        fred: Client,
        startup: Startup,
        deployment: Deployment,
        max_connections: usize,
        command_timeout: Duration,
    ) -> Self {
        let (task, started) = match startup {
            Startup::Started(task) => (task, true),
            Startup::OnFirstUse => (None, false),
        };
        let pool = Arc::new(DedicatedPool::new(fred.clone(), max_connections));
        Connection {
            sentinel_seed: SentinelSeed::for_client(&fred),
            errors: ConnectionErrors::watch(&fred),
            fred,
            deployment,
            pool,
            hints: ReplicaHints::default(),
            stats: Stats::default(),
            command_timeout,
            task: std::sync::Mutex::new(task),
            started: std::sync::atomic::AtomicBool::new(started),
            reconnecting: Arc::default(),
            delifeq: std::sync::atomic::AtomicU8::new(DELIFEQ_UNKNOWN),
            closed: Arc::default(),
            node_check: NodeCheck::done(),
            answers: primary::Answers::default(),
            dedicated_answers: Arc::default(),
        }
    }

    /// The same, checking on first use whether the node can hold locks (see [`NodeCheck`]).
    pub(crate) fn checking_node(mut self) -> Self {
        self.node_check = NodeCheck::on_first_use();
        self
    }

    /// Why no lock can be taken on the node this client reaches, if that is so: asked once,
    /// on the first call, for a client that did not check at connect; otherwise `None` at once.
    pub(crate) async fn node_refusal(&self) -> Option<String> {
        self.node_check
            .refusal(self.fred(), self.deployment.is_replicated(), &|present| {
                self.learn_delifeq(present);
            })
            .await
    }
}

impl Connection {
    /// The shared client, for commands. A client made outside a Tokio runtime
    /// ([`Startup::OnFirstUse`]) starts its connection here, on the first call inside one; a
    /// connection whose task ended without [`Connection::close`] (the runtime that ran it shut
    /// down, as each `#[tokio::test]`'s does, or a reconnect policy gave up) is started again on
    /// the current runtime. Otherwise this is an atomic load and an uncontended `try_lock`.
    pub(crate) fn fred(&self) -> &Client {
        if !self.started.load(std::sync::atomic::Ordering::Acquire) || self.driver_ended() {
            self.start_shared();
        }
        &self.fred
    }

    /// Whether the task that drives the shared connection has ended (a check already under way
    /// elsewhere counts as no).
    fn driver_ended(&self) -> bool {
        self.task.try_lock().is_ok_and(|task| {
            task.as_ref()
                .is_some_and(fred::types::ConnectHandle::is_finished)
        })
    }

    /// The shared client as a configuration template for connections of their own (the
    /// subscriber's): does not start the shared connection.
    pub(crate) fn template(&self) -> &Client {
        &self.fred
    }

    /// Starts the shared connection's task (again, if it ended), stored for [`Drop`] to abort;
    /// nothing outside a runtime (fred spawns the task) or once closed.
    #[cold]
    fn start_shared(&self) {
        use std::sync::atomic::Ordering;
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let mut task = self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let ended = task
            .as_ref()
            .is_some_and(fred::types::ConnectHandle::is_finished);
        if self.started.load(Ordering::Acquire) && !ended {
            return;
        }
        if self.closed.load(Ordering::Acquire) {
            // Closed: never to be started again, so later calls skip all this.
            self.started.store(true, Ordering::Release);
            *task = None;
            return;
        }
        if ended {
            tracing::debug!(
                "the shared connection's task ended (its runtime shut down?): connecting again"
            );
        } else {
            tracing::debug!("made outside a Tokio runtime: starting the shared connection now");
        }
        *task = Some(self.fred.connect());
        self.started.store(true, Ordering::Release);
    }

    /// After a failed replica check or a lost lock (a failover may be under way): idle
    /// dedicated connections are closed, so the next loans reach the current primary, and the
    /// replica-count guesses start over low; the replica-count floors stay (see
    /// [`crate::replicas`]).
    pub(crate) fn forget_topology(&self) {
        self.pool.discard_idle();
        self.hints.forget_guesses();
    }

    /// A snapshot of the client's routing of a cluster's slots to its primaries, or `None`
    /// on other deployments (and whenever the client does not know the cluster's slots).
    pub(crate) fn cluster_routing(&self) -> Option<ClusterRouting> {
        if self.deployment != Deployment::Cluster {
            return None;
        }
        self.fred().cached_cluster_state()
    }
}

impl Connection {
    /// The shared connection reached a node that is no longer the primary (a failover: fred
    /// would keep using it until the old primary drops it, ~11 s seen): reconnect it now, in
    /// the background, once at a time (Sentinel names the current primary).
    pub(crate) fn reconnect_shared(&self) {
        use std::sync::atomic::Ordering;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.closed.load(Ordering::Acquire) || self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let (fred, flag, closed) = (
            self.fred().clone(),
            Arc::clone(&self.reconnecting),
            Arc::clone(&self.closed),
        );
        runtime.spawn(async move {
            // Cleared however this ends, also when the runtime shuts down mid-way.
            let _reconnecting = ClearOnDrop(flag);
            tracing::debug!("the shared connection reached a replica; reconnecting it");
            let _ = tokio::time::timeout(Duration::from_secs(5), fred.force_reconnection()).await;
            if closed.load(Ordering::Acquire) {
                // Closed while reconnecting: the new connection must not outlive `quit`.
                let _ = tokio::time::timeout(Duration::from_secs(1), fred.quit()).await;
            }
        });
    }

    /// Whether [`Connection::close`] ran: every operation then fails at once with
    /// [`closed_error`], sending nothing.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// [`closed_error`] once the client is closed, [`crate::runtime::missing`] outside a Tokio
    /// runtime.
    pub(crate) fn ensure_open(&self) -> Result<(), Error> {
        if self.is_closed() {
            Err(closed_error())
        } else {
            crate::runtime::ensure()
        }
    }

    /// Closes every connection: the dedicated pool (loans still out are closed when they come
    /// back), then the shared connection; a reconnection under way is undone. For
    /// [`LockClient::quit`](crate::LockClient::quit).
    pub(crate) async fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.pool.close().await;
    }

    /// Closes the shared connection (after [`Connection::close`] and anything that still used
    /// it, such as the subscriber).
    pub(crate) async fn quit_shared(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.fred.quit()).await;
        // Quit once: dropping the last handle then only ends the task (a second `QUIT` while
        // the first one winds down makes fred warn "Skip command ... after calling quit").
        if let Ok(mut task) = self.task.lock()
            && let Some(task) = task.take()
        {
            task.abort();
        }
    }
}

/// Clears its flag when dropped.
struct ClearOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for Connection {
    /// The last handle is gone (every `LockClient` clone, lock family and background task): close
    /// the shared connection too (idle dedicated ones close with the pool).
    fn drop(&mut self) {
        let task = self.task.lock().ok().and_then(|mut task| task.take());
        close_in_background(self.fred.clone(), Link::new(task));
    }
}
