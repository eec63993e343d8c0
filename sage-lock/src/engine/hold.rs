//! Holding: the body runs under renewal, raced against loss of the hold; then release.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::config::Server;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::release::{Release, Released};
use super::{Engine, Rules, reentry};
use crate::error::{LockError, LossReason};
use crate::key::LockKeys;
use crate::lease::{Lease, scope};
use crate::observe::{Event, Metrics};
use crate::options::LockSettings;
use crate::renewal::{Registration, Renewal, Renewer};

/// Runs `body` while `held` lasts: renewed in the background, cancelled on loss, released after.
pub(crate) async fn hold<F: Future>(
    mut held: Held,
    settings: &LockSettings,
    body: F,
    span: tracing::Span,
) -> Result<F::Output, LockError> {
    let (lost_tx, lost_rx) = oneshot::channel();
    let renewal = held.renewal_of(&held.keys, settings);
    held.renewal = Some(held.engine.renewer.register(renewal, lost_tx));
    // From here on (the body may run) a release keeps the minimum hold, cancellation included.
    held.hold_at_least = settings.hold_at_least;
    held.body_started = true;
    let body = scope(held.lease.clone(), body);
    let body = reentry::scope(
        &held.engine,
        &*held.rules,
        held.keys.lock.clone(),
        held.lease.clone(),
        body,
    );
    let panicked = &held.body_panicked;
    let body = async move {
        let mut body = std::pin::pin!(body);
        std::future::poll_fn(|cx| {
            let _unwinding = PanicMark(panicked);
            body.as_mut().poll(cx)
        })
        .await
    };
    tokio::select! {
        biased;
        reason = lost_rx => {
            let reason = reason.unwrap_or(LossReason::RenewalFailed("renewal task ended".into()));
            Err(Box::pin(held.lost(reason, None)).instrument(span).await)
        }
        () = lease_ran_out(&held.lease, settings.lease, &held.engine.renewer) => {
            // The renewer did not report in time (its task starved or gone): never let the body
            // run past the usable lease.
            let reason = held.renewal.take().map_or_else(
                || crate::renewal::unrenewed(&held.engine.conn),
                Registration::into_loss,
            );
            Err(Box::pin(held.lost(reason, None)).instrument(span).await)
        }
        output = body => {
            Box::pin(held.release()).instrument(span).await;
            Ok(output)
        }
    }
}

/// How long after the end of the usable lease a loss must come to be put down to the process
/// not running: renewals and the safety net act before that end, so a loss noticed well after
/// it was noticed by a process that did not run in between.
pub(super) const STALL: Duration = Duration::from_millis(250);

/// `reason`, saying so when the loss of `lease` is noticed more than [`STALL`] after its usable
/// end with renewals that failed: a holder stopped past its lease (`SIGSTOP`, a VM pause, a
/// runtime whose threads were blocked) otherwise reads only "no renewal completed in time",
/// which points at the server (audit 46).
fn noticed_late(reason: LossReason, lease: &Lease) -> LossReason {
    let late = std::time::Instant::now().saturating_duration_since(lease.valid_until());
    match reason {
        LossReason::RenewalFailed(last) if late > STALL => LossReason::RenewalFailed(format!(
            "{last}; noticed {late:.1?} after the usable lease ran out: this process did not \
             run in between (stopped or paused, as by SIGSTOP or a VM pause, or its runtime's \
             threads were blocked)"
        )),
        other => other,
    }
}

/// Marks its flag when dropped while the thread unwinds: around a poll of the body, it tells
/// a body that panicked from a call that was cancelled (the hold is dropped either way).
struct PanicMark<'a>(&'a AtomicBool);

impl Drop for PanicMark<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// Resolves shortly before the usable lease runs out without being extended: the safety net
/// behind the renewer's own loss report (the renewer's task may be starved or gone). It fires
/// [`safety_lead`] before the lease's end, so even a timer that wakes a few milliseconds late
/// cancels the body while the lease is still valid. Every third of the lease it also makes
/// sure `renewer`'s task runs: the runtime that ran it may have shut down while this one (the
/// caller's) goes on.
pub(super) async fn lease_ran_out(lease: &Lease, lease_duration: Duration, renewer: &Renewer) {
    let lead = safety_lead(lease_duration, lease.margin());
    let check = (lease_duration / 3).max(Duration::from_millis(1));
    loop {
        // Real time (see `crate::lease`): recomputed after every wake-up, so a renewal that
        // extended the lease, or a tokio clock that ran ahead, only means sleeping again.
        let left = lease.remaining().saturating_sub(lead);
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(check)).await;
        renewer.keep_running();
    }
}

