//! Keeps held leases alive while their bodies run, and reports when one cannot be kept.
//!
//! Every client has one [`Renewer`]: a background task that wakes when renewals are due and
//! renews all leases due at about the same time together, one script call per server (per node
//! on a cluster, whatever the keys' slots; per slot for a lease whose slot moved while held),
//! capped at a limit of leases per call (256 unless the client's builder says otherwise), with
//! one `ROLE`/`WAIT` check per call. A
//! lease is due a third of the way through; a call also renews the leases due within a sixth
//! of a lease after it, so that leases acquired at different times come to share one call per
//! round. Registering a lease costs no task and no round trip, so a
//! body shorter than a third of its lease never causes a renewal.
//!
//! A failed renewal is retried with backoff while the usable lease lasts. A lock is lost when its
//! key no longer holds the owner's token, when the granting node stops being a primary, or when the
//! usable lease runs out first; the owner's `with_lock` call hears of it through a oneshot channel.

mod batch;
mod confirm;
mod target;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use fred::types::cluster::ClusterRouting as Routing;
use fred::types::config::Server;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::connection::Connection;
use crate::error::{AttemptFailure, LossReason};
use crate::lease::drift;
use crate::observe::Event;
use crate::retry::Backoff;
use crate::topology::Deployment;
use batch::{Batch, BatchKey, Outcome, Place, closed_by_quit};
pub(crate) use confirm::confirm;
pub(crate) use target::{HoldKind, RenewTarget, Renewal};

struct Entry {
    renewal: Renewal,
    due: Instant,
    lost: Option<oneshot::Sender<LossReason>>,
    backoff: Backoff,
    last_problem: Option<LossReason>,
    /// Renewed in calls of its own slot only (a cluster node renewing several slots at once
    /// answered that it no longer serves this one).
    by_slot: bool,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// `(due, id)` of every entry not being renewed right now.
    queue: BTreeSet<(Instant, u64)>,
    entries: HashMap<u64, Entry>,
    /// When the scheduler will wake next on its own (`None`: unknown, wake it).
    sleeping_until: Option<Instant>,
}

impl State {
    /// Whether the scheduler must be woken for a lease due at `due`: only when it would
    /// otherwise sleep past it (it then plans to wake at `due`).
    fn must_wake_for(&mut self, due: Instant) -> bool {
        let earlier = self.sleeping_until.is_none_or(|until| due < until);
        if earlier {
            self.sleeping_until = Some(due);
        }
        earlier
    }

    /// When the scheduler should wake next: the earliest due entry; with none, the wake-up
    /// already planned if it is still ahead, else `idle`. Keeping the planned wake-up matters
    /// when short holds come and go: the scheduler, woken for one, often runs only after that
    /// hold was released; planning `idle` then would make the next registration (due a little
    /// later) wake it again, one cross-thread wake-up per hold.
    fn plan_sleep(&mut self, now: Instant, idle: Instant) -> Instant {
        let until = match (self.queue.first(), self.sleeping_until) {
            (Some((due, _)), _) => *due,
            (None, Some(planned)) if planned > now => planned,
            (None, _) => idle,
        };
        self.sleeping_until = Some(until);
        until
    }
}

/// The per-client renewal scheduler.
pub(crate) struct Renewer {
    shared: Arc<Shared>,
}

struct Shared {
    conn: Arc<Connection>,
    /// Most leases renewed by one call.
    batch_limit: usize,
    state: Mutex<State>,
    wake: Arc<Notify>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Let the scheduler see that its client is gone and end now, not at its next wake-up.
        self.wake.notify_one();
    }
}

/// A lease registered for renewal; dropping it stops renewal.
pub(crate) struct Registration {
    id: u64,
    renewer: Weak<Shared>,
}

impl Registration {
    /// Stops renewal and returns what the renewer last saw go wrong. With nothing seen (a
    /// renewal unanswered when the usable lease ran out, or none sent in time), that counts as
    /// a failed renewal too, as an answered failure does.
    pub(crate) fn into_loss(self) -> LossReason {
        let Some(renewer) = self.renewer.upgrade() else {
            return LossReason::RenewalFailed(NO_RENEWAL.into());
        };
        renewer.last_problem(self.id).unwrap_or_else(|| {
            renewer.count_unanswered(self.id);
            unrenewed(&renewer.conn)
        })
    }
}

/// What a lease whose renewals never completed says, without a failure to quote.
const NO_RENEWAL: &str = "no renewal completed in time";

