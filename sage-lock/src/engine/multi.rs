//! Holding several locks as one (the multi-key lock): units acquired in one fixed order, each
//! key renewed on its own from its grant, the loss of any key the loss of the whole.
//!
//! A *unit* is what one script call acquires atomically: every key of one hash slot in a cluster,
//! every key on other deployments. Callers pass the units sorted in the one global order (slot,
//! then server key) and take them in that order, holding the earlier ones while they wait in
//! line for the next: a caller only ever waits for a unit later than all it holds, so callers
//! asking for overlapping sets in any order never wait for each other in a circle.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use fred::bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::hold::lease_ran_out;
use super::{Engine, Held, Mode, Rules, acquire, reentry};
use crate::error::{LockError, LossReason, TimeoutReason};
use crate::key::LockKeys;
use crate::lease::{Lease, scope};
use crate::options::LockSettings;
use crate::renewal::{Registration, Renewer};
use crate::retry::{Backoff, deadline_after, remaining};

/// One atomic acquisition: `rules` acquire and release every key of `parts` in one call.
pub(crate) struct Unit {
    pub(crate) rules: Arc<dyn Rules>,
    /// The key that names the unit (its slot, its local waiters, its lease's key).
    pub(crate) keys: Arc<LockKeys>,
    /// Every key the unit holds, each renewed on its own.
    pub(crate) parts: Vec<Arc<LockKeys>>,
}

/// Acquires every unit (in the given order) per `mode`, runs `body` while all are held,
/// releases them: `Ok(None)` only in [`Mode::Try`] when one is busy. The body sees
/// `units[report]`'s lease as [`current_lease`](crate::current_lease), with every part's
/// fencing token ([`Lease::fencing_tokens`]).
pub(crate) async fn run_all<F: Future>(
    engine: Arc<Engine>,
    settings: Arc<LockSettings>,
    units: Vec<Unit>,
    report: usize,
    mode: Mode,
    body: F,
) -> Result<Option<F::Output>, LockError> {
    let keys: usize = units.iter().map(|unit| unit.parts.len()).sum();
    let key = units
        .get(report)
        .map_or("", |unit| unit.keys.display().as_ref());
    if !crate::runtime::is_current() {
        return Err(super::outside_runtime(key, &settings.namespace));
    }
    engine.refuse_wrong_node().await?;
    let span = tracing::debug_span!(
        "sage_lock",
        key = %key,
        keys,
        namespace = %settings.namespace
    );
    let acquired = Box::pin(acquire_all(&engine, &settings, &units, mode))
        .instrument(span.clone())
        .await?;
    let Some(taken) = acquired else {
        return Ok(None);
    };
    Box::pin(hold_all(taken, &units, report, &settings, body, span))
        .await
        .map(Some)
}

/// The units taken so far, each part renewed from the moment its unit was granted.
#[derive(Default)]
struct Taken {
    helds: Vec<Held>,
    registrations: Vec<Registration>,
    /// (unit index, part key, the renewer's loss report) for every part.
    losses: Vec<(usize, Arc<str>, oneshot::Receiver<LossReason>)>,
}

impl Taken {
    /// Adds `held`, the grant of `unit`, and starts renewing each of its parts.
    fn push(&mut self, held: Held, unit: &Unit, settings: &LockSettings) {
        let index = self.helds.len();
        for part in &unit.parts {
            let (lost_tx, lost_rx) = oneshot::channel();
            let renewal = held.renewal_of(part, settings);
            self.registrations
                .push(held.engine.renewer.register(renewal, lost_tx));
            self.losses
                .push((index, Arc::clone(part.display()), lost_rx));
        }
        self.helds.push(held);
    }

    /// Stops renewal and gives every unit taken back (see [`Held::give_back_all`]).
    async fn give_back(self) {
        drop(self.registrations);
        Held::give_back_all(self.helds).await;
    }
}

