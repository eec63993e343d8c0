//! The bounded pool of dedicated connections.
//!
//! `WAIT` blocks the connection it runs on, so replica-acknowledged lock operations never use the
//! shared, auto-pipelined connection. They borrow one of at most `max_connections` dedicated
//! connections instead, created lazily. Time spent waiting for a free one counts against the
//! caller's deadline (the acquisition wait or the usable lease). Callers wait in arrival order,
//! except renewals ([`Lane::Ahead`]): a renewal waits behind at most one other caller, so a
//! burst of acquisitions never holds back the renewals that keep existing locks.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::retry::{DEADLINE_REACHED, remaining};
use crate::sentinel::PrimaryRoute;

mod background;
mod loan;

pub use loan::DedicatedConnection;
use loan::close;
pub(crate) use loan::{Link, Loan, close_in_background};

/// Where a caller joins the queue for a free connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Behind everyone already waiting (acquisitions, releases, user loans).
    InTurn,
    /// Behind at most one caller already waiting: for renewals, whose leases run out while
    /// they wait.
    Ahead,
}

/// Why no dedicated connection could be had.
#[derive(Debug)]
pub(crate) enum PoolError {
    /// Every connection stayed busy until the deadline.
    Exhausted,
    /// Every connection stayed busy until the deadline, and this many are held by calls the
    /// server did not answer in time: the server, not the pool's size, held the caller back.
    Unanswered(usize),
    /// A new connection failed to connect, or did not connect before the deadline.
    Connect(fred::error::Error),
    /// The pool was closed ([`DedicatedPool::close`]): nothing is lent or opened any more.
    Closed,
}

/// A new dedicated connection that did not connect within the `waited` left before the
/// caller's deadline: the deadline ran out ([`DEADLINE_REACHED`]), whatever the server.
fn connect_timeout(waited: Duration) -> fred::error::Error {
    let details = if waited.is_zero() {
        // Nothing to do with the server: the time ran out before the connection was opened
        // (a long wait for a free slot, or a process that did not run meanwhile).
        format!(
            "{DEADLINE_REACHED}: no time was left to open a new dedicated connection (the wait \
             for a free one, or a pause of this process, took it all)"
        )
    } else {
        format!("{DEADLINE_REACHED}: a new dedicated connection did not connect within {waited:?}")
    };
    fred::error::Error::new(fred::error::ErrorKind::Timeout, details)
}

/// Whether the node `conn` reaches answers `ROLE` as anything but a primary before `deadline`
/// (no answer, or an error, counts as no: the lock pipeline checks `ROLE` again).
async fn is_replica(conn: &Client, deadline: Instant) -> bool {
    let role = tokio::time::timeout(
        remaining(deadline).max(Duration::from_millis(1)),
        conn.custom::<Value, Value>(
            CustomCommand::new_static("ROLE", ClusterHash::FirstKey, false),
            Vec::<Value>::new(),
        ),
    )
    .await;
    let Ok(Ok(Value::Array(role))) = role else {
        return false;
    };
    role.first()
        .and_then(Value::as_str)
        .is_some_and(|role| role != "master")
}

/// Counts one waiting caller in its counter for as long as it lives (cancelled too).
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A bounded set of exclusive connections, cloned from the shared client's configuration.
#[derive(Debug)]
pub(crate) struct DedicatedPool {
    template: Client,
    /// Through Sentinel: where new connections go (straight to the primary).
    route: Option<PrimaryRoute>,
    permits: Arc<Semaphore>,
    /// Taken (in arrival order) by [`Lane::InTurn`] callers before they wait on `permits`, so
    /// at most one of them is ever queued there ahead of a [`Lane::Ahead`] caller.
    turnstile: tokio::sync::Mutex<()>,
    idle: Mutex<Vec<(Client, Link)>>,
    max_connections: usize,
    generation: std::sync::atomic::AtomicU64,
    /// Set by [`DedicatedPool::close`]: returned loans are closed, not kept.
    closed: std::sync::atomic::AtomicBool,
    /// Turns `true` in [`DedicatedPool::close`], for what waits on a loan meanwhile.
    closing: tokio::sync::watch::Sender<bool>,
    /// How many loans are held by calls the server did not answer in time (see
    /// [`DedicatedPool::mark_unanswered`]).
    unanswered: Arc<std::sync::atomic::AtomicUsize>,
    /// How many [`Lane::Ahead`] callers (renewals) wait for a slot now.
    ahead_waiting: std::sync::atomic::AtomicUsize,
    /// A moving average of how long a confirmed call on a dedicated connection took, in
    /// microseconds (0 before the first).
    typical_call_micros: std::sync::atomic::AtomicU64,
}