/// How long before the end of the usable lease the safety net fires: the drift margin, and at
/// least a tenth of the lease up to 10 ms (a coarse or busy timer may wake that late).
pub(super) fn safety_lead(lease: Duration, margin: Duration) -> Duration {
    margin.max((lease / 10).min(Duration::from_millis(10)))
}

/// A hold this call may have. Dropped without [`Held::release`] or [`Held::lost`] (the call was
/// cancelled), it stops renewal and releases in the background.
pub(crate) struct Held {
    pub(crate) engine: Arc<Engine>,
    pub(crate) rules: Arc<dyn Rules>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) namespace: Arc<str>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) token: Bytes,
    pub(crate) lease: Lease,
    /// Renewal of the held lease; dropping it stops renewal.
    pub(crate) renewal: Option<Registration>,
    /// Whether the server may hold this token (a release is owed).
    pub(crate) armed: bool,
    /// The lease a release of this hold gives the waiter it hands the lock to
    /// ([`super::handoff_lease`] of the hold's lease).
    pub(crate) handoff_lease: Duration,
    /// The primary that granted the hold, when the deployment is replicated.
    pub(crate) granted_by: Option<Server>,
    /// Minimum time from acquisition to release; zero until the body may have started.
    pub(crate) hold_at_least: Duration,
    /// Granted on the first attempt (nobody was waiting): the release tries the plain
    /// [`Rules::plain_release_key`] command first.
    pub(crate) uncontended: bool,
    /// The fencing token of each key of a several-key unit, in the unit's order (else empty).
    pub(crate) part_fences: Vec<u64>,
    /// The body may have run: the hold counts in the hold-time metric, and a release that
    /// finds the key gone reports a loss.
    pub(crate) body_started: bool,
    /// A release of this hold was sent (it may have run even if its call was dropped).
    pub(crate) release_sent: bool,
    /// The hold was counted as lost: its release counts nothing more.
    pub(crate) loss_counted: bool,
    /// The body panicked while it was polled (its hold is then dropped, not released after it).
    pub(crate) body_panicked: AtomicBool,
}

impl Held {
    /// The renewal of this hold's lease where it lives on `keys`: the hold's own key, or one
    /// part of a several-key unit.
    pub(super) fn renewal_of(&self, keys: &LockKeys, settings: &LockSettings) -> Renewal {
        Renewal {
            slot: keys.slot,
            target: self.rules.renew_target(keys),
            token: self.token.clone(),
            lease_duration: settings.lease,
            replica_ack: settings.replica_acknowledgement,
            lease: self.lease.clone(),
            granted_by: self.granted_by.clone(),
            metrics: Arc::clone(&settings.metrics),
        }
    }

    /// Releases the hold, taking at most [`RELEASE_TIMEOUT`](super::RELEASE_TIMEOUT).
    pub(crate) async fn release(mut self) {
        self.stop_renewal();
        // Held until the body ended, not until the server answered the release.
        let held = self.lease.held_for();
        let release = self.release_of();
        // Stay armed until done: dropped mid-release, the release finishes in the background
        // (and knows that this one may have run).
        self.release_sent = true;
        let released = release.run().await;
        self.armed = false;
        self.metrics.held(held);
        match released {
            Released::NotOurs => release.lost_before_release(held, "ended"),
            Released::Removed => tracing::debug!(?held, "lock released"),
            Released::Unsettled => {}
        }
    }

