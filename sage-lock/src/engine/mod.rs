//! The lease engine every primitive shares: acquire (waiting with a deadline, retries, replica
//! acknowledgement) → hold (renewal, watchdog, loss) → release.
//!
//! A primitive states what its scripts do through [`Rules`]; the engine owns the rest: tokens,
//! deadlines, backoff, lease arithmetic, renewal, loss detection, cancellation safety, tracing and
//! metrics. It sits on [`Connection`] (connection state) and below the primitives and the public
//! [`LockClient`](crate::LockClient) façade.

mod acquire;
mod fences;
mod handoff;
mod hold;
mod multi;
mod reentry;
mod release;
mod token;
mod waiters;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::bytes::Bytes;
use tracing::Instrument as _;

use crate::connection::Connection;
use crate::error::LockError;
use crate::key::LockKeys;
use crate::notify::Notifier;
use crate::options::LockSettings;
use crate::renewal::{RenewTarget, Renewer};
use crate::scripts::ScriptCall;

pub(crate) use acquire::{Mode, acquire};
pub(crate) use hold::{Held, hold};
pub(crate) use multi::{Unit, run_all};
pub(crate) use waiters::Waiters;

/// How long [`Locks::try_with_lock`](crate::Locks::try_with_lock) retries transient failures at
/// most, before it returns [`TimedOut`](crate::LockError::TimedOut) (bounded by
/// the usable lease as well).
pub const TRY_LOCK_RETRY_WINDOW: Duration = Duration::from_secs(1);
pub use crate::connection::RELEASE_TIMEOUT;

/// How long a waiter keeps its place in a lock's server-side queue without trying again (or
/// less: never past the end of its wait): a waiter that died (or stalled this long) is skipped
/// after at most this long.
pub(crate) const WAITER_TTL: Duration = Duration::from_secs(2);
/// How long a lock's queue (its list and deadlines) lasts after the last attempt that queued or
/// refreshed a place: twice the longest place.
pub(crate) const QUEUE_TTL: Duration = Duration::from_secs(4);
/// The longest lease a release gives the queued waiter it hands the lock to (until that waiter
/// renews it to its own lease): a waiter that died in the queue keeps the lock at most this long.
pub(crate) const HANDOFF_LEASE: Duration = WAITER_TTL;

/// The lease a release by a holder of `lease` gives the waiter it hands the lock to: its own
/// lease, at most [`HANDOFF_LEASE`]. A waiter that died while queued then keeps the lock no
/// longer than the releaser's lease (the time users chose to lose to a dead holder).
pub(crate) fn handoff_lease(lease: Duration) -> Duration {
    lease.min(HANDOFF_LEASE)
}

/// The longest a queued waiter sleeps between attempts (it refreshes its place on each), and so
/// the most a lost release notification costs.
pub(crate) const QUEUED_POLL: Duration = Duration::from_millis(500);