/// The loss of a lease that ran out with no renewal answered: with why `conn` is down when it
/// is (a refused connection), or that a renewal still waits for a dedicated connection, so the
/// cause is not hidden.
pub(crate) fn unrenewed(conn: &Connection) -> LossReason {
    if let Some(why) = conn.why_down() {
        return LossReason::RenewalFailed(format!("{NO_RENEWAL}; {why}"));
    }
    if !conn.pool.renewal_waiting() {
        return LossReason::RenewalFailed(NO_RENEWAL.into());
    }
    let max = conn.pool.max_connections();
    LossReason::RenewalFailed(match conn.hints.short_within(conn.command_timeout) {
        // More connections would only wait too.
        Some((acknowledged, required)) => format!(
            "{NO_RENEWAL}: a renewal was still waiting for a dedicated connection, all {max} \
             held by WAITs the replicas leave unacknowledged (the last: {acknowledged} of \
             {required}): is a replica down, or a failover under way?"
        ),
        None => format!(
            "{NO_RENEWAL}: a renewal was still waiting for a dedicated connection (all {max} \
             busy: raise max_connections, or keep fewer busy with dedicated_connection)"
        ),
    })
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(renewer) = self.renewer.upgrade() {
            renewer.forget(self.id);
        }
    }
}

impl Renewer {
    /// A scheduler renewing through `conn`, at most `batch_limit` (at least 1) leases per call;
    /// its task starts with the first registration.
    pub(crate) fn new(conn: Arc<Connection>, batch_limit: usize) -> Self {
        Renewer {
            shared: Arc::new(Shared {
                conn,
                batch_limit: batch_limit.max(1),
                state: Mutex::new(State::default()),
                wake: Arc::new(Notify::new()),
                task: Mutex::new(None),
            }),
        }
    }

    /// Starts renewing `renewal`; a loss is reported on `lost`.
    pub(crate) fn register(
        &self,
        renewal: Renewal,
        lost: oneshot::Sender<LossReason>,
    ) -> Registration {
        let renewer = &self.shared;
        // A third of the way through the lease, or through the shorter one a hand-off granted.
        let granted_for = renewal
            .lease
            .valid_until()
            .saturating_duration_since(renewal.lease.acquired_at())
            + renewal.lease.margin();
        let due = crate::lease::timer_at(
            renewal.lease.acquired_at() + renewal.lease_duration.min(granted_for) / 3,
        );
        let backoff = renewal_backoff(renewal.lease_duration);
        let (id, earliest) = {
            let mut state = lock(&renewer.state);
            state.next_id += 1;
            let id = state.next_id;
            let earliest = state.must_wake_for(due);
            state.queue.insert((due, id));
            let entry = Entry {
                renewal,
                due,
                lost: Some(lost),
                backoff,
                last_problem: None,
                by_slot: false,
            };
            state.entries.insert(id, entry);
            (id, earliest)
        };
        Shared::ensure_running(renewer);
        if earliest {
            renewer.wake.notify_one();
        }
        Registration {
            id,
            renewer: Arc::downgrade(renewer),
        }
    }
}

impl Renewer {
    /// The client was closed by [`LockClient::quit`](crate::LockClient::quit): the scheduler
    /// renews nothing more and its task ends (see [`schedule`]). Call after closing the
    /// connection.
    pub(crate) fn close(&self) {
        self.shared.wake.notify_one();
    }

    /// Starts the scheduler task again on the current runtime if it ended (the runtime that
    /// ran it shut down while leases are registered); otherwise a lock and a check.
    pub(crate) fn keep_running(&self) {
        Shared::ensure_running(&self.shared);
    }

    /// How many leases are registered, and how many of them wait in the queue (for tests).
    pub(crate) fn registered(&self) -> (usize, usize) {
        let state = lock(&self.shared.state);
        (state.entries.len(), state.queue.len())
    }
}

impl Shared {
    fn last_problem(&self, id: u64) -> Option<LossReason> {
        lock(&self.state)
            .entries
            .get(&id)
            .and_then(|entry| entry.last_problem.clone())
    }

    /// Counts a renewal failure for the lease `id`, whose renewal went unanswered.
    fn count_unanswered(&self, id: u64) {
        let metrics = lock(&self.state)
            .entries
            .get(&id)
            .map(|entry| Arc::clone(&entry.renewal.metrics));
        if let Some(metrics) = metrics {
            self.conn.stats.record(&metrics, Event::RenewalFailure);
        }
    }

