//! [`Locks`] and [`LockOptions`]: acquire → run the body under renewal → release.

use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument as _;

use fred::bytes::Bytes;

use crate::client::{Ack, ClientInner, DEADLINE_REACHED, LockClient, OpError};
use crate::error::{LockError, LossReason, TimeoutReason};
use crate::global;
use crate::key::{KeyCodec, LockKeys};
use crate::lease::{Lease, drift, scope};
use crate::observe::{Event, Metrics};
use crate::renewal::{Registration, Renewal, Renewer};
use crate::retry::{Backoff, Failure, classify, deadline_after, remaining};
use crate::scripts::AcquireReply;

/// The shortest lease accepted by [`LockOptions::lease`] (see [`LockOptions`]'s example).
pub const MIN_LEASE: Duration = Duration::from_millis(30);
/// How long [`Locks::try_with_lock`] retries transient failures at most (see
/// [`Locks::with_lock`]'s example).
pub const TRY_LOCK_RETRY_WINDOW: Duration = Duration::from_secs(1);
/// How long releasing may take before [`Locks::with_lock`] returns anyway (see its example).
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(1);

/// Options of a lock family. Unset options take the service-wide defaults
/// ([`crate::global::set_defaults`]), which default to a 30 s lease, namespace `lock` and replica
/// acknowledgement on.
///
/// ```
/// use std::time::Duration;
/// use sage_lock::LockOptions;
///
/// let options = LockOptions::new()
///     .lease(Duration::from_secs(10))
///     .namespace("account-updates")
///     .replica_acknowledgement(false);
/// ```
#[derive(Debug, Clone, Default)]
pub struct LockOptions {
    lease: Option<Duration>,
    namespace: Option<String>,
    replica_acknowledgement: Option<bool>,
}

impl LockOptions {
    /// Options with nothing set.
    #[must_use]
    pub fn new() -> Self {
        LockOptions::default()
    }

    /// How long a lock stays valid without renewal (at least 30 ms). Renewal keeps it alive while
    /// the body runs; after a crash, others wait up to this long.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The namespace: locks in different namespaces never conflict. Must not be empty.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Whether replicated deployments wait for replicas to acknowledge acquisition and renewal
    /// (`WAIT`). Off favours availability over failover safety. Ignored on standalone servers.
    #[must_use]
    pub fn replica_acknowledgement(mut self, on: bool) -> Self {
        self.replica_acknowledgement = Some(on);
        self
    }

    pub(crate) fn resolve(self) -> LockSettings {
        let defaults = global::defaults();
        let namespace: Arc<str> = self
            .namespace
            .map_or_else(|| Arc::from(defaults.namespace.as_str()), Arc::from);
        LockSettings {
            lease: self.lease.unwrap_or(defaults.lease),
            metrics: Arc::new(Metrics::new(&namespace)),
            namespace,
            replica_acknowledgement: self
                .replica_acknowledgement
                .unwrap_or(defaults.replica_acknowledgement),
        }
    }
}

/// Resolved, validated options of one lock family.
#[derive(Debug, Clone)]
pub(crate) struct LockSettings {
    pub(crate) lease: Duration,
    pub(crate) namespace: Arc<str>,
    pub(crate) replica_acknowledgement: bool,
    pub(crate) metrics: Arc<Metrics>,
}

impl LockSettings {
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        validate_lease(self.lease)?;
        validate_namespace(&self.namespace)
    }
}

pub(crate) fn validate_lease(lease: Duration) -> Result<(), LockError> {
    if lease < MIN_LEASE {
        return Err(LockError::invalid(
            "lease",
            format!(
                "must be at least 30ms, got {lease:?}; choose one comfortably longer than network latency and process pauses, e.g. Duration::from_secs(10)"
            ),
        ));
    }
    if lease > Duration::from_secs(60 * 60 * 24 * 365) {
        return Err(LockError::invalid(
            "lease",
            format!("must be at most one year, got {lease:?}"),
        ));
    }
    Ok(())
}

