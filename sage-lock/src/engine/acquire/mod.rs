//! Acquiring: one token per call, attempts until granted, busy (try mode) or out of time.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

mod findings;
mod place;

use findings::Findings;
use place::{Place, leave_queue, place_ttl};

use super::hold::safety_lead;
use super::release::Releasing;
use super::token::new_token;
use super::waiters::WaitSlot;
use super::{Engine, Held, QUEUED_POLL, Rules, TRY_LOCK_RETRY_WINDOW};
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
        // Busy while this task shares the lock itself (not reentrant): say so.
        let reason = match reason {
            TimeoutReason::Busy if super::reentry::held(engine, &**rules, &keys.lock).is_some() => {
                TimeoutReason::BehindOwnHold
            }
            reason => reason,
        };
        client.stats.timed_out(&settings.metrics, &reason);
        tracing::debug!(%reason, waited = ?start.elapsed(), "lock acquisition timed out");
        LockError::TimedOut {
            key: keys.display().to_string(),
            namespace: namespace.to_string(),
            waited: start.elapsed(),
            reason,
        }
    };
    if matches!(mode, Mode::Wait(_)) && super::reentry::blocks(engine, &**rules, &keys.lock) {
        // Nested in the body of this task's own hold that keeps it out (a reentrant family ran
        // a call of the same kind under it before coming here), which lasts until the body,
        // awaiting this call, ends.
        return Err(timed_out(TimeoutReason::HeldByThisTask));
    }
    let token = new_token(rules.token_prefix());
    // Armed from the first attempt on: an attempt whose reply is lost may still have been granted.
    let mut held = Held {
        engine: Arc::clone(engine),
        rules: Arc::clone(rules),
        keys: Arc::clone(keys),
        namespace: Arc::clone(namespace),
        metrics: Arc::clone(&settings.metrics),
        token: token.clone(),
        lease: Lease::new(
            Arc::clone(keys),
            Arc::clone(namespace),
            0,
            std::time::Instant::now(),
            std::time::Instant::now(),
            Duration::ZERO,
        ),
        renewal: None,
        armed: true,
        handoff_lease: super::handoff_lease(settings.lease),
        granted_by: None,
        hold_at_least: Duration::ZERO,
        uncontended: false,
        body_started: false,
        body_panicked: std::sync::atomic::AtomicBool::new(false),
        release_sent: false,
        loss_counted: false,
        part_fences: Vec::new(),
    };
    // Registered on the first "busy" reply: woken when this process releases the key.
    let mut waiter = WaitSlot::new(&engine.waiters, &keys.lock);
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
            let fence = granted.lease.fencing_token();
            // Only exclusive grants come in token order: holders that share (readers, a
            // semaphore's permits) get theirs in whatever order the replies come.
            let exclusive = rules.blocked_by(rules.kind());
            if exclusive
                && let Some(previous) = engine.fences.observe(rules.kind(), &keys.lock, fence)
            {
                client
                    .stats
                    .record(&settings.metrics, Event::FenceRegression);
                tracing::warn!(
                    key = %keys.display(),
                    %namespace,
                    fencing_token = fence,
                    previous,
                    "fencing token went backwards: the server lost the fencing counter \
                     (eviction, FLUSHALL or a restart without persistence); use \
                     maxmemory-policy noeviction or volatile-*"
                );
            }
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
            held.part_fences = granted.part_fences;
            held.uncontended = granted.attempts == 1;
            Ok(Some(held))
        }
        Ok(None) => Ok(None),
        Err(Stop::TimedOut(reason)) => {
            // The error is built first: `waited` is the wait, not the undoing.
            let error = timed_out(reason);
            if held.armed {
                held.abandon_in_background().await;
            }
            Err(error)
        }
        Err(Stop::Lost(reason)) => Err(held.lost(reason, None).await),
        Err(Stop::Quit(leaving)) => {
            if held.armed {
                held.abandon().await;
            }
            drop(leaving);
            Err(LockError::backend(
                format!(
                    "acquiring lock {} in namespace {namespace:?}",
                    crate::error::quoted(keys.display())
                ),
                crate::connection::closed_error(),
            ))
        }
        Err(Stop::Failed(error)) => {
            // (Disarmed when every attempt was answered and the last was refused unrun.)
            if held.armed {
                held.abandon().await;
            }
            if error.details().contains("WRONGTYPE") {
                return Err(another_type(keys, namespace));
            }
            let hint = crate::acl::denial_hint(&error, Some(namespace.as_ref()))
                .or_else(|| crate::retry::out_of_memory_hint(&error).map(str::to_owned))
                .map(|hint| format!(" ({hint})"))
                .unwrap_or_default();
            Err(LockError::backend(
                format!(
                    "acquiring lock {} in namespace {namespace:?}{hint}",
                    crate::error::quoted(keys.display())
                ),
                error,
            ))
        }
    }
}