    fn forget(&self, id: u64) {
        let mut state = lock(&self.state);
        if let Some(entry) = state.entries.remove(&id) {
            state.queue.remove(&(entry.due, id));
        }
    }

    /// Spawns the scheduler task unless it is running.
    fn ensure_running(this: &Arc<Shared>) {
        let mut task = lock(&this.task);
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let wake = Arc::clone(&this.wake);
        *task = Some(runtime.spawn(schedule(Arc::downgrade(this), wake)));
    }

    /// Gives up every registered lease of a closed client: none is renewed again, and each
    /// hold's loss (when its usable lease runs out) quotes the closing.
    fn give_up_all(&self) {
        let mut state = lock(&self.state);
        state.queue.clear();
        for entry in state.entries.values_mut() {
            entry.last_problem = Some(closed_by_quit());
        }
    }

    /// Takes every entry due by `now` (plus the batching window) out of the queue, grouped into
    /// batches that can share one script call.
    /// `cluster`: whether the deployment is a cluster, and the client's routing of its slots
    /// (`None` when unknown: each slot then gets calls of its own).
    fn take_due(&self, now: Instant, cluster: Option<Option<&Routing>>) -> Vec<Batch> {
        let mut state = lock(&self.state);
        let Some(&(first_due, first_id)) = state.queue.first() else {
            return Vec::new();
        };
        if first_due > now {
            return Vec::new();
        }
        let horizon = now
            + state
                .entries
                .get(&first_id)
                .map_or(Duration::ZERO, |e| merge_window(e.renewal.lease_duration));
        // Each entry within its own lease's window too: a short lease is not renewed far ahead.
        let taken: Vec<(Instant, u64)> = state
            .queue
            .range(..=(horizon, u64::MAX))
            .filter(|(due, id)| {
                state
                    .entries
                    .get(id)
                    .is_none_or(|e| *due <= now + merge_window(e.renewal.lease_duration))
            })
            .copied()
            .collect();
        let mut groups: HashMap<BatchKey, Batch> = HashMap::new();
        for (due, id) in taken {
            state.queue.remove(&(due, id));
            let Some(entry) = state.entries.get(&id) else {
                continue;
            };
            let place = place_of(cluster, entry.by_slot, entry.renewal.slot);
            let key = BatchKey::of(&entry.renewal, place.clone());
            let batch = groups
                .entry(key)
                .or_insert_with(|| Batch::new(&entry.renewal, &place));
            batch.add(id, &entry.renewal);
        }
        let limit = self.batch_limit;
        groups
            .into_values()
            .flat_map(|batch| batch.split(limit))
            .collect()
    }

    /// When the scheduler should wake next (see [`State::plan_sleep`]).
    fn plan_sleep(&self, now: Instant, idle: Instant) -> Instant {
        lock(&self.state).plan_sleep(now, idle)
    }

