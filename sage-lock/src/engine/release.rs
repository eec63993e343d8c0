//! Releasing a hold's token on the server (or undoing an acquisition attempt), and the count
//! of releases under way that [`LockClient::quit`](crate::LockClient::quit) waits for.

use std::sync::Arc;
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::config::Server;
use tokio::time::Instant;

use super::{Engine, RELEASE_TIMEOUT, Rules};
use crate::connection::OpError;
use crate::key::LockKeys;
use crate::notify::Grant;
use crate::observe::{Event, Metrics};
use crate::retry::{Backoff, Failure, classify, remaining};
use crate::scripts::{ReleaseReply, parse_release};

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

/// One release of a hold's token (or the undoing of an acquisition attempt): what it removes,
/// and how.
pub(super) struct Release {
    pub(super) engine: Arc<Engine>,
    pub(super) rules: Arc<dyn Rules>,
    pub(super) keys: Arc<LockKeys>,
    pub(super) namespace: Arc<str>,
    pub(super) token: Bytes,
    /// The hold's fencing token (0 when never granted), for the warnings.
    pub(super) fence: u64,
    pub(super) metrics: Arc<Metrics>,
    /// The lease a release gives the waiter it hands the lock to.
    pub(super) handoff_lease: Duration,
    /// Let the key expire then instead of removing it now (the minimum hold).
    pub(super) keep_for: Option<Duration>,
    pub(super) granted_by: Option<Server>,
    /// Try the plain compare-and-delete first (granted on the first attempt).
    pub(super) plain: bool,
    /// Undoing an acquisition attempt (no hold's release): it counts no release when it finds
    /// nothing, and says so at `INFO` when it cannot be sent.
    pub(super) undo: bool,
    /// An earlier release of this hold may have run: the key found gone tells nothing.
    pub(super) sent_before: bool,
    /// The hold was counted as lost already: its best-effort release counts nothing more.
    pub(super) after_loss: bool,
}

