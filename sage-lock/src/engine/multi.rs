//! Holding several locks as one (the multi-key lock): units acquired in one fixed order with
//! rollback, each key renewed on its own, the loss of any key the loss of the whole.
//!
//! A *unit* is what one script call acquires atomically: every key of one hash slot in a cluster,
//! every key on other deployments. Callers pass the units sorted in the one global order (slot,
//! then server key), so two callers asking for overlapping sets in any order contend on the
//! same unit first and never hold one unit each while waiting for the other's.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::hold::lease_ran_out;
use super::{Engine, Held, Mode, Rules, acquire};
use crate::error::{LockError, LossReason, TimeoutReason};
use crate::key::LockKeys;
use crate::lease::{Lease, scope};
use crate::observe::Event;
use crate::options::LockSettings;
use crate::renewal::{Registration, Renewal};
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
    let span = tracing::debug_span!(
        "sage_lock",
        key = %units.get(report).map_or("", |unit| unit.keys.display().as_ref()),
        keys,
        namespace = %settings.namespace
    );
    let acquired = Box::pin(acquire_all(&engine, &settings, &units, mode))
        .instrument(span.clone())
        .await?;
    let Some(helds) = acquired else {
        return Ok(None);
    };
    Box::pin(hold_all(helds, &units, report, &settings, body, span))
        .await
        .map(Some)
}

/// Takes the units in order: the first waits (holding nothing), the later ones are only tried;
/// when one is busy, what was taken is released and the round starts again after a backoff.
async fn acquire_all(
    engine: &Arc<Engine>,
    settings: &LockSettings,
    units: &[Unit],
    mode: Mode,
) -> Result<Option<Vec<Held>>, LockError> {
    let start = Instant::now();
    let deadline = match mode {
        Mode::Wait(wait) => start
            .checked_add(wait)
            .unwrap_or_else(|| deadline_after(wait)),
        Mode::Try => start,
    };
    let mut backoff = Backoff::new(Duration::from_millis(2), Duration::from_millis(200));
    loop {
        let mut taken = Vec::with_capacity(units.len());
        let mut busy = None;
        for (index, unit) in units.iter().enumerate() {
            let unit_mode = match mode {
                Mode::Wait(_) if index == 0 => {
                    Mode::Wait(remaining(deadline).max(Duration::from_millis(1)))
                }
                _ => Mode::Try,
            };
            match acquire(engine, &unit.rules, settings, &unit.keys, unit_mode).await {
                Ok(Some(held)) => taken.push(held),
                Ok(None) => {
                    busy = Some(index);
                    break;
                }
                Err(error) => {
                    release_all(taken).await;
                    return Err(error);
                }
            }
        }
        let Some(busy) = busy else {
            return Ok(Some(taken));
        };
        // Roll back: never hold part of the set while waiting for the rest.
        release_all(taken).await;
        let left = remaining(deadline);
        if matches!(mode, Mode::Try) {
            return Ok(None);
        }
        if left.is_zero() {
            engine.conn.stats.record(&settings.metrics, Event::Timeout);
            return Err(LockError::TimedOut {
                key: units[busy].keys.display().to_string(),
                namespace: settings.namespace.to_string(),
                waited: start.elapsed(),
                reason: TimeoutReason::Busy,
            });
        }
        tokio::time::sleep(backoff.next_delay(left)).await;
    }
}

async fn release_all(helds: Vec<Held>) {
    for held in helds {
        held.release().await;
    }
}

/// Runs `body` while every unit lasts: each part renewed on its own, the body cancelled when
/// any part is lost (the error names it), every unit released after.
async fn hold_all<F: Future>(
    mut helds: Vec<Held>,
    units: &[Unit],
    report: usize,
    settings: &LockSettings,
    body: F,
    span: tracing::Span,
) -> Result<F::Output, LockError> {
    let mut registrations: Vec<Registration> = Vec::new();
    let mut losses: Vec<(usize, Arc<str>, oneshot::Receiver<LossReason>)> = Vec::new();
    for (index, (held, unit)) in helds.iter().zip(units).enumerate() {
        for part in &unit.parts {
            let (lost_tx, lost_rx) = oneshot::channel();
            let renewal = Renewal {
                slot: part.slot,
                target: held.rules.renew_target(part),
                token: held.token.clone(),
                lease_duration: settings.lease,
                replica_ack: settings.replica_acknowledgement,
                lease: held.lease.clone(),
                granted_by: held.granted_by.clone(),
                metrics: Arc::clone(&settings.metrics),
            };
            registrations.push(held.engine.renewer.register(renewal, lost_tx));
            losses.push((index, Arc::clone(part.display()), lost_rx));
        }
    }
    // From here on (the body may run) a release keeps the minimum hold, cancellation included.
    for held in &mut helds {
        held.hold_at_least = settings.hold_at_least;
    }
    let leases: Vec<Lease> = helds.iter().map(|held| held.lease.clone()).collect();
    let Some(lease) = leases.get(report).cloned() else {
        release_all(helds).await;
        return Err(LockError::invalid("keys", "internal: no unit to report"));
    };
    let parts = helds.iter().zip(units).flat_map(|(held, unit)| {
        unit.parts
            .iter()
            .map(Arc::clone)
            .zip(held.part_fences.iter().copied())
    });
    let body = scope(lease.with_parts(parts.collect()), body);
    let (index, key, reason) = tokio::select! {
        biased;
        lost = first_loss(&mut losses) => lost,
        index = any_ran_out(&leases, settings.lease) => (
            index,
            Arc::clone(units[index].keys.display()),
            LossReason::RenewalFailed("no renewal completed in time".into()),
        ),
        output = body => {
            drop(registrations);
            Box::pin(release_all(helds)).instrument(span).await;
            return Ok(output);
        }
    };
    drop(registrations);
    let lost = helds.remove(index);
    let mut error = Box::pin(lost.lost(reason)).instrument(span.clone()).await;
    if let LockError::LockLost { key: named, .. } = &mut error {
        *named = key.to_string();
    }
    Box::pin(release_all(helds)).instrument(span).await;
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
async fn any_ran_out(leases: &[Lease], lease_duration: std::time::Duration) -> usize {
    let watches = leases.iter().enumerate().map(|(index, lease)| async move {
        lease_ran_out(lease, lease_duration).await;
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