/// Takes the units in order, each renewed as soon as it is granted. Waiting, each unit waits
/// in line (queued on its keys) while the earlier ones are held: every caller takes units in
/// the one global order, so no two wait for each other. An earlier unit lost while a later one
/// is awaited puts everything back and starts again within the wait. In [`Mode::Try`] a busy
/// unit puts back what was taken and ends the call.
async fn acquire_all(
    engine: &Arc<Engine>,
    settings: &LockSettings,
    units: &[Unit],
    mode: Mode,
) -> Result<Option<Taken>, LockError> {
    let start = Instant::now();
    let deadline = match mode {
        Mode::Wait(wait) => start
            .checked_add(wait)
            .unwrap_or_else(|| deadline_after(wait)),
        Mode::Try => start,
    };
    if matches!(mode, Mode::Wait(_))
        && let Some(part) = held_by_this_task(engine, units)
    {
        // Nested in the body of this task's own hold of one of the keys, which lasts until the
        // body, awaiting this call, ends.
        let reason = TimeoutReason::HeldByThisTask;
        engine.conn.stats.timed_out(&settings.metrics, &reason);
        return Err(LockError::TimedOut {
            key: part.display().to_string(),
            namespace: settings.namespace.to_string(),
            waited: start.elapsed(),
            reason,
        });
    }
    let mut backoff = Backoff::new(Duration::from_millis(2), Duration::from_millis(200));
    'round: loop {
        let mut taken = Taken::default();
        for unit in units {
            let unit_mode = match mode {
                Mode::Wait(_) => Mode::Wait(remaining(deadline).max(Duration::from_millis(1))),
                Mode::Try => Mode::Try,
            };
            let leases: Vec<Lease> = taken.helds.iter().map(|h| h.lease.clone()).collect();
            let acquiring = acquire(engine, &unit.rules, settings, &unit.keys, unit_mode);
            let outcome = tokio::select! {
                biased;
                (_, key, reason) = first_loss(&mut taken.losses), if !taken.losses.is_empty() => {
                    Err((key, reason))
                }
                index = any_ran_out(&leases, settings.lease, &engine.renewer), if !leases.is_empty() => Err((
                    Arc::clone(units[index].keys.display()),
                    crate::renewal::unrenewed(&engine.conn),
                )),
                acquired = acquiring => Ok(acquired),
            };
            match outcome {
                Ok(Ok(Some(held))) => taken.push(held, unit, settings),
                Ok(Ok(None)) => {
                    taken.give_back().await;
                    return Ok(None);
                }
                Ok(Err(mut error)) => {
                    taken.give_back().await;
                    if let LockError::TimedOut { waited, key, .. } = &mut error {
                        // A later unit's wait began after the earlier units were taken: the
                        // caller waited since this call began.
                        *waited = start.elapsed();
                        // The unit's round trip does not say which of its keys was busy.
                        if unit.parts.len() > 1 {
                            *key = one_of(&unit.parts);
                        }
                    }
                    return Err(error);
                }
                Err((key, reason)) => {
                    start_again(taken, &key, &reason, engine, settings, start, deadline).await?;
                    tokio::time::sleep(backoff.next_delay(remaining(deadline))).await;
                    continue 'round;
                }
            }
        }
        if matches!(mode, Mode::Wait(_))
            && let Err((key, reason)) = confirm_earlier(engine, settings, units, &taken).await
        {
            start_again(taken, &key, &reason, engine, settings, start, deadline).await?;
            tokio::time::sleep(backoff.next_delay(remaining(deadline))).await;
            continue 'round;
        }
        return Ok(Some(taken));
    }
}

/// An earlier unit was lost before the body ran: nothing was done under it, so everything is
/// given back, and the call starts again unless its wait has run out (then `TimedOut`).
async fn start_again(
    taken: Taken,
    key: &str,
    reason: &LossReason,
    engine: &Arc<Engine>,
    settings: &LockSettings,
    start: Instant,
    deadline: Instant,
) -> Result<(), LockError> {
    tracing::debug!(%key, ?reason, "a key was lost before the body started; retrying");
    taken.give_back().await;
    if remaining(deadline).is_zero() {
        let reason = TimeoutReason::Busy;
        engine.conn.stats.timed_out(&settings.metrics, &reason);
        return Err(LockError::TimedOut {
            key: key.to_owned(),
            namespace: settings.namespace.to_string(),
            waited: start.elapsed(),
            reason,
        });
    }
    Ok(())
}