    /// Applies the outcome of one renewal attempt to entry `id`.
    /// `sent` is when the attempt was sent, on the real clock (see `crate::lease`); a renewal
    /// confirmed by another primary than the one that granted the lock (its slot was migrated
    /// there: another node's answer after a failover is never confirmed) makes that primary
    /// the one whose role later renewals check.
    fn settle(
        &self,
        id: u64,
        sent: std::time::Instant,
        outcome: Outcome,
        renewed_by: Option<&Server>,
    ) {
        let client = &self.conn;
        let mut state = lock(&self.state);
        let Some(entry) = state.entries.get_mut(&id) else {
            return;
        };
        let metrics = Arc::clone(&entry.renewal.metrics);
        let loss = match outcome {
            Outcome::Renewed => {
                if let (Some(granter), Some(node)) = (&mut entry.renewal.granted_by, renewed_by)
                    && granter != node
                {
                    tracing::debug!(
                        from = %format_args!("{}:{}", granter.host, granter.port),
                        to = %format_args!("{}:{}", node.host, node.port),
                        "lock renewed on the node its slot moved to"
                    );
                    *granter = node.clone();
                }
                let lease_duration = entry.renewal.lease_duration;
                entry
                    .renewal
                    .lease
                    .extend_to(sent + lease_duration - drift(lease_duration));
                entry.backoff = renewal_backoff(lease_duration);
                entry.last_problem = None;
                entry.due = crate::lease::timer_at(sent + lease_duration / 3);
                client.stats.record(&metrics, Event::Renewal);
                let lease = &entry.renewal.lease;
                tracing::trace!(key = %lease.key(), namespace = %lease.namespace(), "lease renewed");
                None
            }
            Outcome::Lost(reason) => {
                // An attempt that failed (a denied or failing script), not one that found the
                // key taken: a failed renewal as well as the loss.
                if matches!(reason, LossReason::RenewalFailed(_)) {
                    client.stats.record(&metrics, Event::RenewalFailure);
                }
                Some(reason)
            }
            Outcome::Elsewhere(problem) => {
                entry.by_slot = true;
                entry.last_problem = Some(problem);
                entry.due = Instant::now();
                None
            }
            Outcome::Closed(problem) => {
                // Never tried again: the entry stays (out of the queue) until its hold ends,
                // which its safety net does when the usable lease runs out, quoting this.
                client.stats.record(&metrics, Event::RenewalFailure);
                entry.last_problem = Some(problem);
                return;
            }
            Outcome::Retry(problem) => {
                client.stats.record(&metrics, Event::RenewalFailure);
                let lease = &entry.renewal.lease;
                let error = AttemptFailure(&problem);
                let left = entry.renewal.lease.remaining();
                if left.is_zero() {
                    tracing::debug!(key = %lease.key(), namespace = %lease.namespace(), %error, "renewal failed, with no lease left to retry in");
                } else {
                    tracing::debug!(key = %lease.key(), namespace = %lease.namespace(), %error, "renewal failed, retrying");
                }
                entry.last_problem = Some(problem);
                if left.is_zero() {
                    entry.last_problem.take()
                } else {
                    entry.due = Instant::now() + entry.backoff.next_delay(left);
                    None
                }
            }
        };
        match loss {
            Some(reason) => {
                if let Some(lost) = entry.lost.take() {
                    let _ = lost.send(reason);
                }
                state.entries.remove(&id);
            }
            None => {
                let due = entry.due;
                state.queue.insert((due, id));
                if state.must_wake_for(due) {
                    drop(state);
                    self.wake.notify_one();
                }
            }
        }
    }
}

/// Where a hold on `slot` is renewed: with every hold of its server (not a cluster), of its
/// node (a cluster whose routing is known), or of its slot (routing unknown, or `by_slot`).
fn place_of(cluster: Option<Option<&Routing>>, by_slot: bool, slot: u16) -> Place {
    match cluster {
        None => Place::Server,
        Some(Some(routing)) if !by_slot => routing
            .get_server(slot)
            .map_or(Place::Slot(slot), |node| Place::Node(node.clone())),
        Some(_) => Place::Slot(slot),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn renewal_backoff(lease: Duration) -> Backoff {
    Backoff::new(
        Duration::from_millis(5),
        (lease / 10).max(Duration::from_millis(5)),
    )
}

/// How far ahead of its due a lease of `lease` is renewed with a call that is being sent:
/// a sixth of the lease. Leases are due a third of a lease after their last renewal, so two
/// groups of leases due less than a third apart either fall within a sixth of each other, and
/// share the next call, or more than a sixth, and the later group's call takes the earlier
/// one, due a third minus that after it: however spread out their acquisition, a client's
/// leases of one length come to share one call per round (per server or node, up to the batch
/// limit) after their first renewals. Renewing early only moves a lease's end later.
fn merge_window(lease: Duration) -> Duration {
    lease / 6
}

/// The scheduler: sleeps until the earliest renewal is due (or a registration or finished
/// attempt wakes it), then renews every due batch concurrently. Holds the client only while
/// awake, and ends once the client is dropped or closed by
/// [`LockClient::quit`](crate::LockClient::quit) (a closed client kept alive keeps no task).
async fn schedule(renewer: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(renewer) = renewer.upgrade() else {
                return;
            };
            if renewer.conn.is_closed() {
                renewer.give_up_all();
                return;
            }
            let routing = renewer.conn.cluster_routing();
            let cluster =
                (renewer.conn.deployment == Deployment::Cluster).then_some(routing.as_ref());
            for batch in renewer.take_due(Instant::now(), cluster) {
                let renewer = Arc::clone(&renewer);
                tokio::spawn(async move {
                    let attempt = batch.renew(&renewer.conn).await;
                    for (id, outcome) in attempt.outcomes {
                        renewer.settle(id, attempt.sent, outcome, attempt.renewed_by.as_ref());
                    }
                });
            }
            let now = Instant::now();
            renewer.plan_sleep(now, now + Duration::from_secs(60))
        };
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = wake.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests;