/// What one primitive's scripts do. Every call touches the keys of one lock only (one slot).
///
/// The acquire script replies `{1, fencing_token}` when granted (also when the key already holds
/// this token, so a retry after an unknown outcome is safe) or `{0, pttl_ms}` when busy; the
/// release script replies 1 when it removed this token's hold, else 0 (or `{1 | 0, head}` when
/// it notified the queue's next waiter `head`, see [`Rules::notifies`]); the shorten script
/// replies 1 when it set this token's hold to expire in `keep_for`, else 0.
pub(crate) trait Rules: Send + Sync + fmt::Debug {
    /// One acquisition attempt by `token` for `lease` that does not wait: it neither queues nor
    /// marks the key as waited for. Defaults to [`Rules::wait_call`] with no waiter TTL.
    fn acquire_call(&self, keys: &LockKeys, token: &Bytes, lease: Duration) -> ScriptCall<'static> {
        self.wait_call(keys, token, lease, Duration::ZERO)
    }
    /// Gives up `token`'s hold, if it still has one. A primitive that hands the lock to the next
    /// queued waiter on release grants it `handoff_lease` (see [`handoff_lease`]).
    fn release_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        handoff_lease: Duration,
    ) -> ScriptCall<'static>;
    /// Ends `token`'s hold in `keep_for` instead of now (the minimum hold,
    /// [`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least)): the hold stays, with
    /// `keep_for` as its expiry, if it is still `token`'s. `keep_for` may exceed the lease.
    fn shorten_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        keep_for: Duration,
    ) -> ScriptCall<'static>;
    /// Where `token`'s hold lives, for the batched renewal.
    fn renew_target(&self, keys: &LockKeys) -> RenewTarget;
    /// One attempt of a waiting acquisition. A primitive with a server-side waiter queue
    /// enqueues a busy caller here (its place lasts `waiter_ttl` unless it tries again) and
    /// grants only to the queue's head; the release call then removes `token` from the queue
    /// too. One that announces its releases marks the key as waited for (for `waiter_ttl`), so
    /// its releases publish only then. A zero `waiter_ttl` means the caller does not wait.
    fn wait_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        lease: Duration,
        waiter_ttl: Duration,
    ) -> ScriptCall<'static>;
    /// Whether the release call publishes the queue's new head on the lock's release channel
    /// ([`crate::notify::channel`]), so waiters can wait for the message instead of polling.
    fn notifies(&self) -> bool {
        false
    }
    /// Whether [`Rules::wait_call`] queues a refused waiting caller on the server: its place
    /// holds up later callers until it ends, so a caller that stops waiting leaves the queue
    /// with [`Rules::release_call`]. Defaults to [`Rules::notifies`] (a primitive that names the
    /// next waiter on release has a queue).
    fn queues(&self) -> bool {
        self.notifies()
    }
    /// Whether this process's waiting calls of this kind for one key line up locally, one of
    /// them asking the server at a time ([`crate::engine`]'s `waiters`): right where one holder
    /// at a time is the rule and every waiter wants the same (the mutex). `false` (the default):
    /// each waiting call queues on the server itself, so calls that could share (readers, a
    /// semaphore's holders, families of other limits) and calls of other primitives on the same
    /// name keep the server's arrival order, within a process too.
    fn local_line(&self) -> bool {
        false
    }
    /// For a primitive whose releases do not name the next owner on the lock's own channel: the
    /// key whose release channel ([`crate::notify::channel`]) its releases publish on while
    /// callers wait, so waiters in any process retry at once instead of at their next poll. A
    /// message is the token of a waiter the release lets in (the release call's reply names it
    /// too, as `{released, token}`, when it is the only one), or empty for "every waiter, try
    /// again". `None` (the default): none. Asked only once a waiting caller is refused.
    fn release_announcement(&self, keys: &LockKeys) -> Option<Bytes> {
        let _ = keys;
        None
    }
    /// The key whose release channel a waiting caller watches: the lock's own for a primitive
    /// whose releases name the next owner there ([`Rules::notifies`]), else
    /// [`Rules::release_announcement`]'s.
    fn watched_key(&self, keys: &LockKeys) -> Option<Bytes> {
        if self.notifies() {
            Some(keys.lock.clone())
        } else {
            self.release_announcement(keys)
        }
    }
    /// The keys whose release channels a waiting caller watches: [`Rules::watched_key`]'s, or
    /// for a caller of several keys queued on each, every one of them (the first is the one
    /// whose release may name this caller with a grant).
    fn watched_keys(&self, keys: &LockKeys) -> Vec<Bytes> {
        self.watched_key(keys).into_iter().collect()
    }
    /// What this primitive's owner tokens start with, so that other scripts sharing its keys
    /// can tell its waiters apart: empty (the default), the multi-key lock's `m` (its waiters
    /// are never handed one key alone), or the semaphore's `s<permits>-` (a release hands a
    /// waiter a permit only within the waiter's own limit). Tokens are otherwise hex digits;
    /// a prefix never holds `:`.
    fn token_prefix(&self) -> &[u8] {
        b""
    }
    /// The key a hold granted without waiting may be released from with a plain `DELIFEQ key
    /// token` (where the server has it) instead of the release call: the primitive's scripts
    /// change the key's value once anybody queues behind the holder, so the command deletes
    /// only when there is nobody to notify. `None` (the default): always the release call.
    fn plain_release_key(&self, keys: &LockKeys) -> Option<Bytes> {
        let _ = keys;
        None
    }
    /// Which kind of lock this is, for reentrancy: a reentrant call runs at once only under a
    /// hold of the same kind on the same key. Distinct rules types differ by default; override
    /// it when one type states several kinds (say, shared and exclusive).
    fn kind(&self) -> &'static str {
        std::any::type_name::<Self>()
    }
    /// Whether a hold of `kind` ([`Rules::kind`]) on the same key keeps this call out for as
    /// long as it lasts, whoever holds it: a waiting call nested in the calling task's own
    /// such hold could only time out. `false` (the default) where holders share (readers among
    /// themselves, a semaphore's permits); a mutex overrides it for its own kind, a writer for
    /// both kinds of its lock, a reader for the writer's.
    fn blocked_by(&self, kind: &str) -> bool {
        let _ = kind;
        false
    }
}

/// One client's engine: its connection state, its renewal scheduler, its local waiters and
/// their release notifications.
pub(crate) struct Engine {
    pub(crate) conn: Arc<Connection>,
    pub(crate) renewer: Renewer,
    pub(crate) waiters: Waiters,
    pub(crate) notifier: Notifier,
    /// Last fencing token seen per key (detects a counter that went backwards).
    pub(crate) fences: fences::Fences,
    /// Releases under way, which [`LockClient::quit`](crate::LockClient::quit) lets finish.
    pub(crate) releases: Arc<release::Releases>,
    /// Acquisitions waiting between attempts (and, once told to quit, leaving the server's
    /// queues), which [`LockClient::quit`](crate::LockClient::quit) lets leave.
    pub(crate) waiting: Arc<release::Releases>,
    /// Set by [`LockClient::quit`](crate::LockClient::quit): waiting acquisitions stop.
    pub(crate) quitting: Quitting,
    /// Set once a grant warned that its round trip was long for its lease (said once).
    pub(crate) warned_round_trip: std::sync::atomic::AtomicBool,
}