/// Warns, once per client, of a grant whose round trip took more than a quarter of its lease:
/// renewals that slow come back too late, and holds are lost (audit 52: at 600 ms round trips
/// every 1 s hold was lost, and nothing said why).
fn warn_of_a_long_round_trip(
    engine: &Engine,
    keys: &LockKeys,
    namespace: &str,
    round_trip: Duration,
    lease: Duration,
) {
    use std::sync::atomic::Ordering;
    if round_trip > lease / 4 && !engine.warned_round_trip.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            key = %keys.display(),
            %namespace,
            ?round_trip,
            ?lease,
            "a lock was granted {round_trip:.1?} after its attempt was sent (its round trips \
             to the server, or a stall of this process), more than a quarter of its {lease:?} \
             lease: \
             renewals that slow come back too late and holds are lost; give leases ten times \
             that or more (LockOptions::lease). Said once per client"
        );
    }
}

/// Lets the local follower just handed leadership send its queueing attempt while this task
/// runs the caller's body: woken from this worker, the follower sits in the worker's unstealable
/// next-task slot, and a body that blocks the thread would keep it there until the release, so
/// it would miss the hand-off.
///
/// On a multi-thread runtime a no-op task spawned now takes that slot: the follower moves to the
/// worker's stealable queue and an idle worker is woken to run it, while this task goes on at
/// once. (Yielding instead ran the follower's whole send on this worker first, about 40 µs on
/// every contended grant.) On a current-thread runtime nothing runs beside the body, so this task
/// yields to let the follower send first.
async fn let_follower_queue() {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread) {
        drop(tokio::spawn(async {}));
    } else {
        tokio::task::yield_now().await;
    }
}

/// The wait ran out: why, from what the attempts found; when no server answered, and the
/// shared connection is down, the connection's last error says why.
fn timed_out(found: &Findings, conn: &crate::connection::Connection) -> Stop {
    Stop::TimedOut(match found.timeout_reason() {
        TimeoutReason::Unavailable(last) => {
            TimeoutReason::Unavailable(conn.why_down().unwrap_or(last))
        }
        reason => reason,
    })
}

struct Granted {
    lease: Lease,
    /// The fencing token of each key a several-key unit was granted (else empty).
    part_fences: Vec<u64>,
    attempts: u32,
    granted_by: Option<fred::types::config::Server>,
}

enum Stop {
    TimedOut(TimeoutReason),
    Lost(LossReason),
    Failed(fred::error::Error),
    /// [`LockClient::quit`](crate::LockClient::quit) started: the call fails as on a closed
    /// client, after leaving the server's queue (`quit` waits while the guard lives).
    Quit(Option<Releasing>),
}

