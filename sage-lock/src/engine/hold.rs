//! Holding: the body runs under renewal, raced against loss of the hold; then release.

use std::sync::Arc;
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::config::Server;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::{Engine, RELEASE_TIMEOUT, Rules, reentry};
use crate::connection::OpError;
use crate::error::{LockError, LossReason};
use crate::key::LockKeys;
use crate::lease::{Lease, scope};
use crate::notify::Grant;
use crate::observe::{Event, Metrics};
use crate::options::LockSettings;
use crate::renewal::{Registration, Renewal};
use crate::retry::{Backoff, Failure, classify, remaining};
use crate::scripts::{ReleaseReply, parse_release};

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
    let body = scope(held.lease.clone(), body);
    let body = reentry::scope(
        &held.engine,
        &*held.rules,
        held.keys.lock.clone(),
        held.lease.clone(),
        body,
    );
    tokio::select! {
        biased;
        reason = lost_rx => {
            let reason = reason.unwrap_or(LossReason::RenewalFailed("renewal task ended".into()));
            Err(Box::pin(held.lost(reason)).instrument(span).await)
        }
        () = lease_ran_out(&held.lease, settings.lease) => {
            // The renewer did not report in time (its task starved or gone): never let the body
            // run past the usable lease.
            let reason = held.renewal.take().map_or_else(
                || crate::renewal::unrenewed(&held.engine.conn),
                Registration::into_loss,
            );
            Err(Box::pin(held.lost(reason)).instrument(span).await)
        }
        output = body => {
            Box::pin(held.release()).instrument(span).await;
            Ok(output)
        }
    }
}

/// Resolves shortly before the usable lease runs out without being extended: the safety net
/// behind the renewer's own loss report (the renewer's task may be starved or gone). It fires
/// [`safety_lead`] before the lease's end, so even a timer that wakes a few milliseconds late
/// cancels the body while the lease is still valid.
pub(super) async fn lease_ran_out(lease: &Lease, lease_duration: Duration) {
    let lead = safety_lead(lease_duration, lease.margin());
    loop {
        // Real time (see `crate::lease`): recomputed after every wake-up, so a renewal that
        // extended the lease, or a tokio clock that ran ahead, only means sleeping again.
        let left = lease.remaining().saturating_sub(lead);
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left).await;
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

    /// Releases the hold, taking at most [`RELEASE_TIMEOUT`].
    pub(crate) async fn release(mut self) {
        self.stop_renewal();
        // Stay armed until done: dropped mid-release, the release finishes in the background.
        let released = release_now(
            &self.engine,
            &*self.rules,
            &self.keys,
            &self.token,
            &self.metrics,
            self.handoff_lease,
            self.keep_for(),
            self.granted_by.as_ref(),
            self.uncontended,
            false,
        )
        .await;
        self.armed = false;
        let held = self.lease.held_for();
        self.metrics.held(held);
        if released == Released::NotOurs {
            // The body ran to its end, but the lock was lost before it did, unnoticed until now
            // (its next renewal had not come): say so, as a loss.
            self.engine.conn.stats.record(&self.metrics, Event::Loss);
            tracing::warn!(
                key = %self.keys.display(),
                namespace = %self.namespace,
                ?held,
                "lock lost before its release: the body ended, but the key no longer held this \
                 owner's token (expired, force-unlocked or deleted): another owner may have \
                 held it meanwhile (a store checking fencing tokens rejects this holder's \
                 writes made after that)"
            );
        } else {
            tracing::debug!(?held, "lock released");
        }
    }

    /// Gives up an acquisition: an attempt whose reply was lost may still have been granted, so
    /// remove the hold if it is ours (bounded by [`RELEASE_TIMEOUT`]).
    pub(crate) async fn abandon(mut self) {
        release_now(
            &self.engine,
            &*self.rules,
            &self.keys,
            &self.token,
            &self.metrics,
            self.handoff_lease,
            None,
            self.granted_by.as_ref(),
            false,
            true,
        )
        .await;
        self.armed = false;
    }

    /// [`Held::abandon`] for an acquisition whose wait ran out: the release goes on in the
    /// background (counted for `quit`), and this waits for it at most [`ABANDON_WAIT`], so a
    /// server that stopped answering does not hold the caller past its wait.
    pub(crate) async fn abandon_in_background(mut self) {
        let undo = release_in_background(&self);
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
                let release = release_in_background(&held);
                held.armed = false;
                release
            })
            .collect();
        for release in releases {
            let _ = tokio::time::timeout_at(until, release).await;
        }
    }

    /// Records a loss, makes a best-effort release (waited for at most [`ABANDON_WAIT`], then
    /// left to the background, counted for `quit`), and builds the error.
    pub(crate) async fn lost(mut self, reason: LossReason) -> LockError {
        self.stop_renewal();
        let conn = &self.engine.conn;
        conn.stats.record(&self.metrics, Event::Loss);
        if conn.deployment.is_replicated() {
            // Likely a failover: idle dedicated connections may point at the old primary.
            conn.forget_topology();
        }
        // How long it was held: up to the loss, not the best-effort release that follows.
        let held = self.lease.held_for();
        self.metrics.held(held);
        tracing::warn!(reason = %reason, ?held, "lock lost; body cancelled");
        if reason != LossReason::NotOwner {
            // Best effort, as the abandoning of a timed-out attempt: a server that stopped
            // answering must not hold the error up to `RELEASE_TIMEOUT` past the loss. A lost
            // lock keeps no minimum hold, and its release takes the full script.
            self.hold_at_least = Duration::ZERO;
            self.uncontended = false;
            if let Some(release) = release_in_background(&self) {
                let _ = tokio::time::timeout(ABANDON_WAIT, release).await;
            }
        }
        self.armed = false;
        LockError::LockLost {
            key: self.keys.display().to_string(),
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
            let released = release_in_background(self);
            // A granted hold whose call was cancelled (fencing tokens start at 1): held until
            // now, released as a body that ends is.
            if released.is_some() && self.lease.fencing_token() != 0 {
                let held = self.lease.held_for();
                self.metrics.held(held);
                // Outside the call's span (dropped with it): key and namespace as fields.
                tracing::debug!(
                    key = %self.keys.display(),
                    namespace = %self.namespace,
                    ?held,
                    "lock released (in the background: the call was cancelled)"
                );
            }
        }
    }
}