impl DedicatedPool {
    /// A pool of at most `max_connections`; any number above tokio's
    /// [`Semaphore::MAX_PERMITS`] (such as `usize::MAX`) counts as that, in effect no limit.
    pub(crate) fn new(template: Client, max_connections: usize) -> Self {
        let max_connections = max_connections.min(Semaphore::MAX_PERMITS);
        DedicatedPool {
            route: PrimaryRoute::for_client(&template),
            template,
            permits: Arc::new(Semaphore::new(max_connections)),
            turnstile: tokio::sync::Mutex::new(()),
            idle: Mutex::new(Vec::new()),
            max_connections,
            generation: std::sync::atomic::AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
            closing: tokio::sync::watch::Sender::new(false),
            typical_call_micros: std::sync::atomic::AtomicU64::new(0),
            ahead_waiting: std::sync::atomic::AtomicUsize::new(0),
            unanswered: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        }
    }

    /// Counts `loan` as held by a call the server did not answer in time, until it ends: while
    /// such loans fill the pool, callers that find no free slot get [`PoolError::Unanswered`].
    pub(crate) fn mark_unanswered(&self, loan: &mut Loan) {
        if loan.unanswered.is_none() {
            self.unanswered
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            loan.unanswered = Some(Arc::clone(&self.unanswered));
        }
    }

    /// Why no slot came free: [`PoolError::Unanswered`] while loans are held by unanswered
    /// calls, else [`PoolError::Exhausted`].
    fn no_slot(&self) -> PoolError {
        match self.unanswered.load(std::sync::atomic::Ordering::Relaxed) {
            0 => PoolError::Exhausted,
            held => PoolError::Unanswered(held),
        }
    }

    /// Whether a renewal ([`Lane::Ahead`]) is waiting for a free slot now.
    pub(crate) fn renewal_waiting(&self) -> bool {
        self.ahead_waiting
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    }