pub(crate) fn validate_namespace(namespace: &str) -> Result<(), LockError> {
    if namespace.is_empty() {
        return Err(LockError::invalid(
            "namespace",
            "must not be empty; use a name per kind of resource, e.g. \"account-updates\" (the default is \"lock\")",
        ));
    }
    Ok(())
}

/// A family of locks over keys of type `K` with one lease, namespace and acknowledgement mode.
///
/// Made by [`LockClient::lock`] or [`LockClient::lock_with`]; cheap to clone. See
/// [`Locks::with_lock`] for an example.
pub struct Locks<K: ?Sized> {
    client: LockClient,
    settings: Arc<LockSettings>,
    _key: PhantomData<fn(&K)>,
}

impl<K: ?Sized> Clone for Locks<K> {
    fn clone(&self) -> Self {
        Locks {
            client: self.client.clone(),
            settings: Arc::clone(&self.settings),
            _key: PhantomData,
        }
    }
}

impl<K: ?Sized> fmt::Debug for Locks<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locks")
            .field("lease", &self.settings.lease)
            .field("namespace", &self.settings.namespace)
            .field(
                "replica_acknowledgement",
                &self.settings.replica_acknowledgement,
            )
            .finish_non_exhaustive()
    }
}

/// How an acquisition treats a busy lock.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// Retry a busy lock until the wait runs out.
    Wait(Duration),
    /// Report a busy lock at once.
    Try,
}

impl<K: ?Sized> Locks<K> {
    pub(crate) fn new(client: LockClient, settings: LockSettings) -> Self {
        Locks {
            client,
            settings: Arc::new(settings),
            _key: PhantomData,
        }
    }

