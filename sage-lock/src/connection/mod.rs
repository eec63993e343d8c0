//! Connection state: the shared fred client, the dedicated pool, the deployment and its
//! replica hints, and how one lock script is run with the checks the deployment needs.
//!
//! This is the bottom layer of the runtime: it knows nothing of leases or primitives.

use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::error::{Error, ErrorKind};
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::Value;
use fred::types::cluster::ClusterRouting;
use fred::types::config::Server;
use tokio::time::Instant;

use crate::observe::Stats;
use crate::pool::{DedicatedPool, Link, PoolError, close_in_background};
use crate::redirect;
use crate::replicas::ReplicaHints;
use crate::retry::deadline_after;
use crate::scripts::{ScriptCall, is_noscript};
use crate::sentinel::SentinelSeed;
use crate::topology::{Deployment, run_checked};

mod delifeq;
mod down;
mod in_flight;
mod verdict;

use delifeq::DELIFEQ_UNKNOWN;
use down::ConnectionErrors;
use in_flight::InFlight;
pub(crate) use verdict::{Ack, OpError};
use verdict::{is_stale_route, judge, not_the_granter, serving_node};

/// How long releasing may take before [`Locks::with_lock`](crate::Locks::with_lock) returns
/// anyway (see its example). A release is a connection-level operation, so the bound lives here.
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
        }
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
    }

    /// Runs a release-like call (no acknowledgement needed) on the current primary: on the
    /// shared connection with a `ROLE` check on replicated deployments; when that node is no
    /// longer the primary, is not `granted_by` (a demoted primary can still claim the role for
    /// seconds) or answers READONLY, the shared connection is reconnected and the call runs
    /// again on a dedicated connection, which reaches the current primary.
    pub(crate) async fn run_on_primary(
        &self,
        call: &ScriptCall<'_>,
        deadline: Instant,
        granted_by: Option<&Server>,
    ) -> Result<Value, OpError> {
        if !self.deployment.is_replicated() {
            return self.run_plain(call, deadline).await;
        }
        match self.run(call, false, deadline, granted_by, None).await {
            Ok((value, Ack::Confirmed | Ack::Short { .. }, _)) => return Ok(value),
            Ok((_, Ack::NotPrimary(_), _)) => {}
            Err(OpError::Failed(error)) if crate::retry::is_readonly(&error) => {
                self.reconnect_shared();
            }
            Err(other) => return Err(other),
        }
        self.run(call, true, deadline, None, None)
            .await
            .map(|(value, _, _)| value)
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

impl Connection {
    /// Runs a lock script with the checks the deployment needs, within `deadline`. Also returns
    /// the node that answered (replicated deployments), for role-change detection.
    ///
    /// `cleanup` undoes `call` (an acquisition's release): when a replica-acknowledged attempt
    /// fails or is cancelled before its reply, it is sent on the same connection, after `call`.
    pub(crate) async fn run(
        &self,
        call: &ScriptCall<'_>,
        replica_ack: bool,
        deadline: Instant,
        granted_by: Option<&Server>,
        cleanup: Option<ScriptCall<'static>>,
    ) -> Result<(Value, Ack, Option<Server>), OpError> {
        self.ensure_open()?;
        let fred = self.fred();
        let limit = deadline.min(deadline_after(self.command_timeout));
        if !self.deployment.is_replicated() {
            // A never-late call ends by fred's own timeout, at `limit` (see `run_plain`); the
            // bound here only backs it up.
            let bound = if call.never_late {
                limit + NEVER_LATE_BACKUP
            } else {
                limit
            };
            return match tokio::time::timeout_at(bound, run_plain(fred, call, limit)).await {
                Ok(Err(error)) if call.never_late && *error.kind() == ErrorKind::Timeout => {
                    Err(OpError::Failed(self.timeout_error()))
                }
                Ok(result) => Ok((result?, Ack::Confirmed, None)),
                Err(_) => Err(OpError::Failed(self.timeout_error())),
            };
        }
        if !replica_ack {
            let checked = Box::pin(run_checked(fred, &self.hints, call, None));
            return match tokio::time::timeout_at(limit, checked).await {
                Ok(result) => {
                    let node = serving_node(fred, call.slot);
                    let judged = result
                        .map_err(|error| {
                            OpError::Failed(not_the_granter(error, node.as_ref(), granted_by))
                        })
                        .and_then(|checked| judge(checked, fred, node, granted_by));
                    // The shared connection reached a node that is not the primary (any more).
                    let reconnect = match &judged {
                        Ok((_, ack, _)) => matches!(ack, Ack::NotPrimary(_)),
                        Err(OpError::Failed(error)) => is_stale_route(error),
                        Err(OpError::PoolExhausted) => false,
                    };
                    if reconnect {
                        self.reconnect_shared();
                    }
                    judged
                }
                Err(_) => Err(OpError::Failed(self.timeout_error())),
            };
        }
        // Boxed (as the other multi-KB futures below): keeps this future, and every one that
        // awaits it, small on the plain path.
        let loan = match Box::pin(self.pool.take(deadline)).await {
            Ok(loan) => loan,
            Err(PoolError::Exhausted) => return Err(OpError::PoolExhausted),
            Err(PoolError::Connect(error)) => return Err(OpError::Failed(error)),
            Err(PoolError::Closed) => return Err(OpError::Failed(closed_error())),
        };
        // WAIT leaves part of what is left of the deadline for its reply: an idle server ends a
        // WAIT up to 1000/`hz` ms late (100 ms at the default `hz 10`), and a renewal must
        // report its outcome before the lease's safety net fires. With 300 ms or more left, half
        // (at most 250 ms) stays free, which covers that lateness; with less, no slack could, and
        // WAIT keeps two thirds so that slow but healthy replicas still acknowledge short leases.
        // And WAIT takes at most half the command timeout, so one for a replica that left ends
        // well before fred's.
        let left = crate::retry::remaining(deadline);
        let slack = if left >= Duration::from_millis(300) {
            (left / 2).min(Duration::from_millis(250))
        } else {
            (left / 3).max(Duration::from_millis(5))
        };
        let wait_until = deadline
            .checked_sub(slack)
            .unwrap_or(deadline)
            .min(deadline_after(self.command_timeout / 2));
        let conn = loan.conn.clone();
        if let Some(seed) = &self.sentinel_seed {
            Box::pin(seed.seed(fred, &conn, &self.hints, wait_until)).await;
        }
        let in_flight = InFlight {
            loan: Some(loan),
            cleanup,
            shared: fred.clone(),
        };
        let checked = Box::pin(run_checked(&conn, &self.hints, call, Some(wait_until)));
        let grace = Duration::from_millis(250).min(self.command_timeout);
        let outcome = tokio::time::timeout_at(wait_until + grace, checked).await;
        match outcome {
            Ok(Ok(checked)) => {
                let loan = in_flight.settle();
                let node = serving_node(&conn, call.slot);
                let judged = judge(checked, &conn, node, granted_by);
                if matches!(judged, Ok((_, Ack::Confirmed, _))) {
                    if let Some(loan) = loan {
                        self.pool.put_back(loan);
                    }
                } else {
                    // A failover may be under way (or this connection's routing is out of
                    // date): let every dedicated connection reconnect.
                    drop(loan);
                    self.forget_topology();
                }
                judged
            }
            failed => {
                // The connection may still be blocked in WAIT or broken: never reuse it, and
                // clean up on it (the attempt may still run) before the caller retries.
                in_flight.fail().await;
                self.forget_topology();
                Err(OpError::Failed(match failed {
                    Ok(Err(error)) => {
                        not_the_granter(error, serving_node(&conn, call.slot).as_ref(), granted_by)
                    }
                    _ => self.timeout_error(),
                }))
            }
        }
    }

    /// Runs `call` on the shared connection (no replica checks), within `deadline`.
    pub(crate) async fn run_plain(
        &self,
        call: &ScriptCall<'_>,
        deadline: Instant,
    ) -> Result<Value, OpError> {
        self.ensure_open()?;
        match tokio::time::timeout_at(deadline, run_plain(self.fred(), call, deadline)).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(OpError::Failed(self.timeout_error())),
        }
    }
}