    /// How long a call on a dedicated connection typically takes, from what
    /// [`DedicatedPool::record_call`] saw (zero before any).
    pub(crate) fn typical_call(&self) -> Duration {
        Duration::from_micros(
            self.typical_call_micros
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Counts a call that was answered in `took` into [`DedicatedPool::typical_call`] (a moving
    /// average of the last eight or so).
    pub(crate) fn record_call(&self, took: Duration) {
        use std::sync::atomic::Ordering;
        let took = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let old = self.typical_call_micros.load(Ordering::Relaxed);
        let new = if old == 0 {
            took
        } else {
            old - old / 8 + took / 8
        };
        // Concurrent updates may overwrite each other: an average either way.
        self.typical_call_micros.store(new, Ordering::Relaxed);
    }

    pub(crate) fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// Borrows a connection, waiting (in `lane`) for a free slot and connecting a new one if
    /// needed, all before `deadline`. A caller left with less than `enough` once a slot is
    /// free gets [`PoolError::Exhausted`] (the wait for the slot took its time), and the slot
    /// and its connection stay for the next. Cancelled while connecting, the new connection is
    /// closed. Once the pool is closed, [`PoolError::Closed`] at once.
    pub(crate) async fn take(
        self: &Arc<Self>,
        deadline: Instant,
        lane: Lane,
        enough: Duration,
    ) -> Result<Loan, PoolError> {
        if self.is_closed() {
            return Err(PoolError::Closed);
        }
        let slot = Arc::clone(&self.permits).acquire_owned();
        let permit = match lane {
            Lane::Ahead => {
                let _waiting = Waiting::new(&self.ahead_waiting);
                tokio::time::timeout_at(deadline, slot).await
            }
            Lane::InTurn => {
                let in_turn = async {
                    let _turn = self.turnstile.lock().await;
                    slot.await
                };
                tokio::time::timeout_at(deadline, in_turn).await
            }
        };
        let permit = match permit {
            Ok(Ok(permit)) if !self.is_closed() => permit,
            // Closed while this waited for a slot (closing the pool closes its semaphore).
            Ok(_) => return Err(PoolError::Closed),
            Err(_) => return Err(self.no_slot()),
        };
        if remaining(deadline) < enough {
            return Err(self.no_slot());
        }
        let generation = self.generation();
        loop {
            let reused = self.idle.lock().ok().and_then(|mut idle| idle.pop());
            let Some((conn, link)) = reused else { break };
            // A task that ended (its runtime shut down) leaves the client claiming to be
            // connected, with nothing left to send its commands.
            if conn.is_connected() && !link.ended() {
                return Ok(Loan {
                    conn,
                    link: Some(link),
                    _permit: Some(permit),
                    generation,
                    unanswered: None,
                });
            }
            close_in_background(conn, link);
        }
        if remaining(deadline).is_zero() {
            // No time left to open one: say so, rather than fail a connect given no time.
            return Err(match self.no_slot() {
                PoolError::Exhausted => PoolError::Connect(connect_timeout(Duration::ZERO)),
                unanswered => unanswered,
            });
        }
        let (mut permit, mut checked) = (Some(permit), false);
        let mut loan = loop {
            let (conn, direct) = self.new_client(deadline).await;
            // Owned by the loan from the start: dropped (cancelled or failed), it closes the
            // connection and aborts its task, which would otherwise reconnect forever.
            let mut loan = Loan {
                link: Some(Link::new(Some(conn.connect()))),
                conn,
                _permit: permit.take(),
                generation,
                unanswered: None,
            };
            let connect_time = remaining(deadline);
            // The task's end is watched too: a connection that fails at once (a server at its
            // client limit) can end it before `wait_for_connect` subscribes, which would then
            // wait out the whole deadline without its error.
            let task_ended = async {
                match loan.link.as_mut().and_then(|link| link.task.as_mut()) {
                    Some(task) => match task.await {
                        Ok(Err(error)) => error,
                        Ok(Ok(())) => fred::error::Error::new(
                            fred::error::ErrorKind::Canceled,
                            "the connection closed",
                        ),
                        Err(join) => fred::error::Error::new(
                            fred::error::ErrorKind::Unknown,
                            join.to_string(),
                        ),
                    },
                    None => std::future::pending().await,
                }
            };
            let connected = tokio::select! {
                connected = tokio::time::timeout(connect_time, loan.conn.wait_for_connect()) => {
                    connected
                }
                error = task_ended => Ok(Err(error)),
                // Dropped, the loan closes the connection.
                () = self.closed() => return Err(PoolError::Closed),
            };
            let cut = connected.is_err();
            let failure = match connected {
                Ok(Ok(())) => None,
                Ok(Err(error)) => Some(error),
                // The pool had room: the server did not answer in time (a transient failure).
                Err(_) => Some(connect_timeout(connect_time)),
            };
            if let Some(error) = failure {
                if let Some(route) = &self.route {
                    // The primary may have moved: the next connection asks the Sentinels.
                    route.suspect();
                }
                if cut {
                    // Cut by the caller's deadline: it may still connect, for the next caller.
                    self.finish_in_background(loan);
                    return Err(PoolError::Connect(error));
                }
                // Never connected: stop its task now; there is nothing to `QUIT`.
                if let Some(task) = loan.link.as_mut().and_then(|link| link.task.take()) {
                    task.abort();
                }
                return Err(PoolError::Connect(error));
            }
            // Straight to an address known from before, as fred does after asking Sentinel: is
            // it still the primary? (The lock pipeline checks `ROLE` too; a user's loan does
            // not.) If not, once more, where the Sentinels say it is now.
            if let (true, false, Some(route)) = (direct, checked, &self.route)
                && !route.is_suspect()
                && is_replica(&loan.conn, deadline).await
            {
                checked = true;
                route.suspect();
                permit = loan._permit.take();
                continue;
            }
            break loan;
        };
        if !loan.conn.is_clustered() {
            let id = tokio::time::timeout(
                remaining(deadline).max(Duration::from_millis(1)),
                loan.conn.custom::<Value, Value>(
                    CustomCommand::new_static("CLIENT", ClusterHash::FirstKey, false),
                    vec![Value::from("ID")],
                ),
            )
            .await;
            if let (Ok(Ok(id)), Some(link)) = (id, loan.link.as_mut()) {
                link.id = id.as_i64();
            }
        }
        Ok(loan)
    }

    /// A client for a new connection, not connected yet: on a Sentinel deployment one straight
    /// to the primary ([`PrimaryRoute`], which may ask the Sentinels before `deadline`), else
    /// (and when no address is known and no Sentinel answered) the template's configuration.
    /// Also whether it goes straight to an address the client knew (not through fred's Sentinel
    /// resolution, which checks `ROLE` itself).
    async fn new_client(&self, deadline: Instant) -> (Client, bool) {
        if let Some(route) = &self.route
            && let Some(primary) = route.primary(&self.template, deadline).await
        {
            return (route.client(&self.template, primary), true);
        }
        (self.template.clone_new(), false)
    }

    /// Returns an idle, healthy connection for reuse.
    pub(crate) fn put_back(&self, mut loan: Loan) {
        if loan.generation != self.generation() || self.is_closed() {
            return; // dropped: closed in the background
        }
        let Some(link) = loan.link.take() else {
            return;
        };
        match self.idle.lock() {
            Ok(mut idle) => idle.push((loan.conn.clone(), link)),
            Err(_) => close_in_background(loan.conn.clone(), link),
        }
    }

    /// How many idle connections the pool keeps (for tests).
    pub(crate) fn idle(&self) -> usize {
        self.idle.lock().map_or(0, |idle| idle.len())
    }

    /// Resolves once the pool is closed ([`DedicatedPool::close`]).
    pub(crate) async fn closed(&self) {
        let mut closing = self.closing.subscribe();
        let _ = closing.wait_for(|closed| *closed).await;
    }

    fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Closes idle connections in the background, so the next loans connect afresh (after a
    /// failover, idle connections may still point at the old primary); through Sentinel, the
    /// next new connection asks the Sentinels where the primary is ([`PrimaryRoute::suspect`]).
    pub(crate) fn discard_idle(&self) {
        // Loans out now were taken before this: they are closed when they come back.
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        if let Some(route) = &self.route {
            route.suspect();
        }
        for (conn, link) in self.take_idle() {
            close_in_background(conn, link);
        }
    }

    fn take_idle(&self) -> Vec<(Client, Link)> {
        self.idle
            .lock()
            .map(|mut idle| std::mem::take(&mut *idle))
            .unwrap_or_default()
    }

    /// Closes idle connections; from now on [`DedicatedPool::take`] fails with
    /// [`PoolError::Closed`].
    pub(crate) async fn close(&self) {
        // Loans still out (a renewal in flight, a background release) close when they return.
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        // Callers waiting for a slot, or on a loan, give up now.
        self.permits.close();
        self.closing.send_replace(true);
        for (conn, link) in self.take_idle() {
            close(conn, link).await;
        }
    }
}

impl Drop for DedicatedPool {
    fn drop(&mut self) {
        for (conn, link) in self.take_idle() {
            close_in_background(conn, link);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new connection cut short by the caller's deadline says so (the acquisition then keeps
    /// what its earlier attempts found, say a busy key), not only that it "did not connect
    /// within 1ms", which reads as a server fault. An audit saw busy waits end as "server
    /// unavailable: a new dedicated connection did not connect within 1ms".
    #[tokio::test]
    async fn a_connection_cut_by_the_deadline_says_so() {
        // Accepts connections (the kernel's backlog) but never answers them.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = silent.local_addr().expect("addr").port();
        let config = fred::types::config::Config::from_url(&format!("redis://127.0.0.1:{port}"))
            .expect("url");
        let template = fred::types::Builder::from_config(config)
            .build()
            .expect("client");
        let pool = Arc::new(DedicatedPool::new(template, 1));
        for budget in [Duration::ZERO, Duration::from_millis(50)] {
            let taken = pool
                .take(Instant::now() + budget, Lane::InTurn, Duration::ZERO)
                .await;
            let Err(PoolError::Connect(error)) = taken else {
                panic!("a connection to a silent server: {taken:?}");
            };
            assert!(
                error
                    .details()
                    .starts_with(crate::connection::DEADLINE_REACHED),
                "{budget:?}: {error}"
            );
            // No budget at all: not a server that was slow to connect (audit 50 read "did not
            // connect within 0ns" after a pause of the process).
            assert_eq!(
                budget.is_zero(),
                error.details().contains("no time was left"),
                "{budget:?}: {error}"
            );
        }
    }
}