#[allow(clippy::too_many_arguments)]
async fn acquire_loop(
    engine: &Engine,
    rules: &Arc<dyn Rules>,
    settings: &LockSettings,
    keys: &Arc<LockKeys>,
    mode: Mode,
    deadline: Instant,
    held: &mut Held,
    waiter: &mut WaitSlot<'_>,
) -> Result<Option<Granted>, Stop> {
    let client = &engine.conn;
    let lease_duration = settings.lease;
    let namespace = &settings.namespace;
    let mut backoff = Backoff::new(Duration::from_millis(2), Duration::from_millis(200));
    let mut found = Findings::default();
    let mut attempts = 0_u32;
    let waiting = matches!(mode, Mode::Wait(_));
    // Whether this primitive queues waiters on the server (a refused waiting caller owes the
    // queue its leaving).
    let queued = waiting && rules.queues();
    let mut place = Place::default();
    // A replica-acknowledged waiter confirms a handed-off grant with an attempt of its own (its
    // WAIT then covers the grant); others take it as it comes.
    let confirm_handoffs = settings.replica_acknowledgement && client.deployment.is_replicated();
    // Waiting calls of this kind line up locally ([`Rules::local_line`]), and another local task
    // already waits for a key: if it waits for this one, follow it.
    let in_line = waiting && rules.local_line();
    // The last sleep ran its whole delay while a release notification was expected.
    let mut polled = false;
    // An attempt failed on the way (it may have been granted unanswered).
    let mut unanswered_before = false;
    if in_line && engine.waiters.any() && !waiter.try_lead() {
        // Behind another local task waiting for the key, which was busy. Handed the lead only
        // at or after the deadline (the process stalled past it, say), an attempt would be cut
        // before its answer and read "no reply from the server": the key was busy.
        if !waiter.follow(deadline).await || remaining(deadline).is_zero() {
            return Err(Stop::TimedOut(TimeoutReason::Busy));
        }
    }
    loop {
        if engine.quitting.is_set() {
            return Err(Stop::Quit(None));
        }
        if let Some(lease) = place
            .handed_off(settings, keys)
            .filter(|_| !confirm_handoffs)
        {
            if waiter.resign() {
                let_follower_queue().await;
            }
            client.stats.record(&settings.metrics, Event::Handoff);
            // A release hands over one key: a unit of several keys is never handed one.
            let part_fences = vec![lease.fencing_token()];
            return Ok(Some(Granted {
                lease,
                part_fences,
                attempts: attempts + 1,
                granted_by: None,
            }));
        }
        // Woken by the deadline: an attempt now would be cut before its answer (and, on a
        // replicated deployment, cost its dedicated connection), so the wait ends here.
        if attempts > 0 && remaining(deadline).is_zero() {
            return Err(timed_out(&found, client));
        }
        attempts += 1;
        // Until an answer says otherwise, this attempt may have been granted.
        held.armed = true;
        // An attempt sent while the connection is down waits for it to come back: it meets a
        // transient failure whatever its answer (counted once, here).
        let sent_while_down = client.is_down();
        if sent_while_down {
            client
                .stats
                .record(&settings.metrics, Event::TransientRetry);
        }
        // The lease is measured on the real clock (see `crate::lease`).
        let mut sent = std::time::Instant::now();
        let call = if waiting {
            rules.wait_call(keys, &held.token, lease_duration, place_ttl(deadline))
        } else {
            rules.acquire_call(keys, &held.token, lease_duration)
        }
        .never_late();
        // Only a replica-acknowledged attempt runs on a connection of its own and needs it.
        let cleanup = (settings.replica_acknowledgement && client.deployment.is_replicated())
            .then(|| rules.release_call(keys, &held.token, held.handoff_lease));
        let outcome = client
            .run(
                &call,
                settings.replica_acknowledgement,
                deadline,
                None,
                cleanup,
                &mut sent,
            )
            .await
            .and_then(|(reply, ack, node)| Ok((parse_acquire(reply)?, ack, node)));
        match outcome {
            Ok((AcquireReply::Granted { fence, parts }, Ack::Confirmed, granted_by)) => {
                if polled {
                    // The release came, but not its notification.
                    place.missed_release();
                }
                // The next local waiter joins the server's queue while this one holds.
                if waiter.resign() {
                    let_follower_queue().await;
                }
                let valid_until = sent + lease_duration - drift(lease_duration);
                // A grant with no more of its usable lease left than the hold's safety net keeps
                // in reserve would be cancelled before the body first ran: it counts as spent.
                let reserve = safety_lead(lease_duration, drift(lease_duration));
                if std::time::Instant::now() + reserve >= valid_until {
                    if remaining(deadline).is_zero() {
                        return Err(Stop::Lost(LossReason::ExpiredBeforeStart));
                    }
                    // The reply came after the lease was (all but) spent (a slow or paused
                    // server, a long `WAIT`): the grant is worthless, but the wait is not over.
                    // The same token tries again (the script re-grants or extends its own hold).
                    client
                        .stats
                        .record(&settings.metrics, Event::TransientRetry);
                    tracing::debug!("grant arrived after its lease was spent; retrying");
                    found.transient("a grant arrived after its lease was spent".into());
                    tokio::time::sleep(backoff.next_delay(remaining(deadline))).await;
                    continue;
                }
                warn_of_a_long_round_trip(engine, keys, namespace, sent.elapsed(), lease_duration);
                let lease = Lease::new(
                    Arc::clone(keys),
                    Arc::clone(namespace),
                    fence,
                    sent,
                    valid_until,
                    drift(lease_duration),
                );
                return Ok(Some(Granted {
                    lease,
                    part_fences: parts,
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
                // Not acknowledged in time: the grant cannot be trusted. WAIT is bounded below
                // the command timeout, so wait time may be left: try again (same token).
                if remaining(deadline) < Duration::from_millis(50) {
                    return Err(Stop::TimedOut(TimeoutReason::NotAcknowledged {
                        acknowledged,
                        required,
                    }));
                }
                client
                    .stats
                    .record(&settings.metrics, Event::TransientRetry);
                found.short(acknowledged, required);
            }
            Ok((AcquireReply::Granted { .. }, Ack::NotPrimary(role), _)) => {
                return Err(Stop::Lost(LossReason::RoleChanged(role)));
            }
            Ok((AcquireReply::Busy { pttl_ms, fence }, _, _)) => {
                // A definite "busy" (the script checks our token too): we hold nothing, so a
                // busy try owes no release.
                held.armed = false;
                client.stats.record(&settings.metrics, Event::BusyRetry);
                if matches!(mode, Mode::Try) {
                    return Ok(None);
                }
                // A queued waiter owes the queue its leaving.
                held.armed = queued;
                if queued {
                    place.queued(sent, fence);
                }
                found.busy(pttl_ms);
                if in_line && !waiter.try_lead() {
                    // Another local task asks the server for this key: leave the server's queue
                    // to it and wait for it to hand over.
                    if queued {
                        leave_queue(engine, rules, keys, held, deadline).await;
                    }
                    if !waiter.follow(deadline).await {
                        return Err(Stop::TimedOut(TimeoutReason::Busy));
                    }
                    continue;
                }
                // A release may have slipped past before the subscription: try again.
                if place
                    .watch(engine, rules, keys, &held.token, deadline)
                    .await
                {
                    continue;
                }
            }
            Err(OpError::Failed(error)) => {
                // Whatever fred says of an attempt cut by `quit` (a silent connection's
                // "channel closed"), the cause is the closed client.
                let error = if client.is_closed() {
                    crate::connection::closed_error()
                } else {
                    error
                };
                if classify(&error) == Failure::Permanent {
                    if crate::acl::refused_before_running(&error) && !unanswered_before {
                        // Refused before it ran (by the ACL), and every earlier attempt was
                        // answered: nothing was taken, nothing is to undo.
                        held.armed = false;
                    }
                    return Err(Stop::Failed(error));
                }
                if error.details().starts_with(DEADLINE_REACHED) && remaining(deadline).is_zero() {
                    // Cut short by our own deadline: keep what the previous attempts found. An
                    // attempt that lost its connection on the way waited for it in vain.
                    if !sent_while_down && client.is_down() {
                        client
                            .stats
                            .record(&settings.metrics, Event::TransientRetry);
                    }
                    found.cut_unanswered(sent.elapsed());
                    if let Mode::Wait(wait) = mode {
                        found.cut_before_a_round_trip(wait, client.pool.typical_call());
                    }
                    return Err(timed_out(&found, client));
                }
                if !sent_while_down {
                    client
                        .stats
                        .record(&settings.metrics, Event::TransientRetry);
                }
                tracing::debug!(%error, "transient failure while acquiring; retrying");
                unanswered_before = true;
                found.transient(crate::retry::transient_text(&error));
            }
            Err(OpError::PoolExhausted) => {
                // Connections held by `WAIT`s the replicas leave unacknowledged (a replica down,
                // a failover): that is the cause, and more connections would only wait too.
                let short = found
                    .short_ack()
                    .or_else(|| client.hints.short_within(client.command_timeout));
                return Err(Stop::TimedOut(match short {
                    Some((acknowledged, required)) => TimeoutReason::NotAcknowledged {
                        acknowledged,
                        required,
                    },
                    None => TimeoutReason::PoolExhausted {
                        max_connections: client.pool.max_connections(),
                    },
                }));
            }
        }
        let left = remaining(deadline);
        if left.is_zero() {
            return Err(timed_out(&found, client));
        }
        let busy = found.busy;
        // Never sleep past the deadline, nor (much) past the moment the holder's lease ends.
        let limit = found
            .holder_pttl
            .map_or(left, |pttl| left.min(pttl.max(Duration::from_millis(1))));
        let delay = if busy && place.subscribed && queued {
            // The release names the next owner; poll only to refresh the queue place and in
            // case a notification is lost.
            limit.min(QUEUED_POLL)
        } else if queued {
            backoff.next_delay(limit.min(QUEUED_POLL))
        } else {
            backoff.next_delay(limit)
        };
        tracing::trace!(attempts, ?delay, busy, "lock not acquired yet; waiting");
        // Woken early by a release that names this waiter (its watch) or by a release of this
        // process that named nobody (the local waiters).
        let named = async {
            if busy {
                place.named().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let local = async {
            match waiter.local() {
                Some(local) if busy && waiting => local.released().await,
                _ => std::future::pending().await,
            }
        };
        let notified = busy && place.subscribed;
        polled = false;
        // Counted while it waits: `quit` lets it leave the queue before closing.
        let waiting_now = engine.waiting.start();
        if engine.quitting.is_set() {
            return Err(Stop::Quit(Some(waiting_now)));
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => polled = notified,
            () = named => {}
            () = local => {}
            () = engine.quitting.signalled() => return Err(Stop::Quit(Some(waiting_now))),
        }
    }
}

/// A key of this lock holds a value of another type than the one sage-lock writes there: set
/// by hand, or by another program using the same key names.
fn another_type(keys: &LockKeys, namespace: &str) -> LockError {
    LockError::invalid(
        "key",
        format!(
            "lock {} in namespace {namespace:?}: a key of this lock on the server holds a value \
             of another type than sage-lock writes there, so it was set by hand or by another \
             program using the same names; look at its keys with redis-cli (TYPE on {lock} and \
             on the keys starting with it), and delete them there if they are stale, or use \
             another namespace",
            crate::error::quoted(keys.display()),
            lock = String::from_utf8_lossy(&keys.lock),
        ),
    )
}
