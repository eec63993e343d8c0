//! Acquiring: one token per call, attempts until granted, busy (try mode) or out of time.

use std::sync::Arc;
use std::time::Duration;

use fred::bytes::Bytes;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Engine, Held, Rules, TRY_LOCK_RETRY_WINDOW};
use crate::connection::{Ack, DEADLINE_REACHED, OpError};
use crate::error::{LockError, LossReason, TimeoutReason};
use crate::key::LockKeys;
use crate::lease::{Lease, drift};
use crate::observe::Event;
use crate::options::LockSettings;
use crate::retry::{Backoff, Failure, classify, deadline_after, remaining};
use crate::scripts::{AcquireReply, parse_acquire};

/// How an acquisition treats a busy lock.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Mode {
    /// Retry a busy lock until the wait runs out.
    Wait(Duration),
    /// Report a busy lock at once.
    Try,
}

/// A local waiter's registration, handed back however the acquisition ends (cancellation
/// included).
struct WaitSlot<'a> {
    engine: &'a Engine,
    key: &'a [u8],
    notify: Option<Arc<Notify>>,
}

impl WaitSlot<'_> {
    fn notify(&mut self) -> &Arc<Notify> {
        self.notify
            .get_or_insert_with(|| self.engine.waiters.register(self.key))
    }
}

impl Drop for WaitSlot<'_> {
    fn drop(&mut self) {
        if let Some(notify) = self.notify.take() {
            self.engine.waiters.forget(self.key, notify);
        }
    }
}

/// A random 128-bit owner token, as 32 hex digits.
fn new_token() -> Bytes {
    Bytes::from(format!("{:032x}", rand::random::<u128>()))
}

/// Acquires per `mode`: `Ok(None)` only in [`Mode::Try`] when the lock is busy.
pub(crate) async fn acquire(
    engine: &Arc<Engine>,
    rules: &Arc<dyn Rules>,
    settings: &LockSettings,
    keys: &Arc<LockKeys>,
    mode: Mode,
) -> Result<Option<Held>, LockError> {
    let client = &engine.conn;
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
        engine: Arc::clone(engine),
        rules: Arc::clone(rules),
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
    let mut waiter = WaitSlot {
        engine,
        key: &keys.lock,
        notify: None,
    };
    let result = acquire_loop(
        engine,
        rules,
        settings,
        keys,
        mode,
        deadline,
        &mut held,
        &mut waiter,
    )
    .await;
    drop(waiter);
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

#[allow(clippy::too_many_arguments)]
async fn acquire_loop(
    engine: &Engine,
    rules: &Arc<dyn Rules>,
    settings: &LockSettings,
    keys: &LockKeys,
    mode: Mode,
    deadline: Instant,
    held: &mut Held,
    waiter: &mut WaitSlot<'_>,
) -> Result<Option<Granted>, Stop> {
    let client = &engine.conn;
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
        let call = rules.acquire_call(keys, &held.token, lease_duration);
        let outcome = client
            .run(&call, settings.replica_acknowledgement, deadline, None)
            .await
            .and_then(|(reply, ack, node)| Ok((parse_acquire(reply)?, ack, node)));
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
        if holder_pttl.is_some() && matches!(mode, Mode::Wait(_)) {
            let notify = waiter.notify();
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = notify.notified() => {}
            }
        } else {
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::Connection;
    use crate::topology::Deployment;

    #[test]
    fn a_dropped_wait_slot_leaves_no_waiter_behind() {
        let conn = Connection::new(
            fred::clients::Client::default(),
            Deployment::Standalone,
            1,
            Duration::from_secs(1),
        );
        let engine = Engine::new(conn);
        for key in [b"a".as_slice(), b"b", b"a"] {
            let mut slot = WaitSlot {
                engine: &engine,
                key,
                notify: None,
            };
            let _ = slot.notify();
            assert_eq!(engine.waiters.keys(), 1);
        }
        assert_eq!(engine.waiters.keys(), 0);
    }
}