/// The start of [`LockClient::quit`](crate::LockClient::quit): waiting acquisitions stop, and
/// leave their places in the server's queues while the connections are still open.
#[derive(Debug, Default)]
pub(crate) struct Quitting {
    set: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Quitting {
    /// Tells every waiting acquisition to stop.
    pub(crate) fn start(&self) {
        self.set.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Whether [`Quitting::start`] ran.
    pub(crate) fn is_set(&self) -> bool {
        self.set.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Resolves once [`Quitting::start`] ran.
    pub(crate) async fn signalled(&self) {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        // Registered before the check: a start in between still wakes this.
        notified.as_mut().enable();
        if !self.is_set() {
            notified.await;
        }
    }
}

impl Engine {
    /// An engine on `conn` whose renewal calls renew at most `renewal_batch_limit` leases each.
    pub(crate) fn new(conn: Connection, renewal_batch_limit: usize) -> Self {
        let conn = Arc::new(conn);
        Engine {
            renewer: Renewer::new(Arc::clone(&conn), renewal_batch_limit),
            notifier: Notifier::new(conn.template().clone()),
            conn,
            waiters: Waiters::default(),
            fences: fences::Fences::default(),
            releases: Arc::default(),
            waiting: Arc::default(),
            quitting: Quitting::default(),
            warned_round_trip: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

/// Acquires per `mode`, runs `body` while the hold lasts, releases: `Ok(None)` only in
/// [`Mode::Try`] when busy. The body is dropped (cancelled) when the hold is lost.
///
/// With [`LockSettings::reentrant`], a call for a lock the current task already holds (same
/// client, kind and key) runs `body` at once under the held lease, and releases nothing.
pub(crate) async fn run<F: Future>(
    engine: Arc<Engine>,
    rules: Arc<dyn Rules>,
    settings: Arc<LockSettings>,
    keys: Arc<LockKeys>,
    mode: Mode,
    body: F,
) -> Result<Option<F::Output>, LockError> {
    if !crate::runtime::is_current() {
        return Err(outside_runtime(keys.display(), &settings.namespace));
    }
    engine.refuse_wrong_node().await?;
    let span =
        tracing::debug_span!("sage_lock", key = %keys.display(), namespace = %settings.namespace);
    if settings.reentrant
        && let Some(lease) = reentry::held(&engine, &*rules, &keys.lock)
    {
        span.in_scope(|| tracing::debug!("reentrant call: runs under the lock this task holds"));
        return Ok(Some(crate::lease::scope(lease, body).await));
    }
    let acquired = Box::pin(acquire(&engine, &rules, &settings, &keys, mode))
        .instrument(span.clone())
        .await?;
    let Some(held) = acquired else {
        return Ok(None);
    };
    // Boxed, so the caller's future stays small whatever the body.
    Box::pin(hold(held, &settings, body, span)).await.map(Some)
}

impl Engine {
    /// [`LockError::InvalidArgument`] when the node a `from_fred` client reaches cannot hold
    /// locks (a cluster node through a plain configuration, a Sentinel, a replica): asked on the
    /// first call (again, after an unanswered check, once connected), then remembered.
    pub(crate) async fn refuse_wrong_node(&self) -> Result<(), LockError> {
        match self.conn.node_refusal().await {
            Some(problem) => Err(LockError::invalid("from_fred", problem)),
            None => Ok(()),
        }
    }
}

/// The error of a lock call made outside a Tokio runtime (see [`crate::runtime`]).
pub(crate) fn outside_runtime(key: &str, namespace: &str) -> LockError {
    LockError::backend(
        format!(
            "acquiring lock {} in namespace {namespace:?}",
            crate::error::quoted(key)
        ),
        crate::runtime::missing(),
    )
}

/// [`run`] in [`Mode::Wait`], for the primitives' waiting calls: a zero `wait` is
/// [`LockError::InvalidArgument`] (`try_fn` names the call that does not wait).
pub(crate) async fn run_waiting<F: Future>(
    engine: Arc<Engine>,
    rules: Arc<dyn Rules>,
    settings: Arc<LockSettings>,
    keys: Arc<LockKeys>,
    wait: Duration,
    try_fn: &'static str,
    body: F,
) -> Result<F::Output, LockError> {
    if wait.is_zero() {
        return Err(LockError::invalid(
            "wait_timeout",
            format!("must be positive, e.g. Duration::from_secs(2); use {try_fn} to not wait"),
        ));
    }
    match run(engine, rules, settings, keys, Mode::Wait(wait), body).await? {
        Some(output) => Ok(output),
        None => Err(LockError::invalid(
            "wait_timeout",
            "internal: busy result in waiting mode",
        )),
    }
}