/// The releases of one client under way, counted from the moment they are owed (a background
/// release before its task first runs), so that closing the client can wait for them.
#[derive(Debug, Default)]
pub(crate) struct Releases {
    count: std::sync::atomic::AtomicUsize,
    done: tokio::sync::Notify,
}

/// One release under way; dropped (done, or its task dropped), it no longer counts.
pub(crate) struct Releasing(Arc<Releases>);

impl Releases {
    /// Counts a release until the returned guard is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> Releasing {
        self.count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Releasing(Arc::clone(self))
    }

    /// How many releases are under way (for tests).
    pub(crate) fn under_way(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Resolves when no release is under way, or at `deadline`.
    pub(crate) async fn settled(&self, deadline: Instant) {
        loop {
            let done = self.done.notified();
            tokio::pin!(done);
            // Registered before the check: a release ending in between still wakes this.
            done.as_mut().enable();
            if self.count.load(std::sync::atomic::Ordering::Acquire) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                return;
            }
        }
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        if self
            .0
            .count
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            self.0.done.notify_waiters();
        }
    }
}

/// Removes `token`'s hold (or, with `keep_for`, lets it expire then), bounded by
/// [`RELEASE_TIMEOUT`]; failures are logged (the lease expires). Wakes this process's waiters for
/// the key when it was removed. Returns [`Released::NotOurs`] when the server's first answer
/// said the key no longer held `token` (not after a retry, which may find its own earlier
/// removal).
#[allow(clippy::too_many_arguments)]
async fn release_now(
    engine: &Engine,
    rules: &dyn Rules,
    keys: &LockKeys,
    token: &Bytes,
    metrics: &Metrics,
    handoff_lease: Duration,
    keep_for: Option<Duration>,
    granted_by: Option<&Server>,
    plain: bool,
    unanswered: bool,
) -> Released {
    let _releasing = engine.releases.start();
    // One bound for the whole release, the quick attempt and the script together.
    let deadline = Instant::now() + RELEASE_TIMEOUT;
    // Whether a removal may already have run unanswered: the key then found gone tells nothing.
    let mut retried = unanswered;
    // (Replicated deployments need the checked path: no plain release is sent.)
    if plain
        && keep_for.is_none()
        && !engine.conn.deployment.is_replicated()
        && let Some(key) = rules.plain_release_key(keys)
    {
        match engine
            .conn
            .delete_if_equal(&key, keys.slot, token, deadline)
            .await
        {
            Some(true) => {
                // Nobody queued on the server; a local task may wait without queueing.
                engine.waiters.wake_one(&keys.lock);
                engine.conn.stats.record(metrics, Event::Release);
                return Released::Done;
            }
            Some(false) => {}
            // Refused, failed or unanswered: it may have run.
            None => retried = true,
        }
    }
    let call = match keep_for {
        Some(keep_for) => rules.shorten_call(keys, token, keep_for),
        None => rules.release_call(keys, token, handoff_lease),
    };
    // Undoing an attempt that got no answer: fred may still hold that attempt, and this
    // release behind it, until it reconnects, and send both then, with nobody left to answer
    // a `NOSCRIPT`.
    let call = if unanswered { call.with_source() } else { call };
    // No grant this release makes is older than this (real clock).
    let mut sent = std::time::Instant::now();
    let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(100));
    let outcome = loop {
        let outcome = engine
            .conn
            .run_on_primary(&call, deadline, granted_by)
            .await
            .and_then(|reply| Ok(parse_release(&reply)?));
        // A compare-and-delete is safe to send again (one that ran finds the lock no longer
        // ours): a connection lost on the way is worth waiting for, within the bound.
        let left = remaining(deadline);
        match &outcome {
            Err(OpError::Failed(error))
                if classify(error) == Failure::Transient && !left.is_zero() =>
            {
                tracing::debug!(%error, "release failed on the way; trying again");
                retried = true;
                tokio::time::sleep(backoff.next_delay(left)).await;
                sent = std::time::Instant::now();
            }
            _ => break outcome,
        }
    };
    if keep_for.is_none() {
        match outcome.as_ref().ok() {
            // The next waiter is named (and maybe handed the lock): if it is ours, wake it now
            // (its message is then skipped).
            Some(ReleaseReply {
                head: Some(head),
                handed_off,
                ..
            }) => {
                let grant =
                    handed_off.map(|fence| Grant::new(fence, Some(sent)).with_lease(handoff_lease));
                if let Some(key) = rules.watched_key(keys) {
                    engine.notifier.wake_local(&key, head, grant);
                }
            }
            _ => engine.waiters.wake_one(&keys.lock),
        }
    }
    match outcome.map(|reply| reply.released) {
        Ok(true) => {
            if let Some(keep_for) = keep_for {
                tracing::debug!(?keep_for, "lock kept for its minimum hold");
            }
            engine.conn.stats.record(metrics, Event::Release);
        }
        Ok(false) if !retried => return Released::NotOurs,
        Ok(false) => tracing::debug!("release found the lock no longer ours"),
        Err(error) => {
            if engine.conn.is_closed() {
                // `quit()` came first: it closed the connections the release needed, and its
                // holds expire with their leases, as its documentation says.
                tracing::debug!("release not sent: the client was closed (LockClient::quit())");
                return Released::Done;
            }
            let unanswered_now = went_unanswered(&error);
            let (error, hint) = match &error {
                OpError::Failed(error) => (error.to_string(), crate::acl::denial_hint(error, None)),
                OpError::PoolExhausted => ("no dedicated connection came free".to_owned(), None),
            };
            let hint = hint.map(|hint| format!(" ({hint})")).unwrap_or_default();
            if unanswered && unanswered_now {
                // No hold's release: the undoing of a call's last attempt (unanswered, or
                // granted without its replicas' acknowledgement), whose caller got its error;
                // the undoing could not be sent or answered either.
                tracing::info!(
                    %error,
                    "could not undo an acquisition attempt that timed out or failed: if the \
                     server ran it, the key stays taken, by nobody, until its lease ends"
                );
            } else if unanswered_now {
                tracing::warn!(
                    %error,
                    "release not answered within {RELEASE_TIMEOUT:?}: unless it still runs, the lock expires with its lease{hint}"
                );
            } else {
                tracing::warn!(%error, "release failed; the lock expires with its lease{hint}");
            }
        }
    }
    Released::Done
}