/// Confirms, once the last unit is granted, that the units taken before it are still this
/// call's: while it waited for a later unit, an earlier key may have been taken away on the
/// server (force-unlocked, deleted, flushed), which that key's renewal, a third of the lease
/// away, would notice only after the body had started. Each earlier unit is renewed in one call,
/// all of them at once (one round trip); the first key not confirmed is returned.
async fn confirm_earlier(
    engine: &Arc<Engine>,
    settings: &LockSettings,
    units: &[Unit],
    taken: &Taken,
) -> Result<(), (Arc<str>, LossReason)> {
    let Some((_, earlier)) = taken.helds.split_last() else {
        return Ok(());
    };
    type Confirming<'a> =
        Pin<Box<dyn Future<Output = Result<(), (Arc<str>, LossReason)>> + Send + 'a>>;
    let mut confirming: Vec<Confirming<'_>> = earlier
        .iter()
        .zip(units)
        .map(|(held, unit)| {
            let parts: Vec<_> = unit
                .parts
                .iter()
                .map(|part| held.renewal_of(part, settings))
                .collect();
            Box::pin(async move {
                crate::renewal::confirm(&engine.conn, &parts)
                    .await
                    .map_err(|(index, reason)| {
                        let part = unit.parts.get(index).unwrap_or(&unit.keys);
                        (Arc::clone(part.display()), reason)
                    })
            }) as Confirming<'_>
        })
        .collect();
    poll_fn(|cx| {
        let mut failed = None;
        confirming.retain_mut(|confirm| match confirm.as_mut().poll(cx) {
            Poll::Pending => true,
            Poll::Ready(Ok(())) => false,
            Poll::Ready(Err(lost)) => {
                failed.get_or_insert(lost);
                false
            }
        });
        match failed {
            Some(lost) => Poll::Ready(Err(lost)),
            None if confirming.is_empty() => Poll::Ready(Ok(())),
            None => Poll::Pending,
        }
    })
    .await
}

/// The first key of `units` that a hold of the current task keeps this call out of.
fn held_by_this_task<'u>(engine: &Arc<Engine>, units: &'u [Unit]) -> Option<&'u Arc<LockKeys>> {
    units.iter().find_map(|unit| {
        unit.parts
            .iter()
            .find(|part| reentry::blocks(engine, &*unit.rules, &part.lock))
    })
}