    /// The lease duration.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.settings.lease
    }

    /// The namespace.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.settings.namespace
    }

    /// Waits up to `wait_timeout` for the lock on `key`, runs `body` while holding it (renewing
    /// as needed), releases it, and returns the body's output.
    ///
    /// Construct the work inside `body`: work started before the call may run unprotected, and
    /// tasks the body spawns without awaiting them may outlive the lock. The body runs at most
    /// once and is never retried.
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`]: `wait_timeout` is zero.
    /// - [`LockError::TimedOut`]: not acquired within `wait_timeout` (which covers replies, retry
    ///   delays and replica acknowledgement, not the body); cleanup may add up to a second.
    /// - [`LockError::LockLost`]: the lease was lost; the body future was dropped.
    /// - [`LockError::Backend`]: a non-transient server or connection error.
    ///
    /// Dropping the returned future stops renewal and releases the lock in the background.
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// use std::time::Duration;
    ///
    /// let locks = client.lock::<String>();
    /// let balance = locks
    ///     .with_lock("account:42", Duration::from_secs(2), async { 100 })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn with_lock<Q, F>(
        &self,
        key: &Q,
        wait_timeout: Duration,
        body: F,
    ) -> impl Future<Output = Result<F::Output, LockError>> + use<K, Q, F>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        let keys = self.keys(key);
        // Boxed once here, so the futures wrapping it stay small however large the body is.
        let body = Box::pin(body);
        let (client, settings) = (Arc::clone(&self.client.inner), Arc::clone(&self.settings));
        async move {
            if wait_timeout.is_zero() {
                return Err(LockError::invalid(
                    "wait_timeout",
                    "must be positive, e.g. Duration::from_secs(2); use try_with_lock to not wait",
                ));
            }
            match run(client, settings, keys, Mode::Wait(wait_timeout), body).await? {
                Some(output) => Ok(output),
                None => Err(LockError::invalid(
                    "wait_timeout",
                    "internal: busy result in waiting mode",
                )),
            }
        }
    }

    /// Runs `body` under the lock on `key` if it is free now: `Ok(None)` when another owner holds
    /// it (the body is not run), `Ok(Some(output))` after running the body and releasing.
    ///
    /// Transient failures are retried for up to about one second (bounded by the usable lease),
    /// then [`LockError::TimedOut`]. Other errors as for [`Locks::with_lock`].
    pub fn try_with_lock<Q, F>(
        &self,
        key: &Q,
        body: F,
    ) -> impl Future<Output = Result<Option<F::Output>, LockError>> + use<K, Q, F>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        let keys = self.keys(key);
        // Boxed once here, so the futures wrapping it stay small however large the body is.
        let body = Box::pin(body);
        let (client, settings) = (Arc::clone(&self.client.inner), Arc::clone(&self.settings));
        run(client, settings, keys, Mode::Try, body)
    }

    fn keys<Q: KeyCodec + ?Sized>(&self, key: &Q) -> Arc<LockKeys> {
        let mut encoded = Vec::new();
        key.encode_key(&mut encoded);
        Arc::new(LockKeys::new(&self.settings.namespace, &encoded))
    }
}

/// Acquire, run the body raced against loss of the lease, release.
async fn run<F: Future>(
    client: Arc<ClientInner>,
    settings: Arc<LockSettings>,
    keys: Arc<LockKeys>,
    mode: Mode,
    body: F,
) -> Result<Option<F::Output>, LockError> {
    let span =
        tracing::debug_span!("sage_lock", key = %keys.display, namespace = %settings.namespace);
    let Some(mut held) = Box::pin(acquire(&client, &settings, &keys, mode))
        .instrument(span.clone())
        .await?
    else {
        return Ok(None);
    };
    let (lost_tx, lost_rx) = oneshot::channel();
    let renewal = Renewal {
        keys: Arc::clone(&keys),
        token: held.token.clone(),
        lease_duration: settings.lease,
        replica_ack: settings.replica_acknowledgement,
        lease: held.lease.clone(),
        granted_by: held.granted_by.clone(),
        metrics: Arc::clone(&settings.metrics),
    };
    held.renewal = Some(Renewer::register(&client, renewal, lost_tx));
    let body = scope(held.lease.clone(), body);
    tokio::select! {
        biased;
        reason = lost_rx => {
            let reason = reason.unwrap_or(LossReason::RenewalFailed("renewal task ended".into()));
            Err(Box::pin(held.lost(reason)).instrument(span).await)
        }
        () = lease_ran_out(&held.lease) => {
            // The renewer did not report in time (its task starved or gone): never let the body
            // run past the usable lease.
            let reason = held.renewal.take().map_or_else(
                || LossReason::RenewalFailed("no renewal completed in time".into()),
                Registration::into_loss,
            );
            Err(Box::pin(held.lost(reason)).instrument(span).await)
        }
        output = body => {
            Box::pin(held.release()).instrument(span).await;
            Ok(Some(output))
        }
    }
}

/// Resolves once the usable lease has run out without being extended: the safety net behind the
/// renewer's own loss report. Fires a drift margin after the lease's end (still before the
/// server-side expiry) so the renewer, which gives up at the end, normally reports first.
async fn lease_ran_out(lease: &Lease) {
    loop {
        let valid_until = lease.valid_until();
        tokio::time::sleep_until(valid_until + lease.margin() / 2).await;
        if lease.valid_until() <= valid_until {
            return;
        }
    }
}

/// A lock this call may hold. Dropped without [`Held::release`] or [`Held::lost`] (the call was
/// cancelled), it stops renewal and releases in the background.
struct Held {
    client: Arc<ClientInner>,
    keys: Arc<LockKeys>,
    namespace: Arc<str>,
    metrics: Arc<Metrics>,
    token: Bytes,
    lease: Lease,
    /// Renewal of the held lease; dropping it stops renewal.
    renewal: Option<Registration>,
    armed: bool,
    /// The primary that granted the lock, when the deployment is replicated.
    granted_by: Option<fred::types::config::Server>,
}

impl Held {
    /// Releases the lock, taking at most [`RELEASE_TIMEOUT`].
    async fn release(mut self) {
        self.stop_renewal();
        // Stay armed until done: dropped mid-release, the release finishes in the background.
        release_now(&self.client, &self.keys, &self.token, &self.metrics).await;
        self.armed = false;
        self.metrics.held(self.lease.held_for());
        tracing::debug!(held = ?self.lease.held_for(), "lock released");
    }

    /// Gives up an acquisition: an attempt whose reply was lost may still have been granted, so
    /// delete the key if it holds our token (bounded by [`RELEASE_TIMEOUT`]).
    async fn abandon(mut self) {
        release_now(&self.client, &self.keys, &self.token, &self.metrics).await;
        self.armed = false;
    }

    /// Records a loss, makes a best-effort release, and builds the error.
    async fn lost(mut self, reason: LossReason) -> LockError {
        self.stop_renewal();
        self.client.stats.record(&self.metrics, Event::Loss);
        if self.client.deployment.is_replicated() {
            // Likely a failover: idle dedicated connections may point at the old primary.
            self.client.pool.discard_idle();
        }
        self.metrics.held(self.lease.held_for());
        tracing::warn!(reason = %reason, held = ?self.lease.held_for(), "lock lost; body cancelled");
        if reason != LossReason::NotOwner {
            release_now(&self.client, &self.keys, &self.token, &self.metrics).await;
        }
        self.armed = false;
        LockError::LockLost {
            key: self.keys.display.to_string(),
            namespace: self.namespace.to_string(),
            held: self.lease.held_for(),
            reason,
        }
    }

    fn stop_renewal(&mut self) {
        self.renewal = None;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stop_renewal();
        if self.armed {
            release_in_background(&self.client, &self.keys, &self.token, &self.metrics);
        }
    }
}

/// Compare-and-delete, bounded by [`RELEASE_TIMEOUT`]; failures are logged (the lease expires).
async fn release_now(client: &ClientInner, keys: &LockKeys, token: &Bytes, metrics: &Metrics) {
    match client
        .release(keys, token, Instant::now() + RELEASE_TIMEOUT)
        .await
    {
        Ok(true) => client.stats.record(metrics, Event::Release),
        Ok(false) => tracing::debug!("release found the lock no longer ours"),
        Err(error) => tracing::warn!(?error, "release failed; the lock expires with its lease"),
    }
}

fn release_in_background(
    client: &Arc<ClientInner>,
    keys: &Arc<LockKeys>,
    token: &Bytes,
    metrics: &Arc<Metrics>,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (client, keys, token, metrics) = (
        Arc::clone(client),
        Arc::clone(keys),
        token.clone(),
        Arc::clone(metrics),
    );
    runtime.spawn(async move {
        release_now(&client, &keys, &token, &metrics).await;
    });
}

/// A random 128-bit owner token, as 32 hex digits.
fn new_token() -> Bytes {
    Bytes::from(format!("{:032x}", rand::random::<u128>()))
}

/// Acquires per `mode`: `Ok(None)` only in [`Mode::Try`] when the lock is busy.
async fn acquire(
    client: &Arc<ClientInner>,
    settings: &LockSettings,
    keys: &Arc<LockKeys>,
    mode: Mode,
) -> Result<Option<Held>, LockError> {
    let start = Instant::now();
    let lease_duration = settings.lease;
    let usable = lease_duration.saturating_sub(drift(lease_duration));
    let deadline = match mode {
        Mode::Wait(wait) => start
            .checked_add(wait)
            .unwrap_or_else(|| deadline_after(wait)),
        Mode::Try => start + TRY_LOCK_RETRY_WINDOW.min(usable),
    };
    let namespace = &settings.namespace;
    let timed_out = |reason: TimeoutReason| {
        client.stats.record(&settings.metrics, Event::Timeout);
        tracing::debug!(%reason, waited = ?start.elapsed(), "lock acquisition timed out");
        LockError::TimedOut {
            key: keys.display.to_string(),
            namespace: namespace.to_string(),
            waited: start.elapsed(),
            reason,
        }
    };
    let token = new_token();
    // Armed from the first attempt on: an attempt whose reply is lost may still have been granted.
    let mut held = Held {
        client: Arc::clone(client),
        keys: Arc::clone(keys),
        namespace: Arc::clone(namespace),
        metrics: Arc::clone(&settings.metrics),
        token: token.clone(),
        lease: Lease::new(
            Arc::clone(&keys.display),
            Arc::clone(namespace),
            0,
            start,
            start,
            Duration::ZERO,
        ),
        renewal: None,
        armed: true,
        granted_by: None,
    };
    // Registered on the first "busy" reply: woken when this process releases the key.
    let mut waiter = None;
    let result = acquire_loop(
        client,
        settings,
        keys,
        mode,
        deadline,
        &mut held,
        &mut waiter,
    )
    .await;
    if let Some(waiter) = waiter {
        client.forget_waiter(&keys.lock, waiter);
    }
    match result {
        Ok(Some(granted)) => {
            let waited = start.elapsed();
            client.stats.acquired(&settings.metrics, waited);
            tracing::debug!(
                attempts = granted.attempts,
                ?waited,
                fencing_token = granted.lease.fencing_token(),
                "lock acquired"
            );
            held.lease = granted.lease;
            held.granted_by = granted.granted_by;
            Ok(Some(held))
        }
        Ok(None) => Ok(None),
        Err(Stop::TimedOut(reason)) => {
            if held.armed {
                held.abandon().await;
            }
            Err(timed_out(reason))
        }
        Err(Stop::Lost(reason)) => Err(held.lost(reason).await),
        Err(Stop::Failed(error)) => {
            held.abandon().await;
            let hint = if error.details().starts_with("NOPERM") {
                " (the server's ACL denies a command sage-lock needs: every deployment needs \
                 EVALSHA and EVAL; replicated ones also ROLE, and WAIT unless replica \
                 acknowledgement is off; grant them to this user)"
            } else {
                ""
            };
            Err(LockError::backend(
                format!(
                    "acquiring lock {} in namespace {namespace:?}{hint}",
                    keys.display
                ),
                error,
            ))
        }
    }
}

struct Granted {
    lease: Lease,
    attempts: u32,
    granted_by: Option<fred::types::config::Server>,
}

enum Stop {
    TimedOut(TimeoutReason),
    Lost(LossReason),
    Failed(fred::error::Error),
}

fn timeout_reason(last_transient: Option<String>, holder_pttl: Option<Duration>) -> TimeoutReason {
    match (last_transient, holder_pttl) {
        (Some(error), None) => TimeoutReason::Unavailable(error),
        (None, None) => {
            TimeoutReason::Unavailable("no reply from the server within the wait".into())
        }
        (_, Some(_)) => TimeoutReason::Busy,
    }
}

async fn acquire_loop(
    client: &ClientInner,
    settings: &LockSettings,
    keys: &LockKeys,
    mode: Mode,
    deadline: Instant,
    held: &mut Held,
    waiter: &mut Option<Arc<tokio::sync::Notify>>,
) -> Result<Option<Granted>, Stop> {
    let lease_duration = settings.lease;
    let namespace = &settings.namespace;
    let mut backoff = Backoff::new(Duration::from_millis(2), Duration::from_millis(200));
    // What the last attempt that got an answer (or a real failure) found.
    let mut last_transient: Option<String> = None;
    let mut holder_pttl: Option<Duration> = None;
    let mut attempts = 0_u32;
    loop {
        attempts += 1;
        // Until an answer says otherwise, this attempt may have been granted.
        held.armed = true;
        let sent = Instant::now();
        let outcome = client
            .acquire(
                keys,
                &held.token,
                lease_duration,
                settings.replica_acknowledgement,
                deadline,
            )
            .await;
        match outcome {
            Ok((AcquireReply::Granted { fence }, Ack::Confirmed, granted_by)) => {
                let valid_until = sent + lease_duration - drift(lease_duration);
                if Instant::now() >= valid_until {
                    return Err(Stop::Lost(LossReason::ExpiredBeforeStart));
                }
                let lease = Lease::new(
                    Arc::clone(&keys.display),
                    Arc::clone(namespace),
                    fence,
                    sent,
                    valid_until,
                    drift(lease_duration),
                );
                return Ok(Some(Granted {
                    lease,
                    attempts,
                    granted_by,
                }));
            }
            Ok((
                AcquireReply::Granted { .. },
                Ack::Short {
                    acknowledged,
                    required,
                },
                _,
            )) => {
                // WAIT used up the rest of the wait: the grant cannot be trusted.
                return Err(Stop::TimedOut(TimeoutReason::NotAcknowledged {
                    acknowledged,
                    required,
                }));
            }
            Ok((AcquireReply::Granted { .. }, Ack::NotPrimary(role), _)) => {
                return Err(Stop::Lost(LossReason::RoleChanged(role)));
            }
            Ok((AcquireReply::Busy { pttl_ms }, _, _)) => {
                if matches!(mode, Mode::Try) {
                    return Ok(None);
                }
                // A definite "busy" (the script checks our token too): we hold nothing.
                held.armed = false;
                client.stats.record(&settings.metrics, Event::BusyRetry);
                holder_pttl =
                    Some(u64::try_from(pttl_ms).map_or(Duration::ZERO, Duration::from_millis));
                last_transient = None;
            }
            Err(OpError::Failed(error)) => {
                if classify(&error) == Failure::Permanent {
                    return Err(Stop::Failed(error));
                }
                if error.details() == DEADLINE_REACHED && remaining(deadline).is_zero() {
                    // Cut short by our own deadline: keep what the previous attempts found.
                    return Err(Stop::TimedOut(timeout_reason(last_transient, holder_pttl)));
                }
                client
                    .stats
                    .record(&settings.metrics, Event::TransientRetry);
                tracing::debug!(%error, "transient failure while acquiring; retrying");
                last_transient = Some(error.to_string());
                holder_pttl = None;
            }
            Err(OpError::PoolExhausted) => {
                return Err(Stop::TimedOut(TimeoutReason::PoolExhausted {
                    max_connections: client.pool.max_connections(),
                }));
            }
        }
        let left = remaining(deadline);
        if left.is_zero() {
            return Err(Stop::TimedOut(timeout_reason(last_transient, holder_pttl)));
        }
        // Never sleep past the deadline, nor (much) past the moment the holder's lease ends.
        let limit = holder_pttl.map_or(left, |pttl| left.min(pttl.max(Duration::from_millis(1))));
        let delay = backoff.next_delay(limit);
        tracing::trace!(
            attempts,
            ?delay,
            busy = holder_pttl.is_some(),
            "lock not acquired yet; waiting"
        );
        if holder_pttl.is_some() && matches!(mode, Mode::Wait(_)) && waiter.is_none() {
            *waiter = Some(client.waiter(&keys.lock));
        }
        match waiter {
            Some(notify) if holder_pttl.is_some() => {
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = notify.notified() => {}
                }
            }
            _ => tokio::time::sleep(delay).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_futures_stay_small_whatever_the_body() {
        let client = LockClient::from_fred(fred::clients::Client::default());
        let locks: Locks<str> = client.lock();
        let big = [7_u8; 4096];
        let body = async move { big.len() };
        let waiting = locks.with_lock("k", Duration::from_secs(1), body);
        assert!(
            std::mem::size_of_val(&waiting) < 1024,
            "{}",
            std::mem::size_of_val(&waiting)
        );
        let trying = locks.try_with_lock("k", async move { big.len() });
        assert!(
            std::mem::size_of_val(&trying) < 1024,
            "{}",
            std::mem::size_of_val(&trying)
        );
    }

    #[test]
    fn invalid_options_name_the_fix() {
        let client = LockClient::from_fred(fred::clients::Client::default());
        let short = client.lock_with::<str>(LockOptions::new().lease(Duration::from_millis(5)));
        assert!(matches!(
            short,
            Err(LockError::InvalidArgument {
                argument: "lease",
                ..
            })
        ));
        let empty = client.lock_with::<str>(LockOptions::new().namespace(""));
        assert!(matches!(
            empty,
            Err(LockError::InvalidArgument {
                argument: "namespace",
                ..
            })
        ));
    }
}