    /// The release of this hold's token, as things stand.
    fn release_of(&self) -> Release {
        Release {
            engine: Arc::clone(&self.engine),
            rules: Arc::clone(&self.rules),
            keys: Arc::clone(&self.keys),
            namespace: Arc::clone(&self.namespace),
            token: self.token.clone(),
            fence: self.lease.fencing_token(),
            metrics: Arc::clone(&self.metrics),
            handoff_lease: self.handoff_lease,
            keep_for: self.keep_for(),
            granted_by: self.granted_by.clone(),
            plain: self.uncontended,
            // Never granted (fencing tokens start at 1): the acquisition was cut short.
            undo: self.lease.fencing_token() == 0,
            sent_before: self.release_sent,
            after_loss: self.loss_counted,
        }
    }

    /// Gives up an acquisition: an attempt whose reply was lost may still have been granted, so
    /// remove the hold if it is ours (bounded by [`RELEASE_TIMEOUT`](super::RELEASE_TIMEOUT)).
    pub(crate) async fn abandon(mut self) {
        let mut undo = self.release_of();
        (undo.keep_for, undo.plain, undo.undo) = (None, false, true);
        undo.run().await;
        self.armed = false;
    }

    /// [`Held::abandon`] for an acquisition whose wait ran out: the release goes on in the
    /// background (counted for `quit`), and this waits for it at most [`ABANDON_WAIT`], so a
    /// server that stopped answering does not hold the caller past its wait.
    pub(crate) async fn abandon_in_background(mut self) {
        let undo = release_in_background(&self, None);
        self.armed = false;
        if let Some(undo) = undo {
            let _ = tokio::time::timeout(ABANDON_WAIT, undo).await;
        }
    }

    /// Releases the holds in the background, all at once, and waits for them at most
    /// [`ABANDON_WAIT`] together: for holds given back without their body having run (a later
    /// unit could not be taken) or beside a lost one, so the caller's error comes at once even
    /// when the server stopped answering. The releases go on, counted for `quit`.
    pub(crate) async fn give_back_all(helds: Vec<Held>) {
        let until = Instant::now() + ABANDON_WAIT;
        let releases: Vec<_> = helds
            .into_iter()
            .filter_map(|mut held| {
                held.stop_renewal();
                let release = release_in_background(&held, Some(After::GivenBack));
                held.armed = false;
                release
            })
            .collect();
        for release in releases {
            let _ = tokio::time::timeout_at(until, release).await;
        }
    }

    /// Records a loss, makes a best-effort release (waited for at most [`ABANDON_WAIT`], then
    /// left to the background, counted for `quit`), and builds the error. `part` names the key
    /// of a several-key unit that was lost, and its fencing token (else the hold's own).
    pub(crate) async fn lost(
        mut self,
        reason: LossReason,
        part: Option<(Arc<str>, u64)>,
    ) -> LockError {
        self.stop_renewal();
        let reason = noticed_late(reason, &self.lease);
        let conn = &self.engine.conn;
        conn.stats.record(&self.metrics, Event::Loss);
        self.loss_counted = true;
        if conn.deployment.is_replicated() {
            // Likely a failover: idle dedicated connections may point at the old primary.
            conn.forget_topology();
        }
        // How long it was held: up to the loss, not the best-effort release that follows.
        let held = self.lease.held_for();
        let (key, fencing_token) =
            part.unwrap_or_else(|| (Arc::clone(self.keys.display()), self.lease.fencing_token()));
        // Key and namespace as fields: the call's span is at `DEBUG`, often filtered out.
        if self.body_started {
            self.metrics.held(held);
            tracing::warn!(
                key = %key,
                namespace = %self.namespace,
                fencing_token,
                reason = %reason,
                ?held,
                "lock lost; body cancelled"
            );
        } else {
            tracing::warn!(
                key = %key,
                namespace = %self.namespace,
                reason = %reason,
                "lock lost before the body started"
            );
        }
        // A lost key is not ours any more (`NotOwner`), but the other keys of its unit are.
        if reason != LossReason::NotOwner || !self.part_fences.is_empty() {
            // Best effort, as the abandoning of a timed-out attempt: a server that stopped
            // answering must not hold the error up to `RELEASE_TIMEOUT` past the loss. A lost
            // lock keeps no minimum hold, and its release takes the full script.
            self.hold_at_least = Duration::ZERO;
            self.uncontended = false;
            let release = release_in_background(&self, None);
            // Released already: a cancellation while waiting for it must not release again.
            self.armed = false;
            if let Some(release) = release {
                let _ = tokio::time::timeout(ABANDON_WAIT, release).await;
            }
        }
        self.armed = false;
        LockError::LockLost {
            key: key.to_string(),
            namespace: self.namespace.to_string(),
            held,
            reason,
        }
    }