/// How a timeout names a unit of several keys: `one of a, b, c` (at most 8 of them,
/// then how many more).
fn one_of(parts: &[Arc<LockKeys>]) -> String {
    /// How many keys a timeout lists.
    const NAMED: usize = 8;
    let mut named = parts
        .iter()
        .take(NAMED)
        .map(|part| part.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if parts.len() > NAMED {
        named.push_str(&format!(" and {} more", parts.len() - NAMED));
    }
    format!("one of {named}")
}

/// Releases every unit after the body, all at once: together bounded by one release's
/// [`RELEASE_TIMEOUT`](crate::connection::RELEASE_TIMEOUT), as a single key's release is.
async fn release_all(helds: Vec<Held>) {
    let mut releases: Vec<Pin<Box<dyn Future<Output = ()> + Send>>> = helds
        .into_iter()
        .map(|held| Box::pin(held.release()) as Pin<Box<dyn Future<Output = ()> + Send>>)
        .collect();
    poll_fn(|cx| {
        releases.retain_mut(|release| release.as_mut().poll(cx).is_pending());
        if releases.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// Runs `body` while every unit lasts: each part renewed on its own (since its grant), the
/// body cancelled when any part is lost (the error names it), every unit released after.
async fn hold_all<F: Future>(
    taken: Taken,
    units: &[Unit],
    report: usize,
    settings: &LockSettings,
    body: F,
    span: tracing::Span,
) -> Result<F::Output, LockError> {
    let Taken {
        mut helds,
        registrations,
        mut losses,
    } = taken;
    // From here on (the body may run) a release keeps the minimum hold, cancellation included.
    for held in &mut helds {
        held.hold_at_least = settings.hold_at_least;
        held.body_started = true;
    }
    let leases: Vec<Lease> = helds.iter().map(|held| held.lease.clone()).collect();
    let parts: Vec<(Arc<LockKeys>, u64)> = helds
        .iter()
        .zip(units)
        .flat_map(|(held, unit)| {
            unit.parts
                .iter()
                .map(Arc::clone)
                .zip(held.part_fences.iter().copied())
        })
        .collect();
    // Each key is held by this task, under its own view of its unit's lease (reentrancy).
    let mut each_key: Vec<(Bytes, Lease)> = Vec::with_capacity(parts.len());
    for (held, unit) in helds.iter().zip(units) {
        for (part, fence) in unit.parts.iter().zip(held.part_fences.iter().copied()) {
            each_key.push((part.lock.clone(), held.lease.part(Arc::clone(part), fence)));
        }
    }
    let engine = helds.first().map(|held| Arc::clone(&held.engine));
    let first = (!each_key.is_empty()).then(|| each_key.remove(0));
    let reported = leases.get(report).cloned();
    let (Some(lease), Some(unit), Some(engine), Some(first)) =
        (reported, units.first(), engine, first)
    else {
        drop(registrations);
        release_all(helds).await;
        return Err(LockError::invalid("keys", "internal: no unit to report"));
    };
    let body = scope(lease.with_parts(parts), body);
    let body = reentry::scope_all(&engine, &*unit.rules, first, each_key, body);
    let (index, key, reason) = tokio::select! {
        biased;
        lost = first_loss(&mut losses) => lost,
        index = any_ran_out(&leases, settings.lease, &engine.renewer) => (
            index,
            Arc::clone(units[index].keys.display()),
            crate::renewal::unrenewed(&engine.conn),
        ),
        output = body => {
            drop(registrations);
            Box::pin(release_all(helds)).instrument(span).await;
            return Ok(output);
        }
    };
    drop(registrations);
    let lost = helds.remove(index);
    // The lost key's own fencing token, where it is one key of several.
    let fence = units[index]
        .parts
        .iter()
        .position(|part| *part.display() == key)
        .and_then(|at| lost.part_fences.get(at).copied())
        .unwrap_or_else(|| lost.lease.fencing_token());
    // The others are given back at the same time as the lost one's best-effort release.
    let (error, ()) = tokio::join!(
        Box::pin(lost.lost(reason, Some((key, fence)))).instrument(span.clone()),
        Box::pin(Held::give_back_all(helds)).instrument(span)
    );
    Err(error)
}

/// The first loss any part's renewal reports: (unit index, part key, reason).
async fn first_loss(
    losses: &mut [(usize, Arc<str>, oneshot::Receiver<LossReason>)],
) -> (usize, Arc<str>, LossReason) {
    poll_fn(|cx| {
        for (index, key, lost) in losses.iter_mut() {
            if let Poll::Ready(reason) = Pin::new(lost).poll(cx) {
                let reason =
                    reason.unwrap_or(LossReason::RenewalFailed("renewal task ended".into()));
                return Poll::Ready((*index, Arc::clone(key), reason));
            }
        }
        Poll::Pending
    })
    .await
}

/// Resolves with the index of the first lease that runs out without being extended.
async fn any_ran_out(
    leases: &[Lease],
    lease_duration: std::time::Duration,
    renewer: &Renewer,
) -> usize {
    let watches = leases.iter().enumerate().map(|(index, lease)| async move {
        lease_ran_out(lease, lease_duration, renewer).await;
        index
    });
    let mut watches: Vec<_> = watches.map(Box::pin).collect();
    poll_fn(|cx| {
        for watch in &mut watches {
            if let Poll::Ready(index) = watch.as_mut().poll(cx) {
                return Poll::Ready(index);
            }
        }
        Poll::Pending
    })
    .await
}