impl Release {
    /// Removes the token's hold (or, with `keep_for`, lets it expire then), bounded by
    /// [`RELEASE_TIMEOUT`]; failures are logged (the lease expires). Wakes this process's
    /// waiters for the key when it was removed. [`Released::NotOurs`] when the server's first
    /// answer said the key no longer held the token (not after a retry, or after an earlier
    /// release of the hold, which may have removed it).
    pub(super) async fn run(&self) -> Released {
        let Release {
            engine,
            rules,
            keys,
            namespace,
            token,
            handoff_lease,
            keep_for,
            granted_by,
            plain,
            undo: unanswered,
            ..
        } = self;
        let (rules, handoff_lease, keep_for, granted_by, plain, unanswered) = (
            &**rules,
            *handoff_lease,
            *keep_for,
            granted_by.as_ref(),
            *plain,
            *unanswered,
        );
        let _releasing = engine.releases.start();
        // One bound for the whole release, the quick attempt and the script together.
        let deadline = Instant::now() + RELEASE_TIMEOUT;
        // Whether a removal may already have run unanswered: the key then found gone tells nothing.
        let mut retried = unanswered || self.sent_before;
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
                    self.count(Event::Release);
                    return Released::Removed;
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
        // The last refusal the server answered (BUSY, LOADING, ...), for the warning when the
        // bound runs out after it.
        let mut refused: Option<String> = None;
        let outcome = loop {
            let outcome = engine
                .conn
                .run_on_primary(&call, deadline, granted_by, unanswered)
                .await
                .and_then(|(reply, ran_before)| {
                    // A copy that ran before on another node may have removed the key.
                    retried |= ran_before;
                    Ok(parse_release(&reply)?)
                });
            // A compare-and-delete is safe to send again (one that ran finds the lock no longer
            // ours): a connection lost on the way is worth waiting for, within the bound.
            let left = remaining(deadline);
            match &outcome {
                Err(OpError::Failed(error))
                    if classify(error) == Failure::Transient && !left.is_zero() =>
                {
                    tracing::debug!(%error, "release failed on the way; trying again");
                    if is_server_refusal(error) {
                        refused = Some(error.to_string());
                    }
                    retried = true;
                    tokio::time::sleep(backoff.next_delay(left)).await;
                    sent = std::time::Instant::now();
                }
                _ => break outcome,
            }
        };
        let outcome = match outcome {
            // The bound ran out while this process did not run (stopped, or its runtime's
            // threads blocked): the answer may be waiting, unread. Sent again, with a bound of
            // its own, the release finds its earlier work done (the key gone) or does it.
            Err(error)
                if went_unanswered(&error)
                    && Instant::now().saturating_duration_since(deadline) > super::hold::STALL =>
            {
                tracing::debug!(
                    late = ?Instant::now().saturating_duration_since(deadline),
                    "the release's bound ran out while this process did not run; sending it again"
                );
                retried = true;
                sent = std::time::Instant::now();
                engine
                    .conn
                    .run_on_primary(
                        &call,
                        Instant::now() + RELEASE_TIMEOUT,
                        granted_by,
                        unanswered,
                    )
                    .await
                    .and_then(|(reply, _)| Ok(parse_release(&reply)?))
            }
            other => other,
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
                    let grant = handed_off
                        .map(|fence| Grant::new(fence, Some(sent)).with_lease(handoff_lease));
                    if let Some(key) = rules.watched_key(keys) {
                        engine.notifier.wake_local(&key, head, grant);
                    }
                }
                _ => engine.waiters.wake_one(&keys.lock),
            }
        }
        match outcome.map(|reply| reply.released) {
            Ok(true) if unanswered => {
                // A grant the call gave up (cancelled, timed out, not acknowledged), never
                // counted as an acquisition: removed, and not counted as a release either.
                tracing::debug!("removed a grant its call gave up");
            }
            Ok(true) => {
                if let Some(keep_for) = keep_for {
                    tracing::debug!(?keep_for, "lock kept for its minimum hold");
                }
                self.count(Event::Release);
            }
            Ok(false) if !retried => return Released::NotOurs,
            Ok(false) => {
                // Most likely removed by this release's (or the hold's) earlier attempt: a
                // hold's release counts, an undoing found nothing to undo.
                tracing::debug!("release found the lock no longer ours");
                self.count(Event::Release);
            }
            Err(error) => {
                // The hold ended, but its key stays until its lease ends.
                self.count(Event::ReleaseFailure);
                if engine.conn.is_closed() {
                    // `quit()` came first: it closed the connections the release needed, and its
                    // holds expire with their leases, as its documentation says.
                    tracing::debug!("release not sent: the client was closed (LockClient::quit())");
                    return Released::Unsettled;
                }
                // Refused (BUSY, LOADING, ...) until the bound cut the last attempt: a failure
                // the refusal explains, not an unanswered release.
                let refused = refused.filter(|_| went_unanswered(&error));
                let unanswered_now = went_unanswered(&error) && refused.is_none();
                let (error, hint) = match &error {
                    OpError::Failed(error) => {
                        let text = match &refused {
                            Some(refusal) => format!(
                                "refused by the server until the {RELEASE_TIMEOUT:?} bound ran \
                                 out: {refusal}"
                            ),
                            None => error.to_string(),
                        };
                        (text, crate::acl::denial_hint(error, None))
                    }
                    OpError::PoolExhausted => {
                        ("no dedicated connection came free".to_owned(), None)
                    }
                };
                let hint = hint.map(|hint| format!(" ({hint})")).unwrap_or_default();
                if unanswered && unanswered_now {
                    // No hold's release: the undoing of a call's last attempt (unanswered, or
                    // granted without its replicas' acknowledgement), whose caller got its error;
                    // the undoing could not be sent or answered either.
                    tracing::info!(
                        key = %keys.display(),
                        %namespace,
                        %error,
                        "could not undo an acquisition attempt that timed out or failed: if the \
                         server ran it, the key stays taken, by nobody, until its lease ends"
                    );
                } else if unanswered_now {
                    tracing::warn!(
                        key = %keys.display(),
                        %namespace,
                        %error,
                        "release not answered within {RELEASE_TIMEOUT:?}: unless it still runs, the lock expires with its lease{hint}"
                    );
                } else {
                    tracing::warn!(
                        key = %keys.display(),
                        %namespace,
                        %error,
                        "release failed; the lock expires with its lease{hint}"
                    );
                }
                return Released::Unsettled;
            }
        }
        Released::Removed
    }

    /// Counts how this hold's release ended, unless the hold was counted already (lost) or
    /// this is no hold's release (the undoing of an attempt its call gave up).
    fn count(&self, event: Event) {
        if !self.undo && !self.after_loss {
            self.engine.conn.stats.record(&self.metrics, event);
        }
    }

    /// A hold given back before its body ran (a unit of `with_locks`, beside a lost or busy
    /// one) found its key no longer holding its token: lost while the call waited, counted as
    /// a loss (unless counted already), so that the hold counts once. The call itself retries or
    /// times out; no warning.
    pub(super) fn lost_given_back(&self) {
        self.count(Event::Loss);
        tracing::debug!(
            key = %self.keys.display(),
            namespace = %self.namespace,
            fencing_token = self.fence,
            "a lock given back before its body ran was no longer held (lost while the call waited)"
        );
    }

    /// The body ran to its end (or its call was cancelled, or it panicked), but the key no
    /// longer held this hold's token: a loss, counted and warned about. `body`: how the body
    /// ended (`ended`, `cancelled`, `panicked`).
    pub(super) fn lost_before_release(&self, held: Duration, body: &'static str) {
        self.engine.conn.stats.record(&self.metrics, Event::Loss);
        tracing::warn!(
            key = %self.keys.display(),
            namespace = %self.namespace,
            fencing_token = self.fence,
            ?held,
            body,
            "lock lost before its release: the body ended, but the key no longer held this \
             owner's token (expired, force-unlocked or deleted): another owner may have \
             held it meanwhile (a store checking fencing tokens rejects this holder's \
             writes made after that)"
        );
    }
}

/// Whether `error` is the server's own refusal (an error reply such as `BUSY` or `LOADING`),
/// not a lost connection or a timeout.
fn is_server_refusal(error: &fred::error::Error) -> bool {
    use fred::error::ErrorKind;
    !matches!(
        error.kind(),
        ErrorKind::IO | ErrorKind::Timeout | ErrorKind::Canceled
    ) && !crate::connection::is_closed_error(error)
}

/// Whether a release failed for want of an answer (a transient failure: not sent, or not
/// answered, within its bound).
fn went_unanswered(error: &OpError) -> bool {
    matches!(error, OpError::Failed(error) if classify(error) == Failure::Transient)
}

/// What a release learned about the hold it released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Released {
    /// Removed (or kept for its minimum hold), or found gone after an earlier attempt that
    /// may have removed it.
    Removed,
    /// The key no longer held the token at the first answer: the hold had been lost already.
    NotOurs,
    /// Failed or unanswered (logged), or not sent because the client was closed.
    Unsettled,
}