/// `EVALSHA` on `fred`, `EVAL` after `NOSCRIPT`; after `MOVED` (the script did not run) again
/// on the slot's new owner (see [`crate::redirect`]). The caller bounds it by `deadline`; a
/// [`never_late`](ScriptCall::never_late) call is also never sent after it.
async fn run_plain(
    fred: &Client,
    call: &ScriptCall<'_>,
    deadline: Instant,
) -> Result<Value, Error> {
    let (mut use_source, mut redirections) = (call.source_first, 0);
    loop {
        let node = redirect::owner(fred, call.slot);
        let (cmd, args) = call.command(use_source);
        // fred's own timeout, when it fires, marks the command so that fred never writes it
        // afterwards (a command the caller merely dropped is still written once reconnected):
        // it ends the call at `deadline`, before the caller's backup bound.
        let options = call.never_late.then(|| fred::types::config::Options {
            timeout: Some(
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            ),
            ..Default::default()
        });
        // Boxed: fred's command future is ~7 KB; kept inline it would make every future above
        // it (acquire, hold, release) as large, and each move of those a multi-KB copy.
        let timed = fred.with_options(options.as_ref().unwrap_or(&CALLER_TIMED));
        match Box::pin(async move { timed.custom::<Value, Value>(cmd, args).await }).await {
            Err(error) if is_noscript(&error) && !use_source => use_source = true,
            Err(error) if redirect::is_redirection(&error) => {
                redirections += 1;
                if redirections > redirect::MAX_REDIRECTIONS {
                    return Err(error);
                }
                redirect::after_redirection(fred, call.slot, node.as_ref())?;
            }
            other => return other,
        }
    }
}

/// How long after its deadline a [`never_late`](ScriptCall::never_late) call is cut short if
/// fred's own timeout has not ended it (it always should).
const NEVER_LATE_BACKUP: Duration = Duration::from_millis(20);

/// Per-command options of a command whose caller bounds it with a deadline of its own: no fred
/// timeout on top (a zero timeout is none), which saves a timer per command.
pub(crate) static CALLER_TIMED: std::sync::LazyLock<fred::types::config::Options> =
    std::sync::LazyLock::new(|| fred::types::config::Options {
        timeout: Some(Duration::ZERO),
        ..Default::default()
    });

/// The detail text of a command cut short by the caller's deadline.
pub(crate) const DEADLINE_REACHED: &str = "no reply before the deadline";

impl Connection {
    /// Why the shared connection is down, with what to check; `None` while it is up (or before
    /// it ever failed).
    pub(crate) fn why_down(&self) -> Option<String> {
        self.errors.why_down(&self.fred)
    }

    /// The error of a command cut short by the caller's deadline: [`DEADLINE_REACHED`], followed
    /// by why the shared connection is down when it is.
    fn timeout_error(&self) -> Error {
        let details = match self.why_down() {
            Some(why) => format!("{DEADLINE_REACHED}: {why}"),
            None => DEADLINE_REACHED.to_owned(),
        };
        Error::new(fred::error::ErrorKind::Timeout, details)
    }
}