    /// The hold is over (released, lost, or its call cancelled): stops renewing it, and ends
    /// its lease for any clone kept past the body ([`Lease::remaining`] is zero from now on).
    fn stop_renewal(&mut self) {
        self.renewal = None;
        self.lease.end();
    }

    /// How much longer the minimum hold keeps the key, if at least a millisecond.
    fn keep_for(&self) -> Option<Duration> {
        let keep_for = self.hold_at_least.checked_sub(self.lease.held_for())?;
        (keep_for >= Duration::from_millis(1)).then_some(keep_for)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stop_renewal();
        if self.armed {
            // A hold whose call was cancelled (or whose body panicked): held until now, its
            // release reported as a body's that ends is.
            let ended = self.body_started.then(|| Ended {
                held: self.lease.held_for(),
                cause: if self.body_panicked.load(Ordering::Relaxed) {
                    "panicked"
                } else {
                    "cancelled"
                },
            });
            if release_in_background(self, ended.map(After::Ended)).is_some()
                && let Some(ended) = ended
            {
                self.metrics.held(ended.held);
            }
        }
    }
}

/// How long an acquisition whose wait ran out waits for the release undoing its last attempt,
/// and a lost hold for its best-effort release (one round trip on a healthy server), before it
/// returns and leaves that release to the background.
const ABANDON_WAIT: Duration = Duration::from_millis(20);

/// How a hold whose body ran ended without its call's release.
/// What a release in the background reports besides its own count.
#[derive(Debug, Clone, Copy)]
enum After {
    /// The hold's call ended without releasing it (see [`Ended`]): a key found gone is a loss,
    /// warned about.
    Ended(Ended),
    /// A unit given back before the body ran (see [`Held::give_back_all`]): a key found gone is
    /// a loss, counted.
    GivenBack,
}

#[derive(Debug, Clone, Copy)]
struct Ended {
    /// From the grant to the drop.
    held: Duration,
    /// `cancelled` (the call's future was dropped) or `panicked` (its body panicked while
    /// polled, see [`PanicMark`]).
    cause: &'static str,
}

/// Releases `held` in a task of its own (`None` outside a runtime), counted for `quit` from
/// now. With `report` (the body ran): the outcome is logged, and a key found gone counted as a
/// loss.
fn release_in_background(
    held: &Held,
    report: Option<After>,
) -> Option<tokio::task::JoinHandle<()>> {
    use tracing::instrument::WithSubscriber as _;
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return None;
    };
    let release = held.release_of();
    // Counted from now, not from when the task first runs: a `quit` right after the
    // cancellation waits for it.
    let releasing = held.engine.releases.start();
    Some(
        runtime.spawn(
            async move {
                let _releasing = releasing;
                let released = release.run().await;
                match (report, released) {
                    (Some(After::Ended(ended)), Released::NotOurs) => {
                        release.lost_before_release(ended.held, ended.cause);
                    }
                    (Some(After::GivenBack), Released::NotOurs) => release.lost_given_back(),
                    (Some(After::Ended(ended)), Released::Removed) => tracing::debug!(
                        key = %release.keys.display(),
                        namespace = %release.namespace,
                        held = ?ended.held,
                        body = ended.cause,
                        "lock released (in the background: its call was cancelled, or its body panicked)"
                    ),
                    _ => {}
                }
            }
            // The dropping caller's subscriber, where it set one of its own.
            .with_current_subscriber(),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_safety_net_leads_the_usable_lease() {
        let min = crate::options::MIN_LEASE;
        assert!(safety_lead(min, crate::lease::drift(min)) >= Duration::from_millis(3));
        let long = Duration::from_secs(30);
        assert_eq!(
            safety_lead(long, crate::lease::drift(long)),
            crate::lease::drift(long)
        );
        let mid = Duration::from_millis(500);
        assert_eq!(
            safety_lead(mid, crate::lease::drift(mid)),
            Duration::from_millis(10)
        );
    }
}