/// Whether a release failed for want of an answer (a transient failure: not sent, or not
/// answered, within its bound).
fn went_unanswered(error: &OpError) -> bool {
    matches!(error, OpError::Failed(error) if classify(error) == Failure::Transient)
}

/// What a release learned about the hold it released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Released {
    /// Removed, failed (logged), or found gone after a retry: nothing more to say.
    Done,
    /// The key no longer held the token at the first answer: the hold had been lost already.
    NotOurs,
}

/// How long an acquisition whose wait ran out waits for the release undoing its last attempt,
/// and a lost hold for its best-effort release (one round trip on a healthy server), before it
/// returns and leaves that release to the background.
const ABANDON_WAIT: Duration = Duration::from_millis(20);

fn release_in_background(held: &Held) -> Option<tokio::task::JoinHandle<()>> {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return None;
    };
    let (engine, rules, keys, token, metrics, keep_for, plain) = (
        Arc::clone(&held.engine),
        Arc::clone(&held.rules),
        Arc::clone(&held.keys),
        held.token.clone(),
        Arc::clone(&held.metrics),
        held.keep_for(),
        held.uncontended,
    );
    // Never granted (fencing tokens start at 1): the acquisition was cut short unanswered.
    let unanswered = held.lease.fencing_token() == 0;
    let handoff_lease = held.handoff_lease;
    let granted_by = held.granted_by.clone();
    // Counted from now, not from when the task first runs: a `quit` right after the
    // cancellation waits for it.
    let releasing = engine.releases.start();
    Some(runtime.spawn(async move {
        let _releasing = releasing;
        release_now(
            &engine,
            &*rules,
            &keys,
            &token,
            &metrics,
            handoff_lease,
            keep_for,
            granted_by.as_ref(),
            plain,
            unanswered,
        )
        .await;
    }))
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
