//! Counters and timings: kept per client (read them with
//! [`LockClient::stats`](crate::LockClient::stats)) and reported through the
//! [`metrics`](https://docs.rs/metrics) facade, so any installed recorder (Prometheus, StatsD, ...)
//! exports them.
//!
//! | metric | kind | meaning |
//! |---|---|---|
//! | `sage_lock_acquisitions_total` | counter | locks acquired |
//! | `sage_lock_busy_retries_total` | counter | attempts that found the lock held by another owner (a `try_*` call's included) |
//! | `sage_lock_handoffs_total` | counter | acquisitions a release handed over on the server (no acquire round trip) |
//! | `sage_lock_transient_retries_total` | counter | acquisition attempts that hit a transient failure (an error retried, or a connection that was down while the attempt waited; a server that does not answer counts in timeouts only) |
//! | `sage_lock_timeouts_total` | counter | acquisitions that gave up (`TimedOut`), labelled by `reason`: `busy`, `not_acknowledged`, `unavailable`, `pool_exhausted`, `held_by_this_task`, `behind_own_hold` (the [`TimeoutReason`]) |
//! | `sage_lock_renewals_total` | counter | successful renewals |
//! | `sage_lock_renewal_failures_total` | counter | renewal attempts that failed (may recover) |
//! | `sage_lock_losses_total` | counter | held locks lost (`LockLost`, or found lost by the release) |
//! | `sage_lock_releases_total` | counter | holds removed by their owner (see [`LockStats::releases`]) |
//! | `sage_lock_release_failures_total` | counter | holds whose release failed or went unanswered (logged at `WARN`; the key expires with its lease) |
//! | `sage_lock_fence_regressions_total` | counter | exclusive grants' fencing tokens lower than one this client saw before for the key (the counter was evicted or flushed) |
//! | `sage_lock_wait_seconds` | histogram | time from call to acquisition (waits that timed out are not sampled) |
//! | `sage_lock_hold_seconds` | histogram | time from acquisition to the body's end or loss (one sample per hold whose body ran) |
//!
//! Every metric carries a `namespace` label; `sage_lock_timeouts_total` has a `reason` label too,
//! so contention (`busy`) and an outage (`unavailable`) or lagging replicas (`not_acknowledged`)
//! can be told apart on a dashboard. Handles are registered when a lock family is
//! created, so install the recorder before creating lock families.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Counter, Histogram, SharedString};

use crate::error::TimeoutReason;

/// The `reason` label of `sage_lock_timeouts_total`, in the order of [`timeout_index`].
const TIMEOUT_REASONS: [&str; 6] = [
    "busy",
    "not_acknowledged",
    "unavailable",
    "pool_exhausted",
    "held_by_this_task",
    "behind_own_hold",
];

/// Where `reason`'s label is in [`TIMEOUT_REASONS`].
fn timeout_index(reason: &TimeoutReason) -> usize {
    match reason {
        TimeoutReason::Busy => 0,
        TimeoutReason::NotAcknowledged { .. } => 1,
        TimeoutReason::Unavailable(_) => 2,
        TimeoutReason::PoolExhausted { .. } => 3,
        TimeoutReason::HeldByThisTask => 4,
        TimeoutReason::BehindOwnHold => 5,
    }
}

/// A snapshot of one client's lock activity since it was created, from
/// [`LockClient::stats`](crate::LockClient::stats) (see its example).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStats {
    /// Locks acquired.
    pub acquisitions: u64,
    /// Attempts that found the lock held by another owner (a `try_*` call's included).
    pub busy_retries: u64,
    /// Acquisitions (counted in `acquisitions` too) that a release handed to this client's
    /// queued waiter on the server, so the waiter took the lock without another attempt.
    pub handoffs: u64,
    /// Acquisition attempts that hit a transient failure: an error retried, or a connection
    /// that was down while the attempt waited (such an outage counts here as well as in
    /// `timeouts`). A server that accepts the connection but does not answer within the wait
    /// (paused, overloaded) counts in `timeouts` only, as `TimedOut(Unavailable)`.
    pub transient_retries: u64,
    /// Acquisitions that ended in `TimedOut`.
    pub timeouts: u64,
    /// Successful renewals.
    pub renewals: u64,
    /// Renewal attempts that failed (the lease may still have been kept by a later attempt).
    pub renewal_failures: u64,
    /// Held locks that were lost: while the body ran or before it started (`LockLost`), or
    /// found lost by the release after the body ended or its call was cancelled (logged at
    /// `WARN`: "lock lost before its release").
    pub losses: u64,
    /// Holds removed by this client: released after the body (or its cancellation, or by a
    /// release attempt whose answer never came). Once nothing is held or under way,
    /// `acquisitions == releases + release_failures + losses`: each hold counts once.
    /// Removing a grant the call gave up (cancelled while it waited, unanswered within its
    /// wait, not acknowledged by the replicas), which was never counted as an acquisition, is
    /// not counted here either; nor is the best-effort release that follows a loss.
    pub releases: u64,
    /// Holds whose release failed (a permission error, say) or got no answer within its bound,
    /// or was not sent because [`LockClient::quit`](crate::LockClient::quit) closed the client
    /// first: logged at `WARN` (except after `quit`); the key stays until its lease ends,
    /// unless a copy of the release ran unseen.
    pub release_failures: u64,
    /// Total time spent waiting for successful acquisitions, in microseconds (a wait that
    /// timed out is not counted).
    pub wait_micros: u64,
    /// Exclusive acquisitions (mutex, writer, one-permit semaphore) whose fencing token was lower
    /// than one this client saw before for the same key: the fencing counter was lost
    /// (eviction, `FLUSHALL`). See the README on `maxmemory-policy`.
    pub fence_regressions: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Stats {
    acquisitions: AtomicU64,
    busy_retries: AtomicU64,
    handoffs: AtomicU64,
    transient_retries: AtomicU64,
    timeouts: AtomicU64,
    renewals: AtomicU64,
    renewal_failures: AtomicU64,
    losses: AtomicU64,
    releases: AtomicU64,
    release_failures: AtomicU64,
    wait_micros: AtomicU64,
    fence_regressions: AtomicU64,
}

/// One countable event.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Event {
    BusyRetry,
    Handoff,
    TransientRetry,
    Renewal,
    RenewalFailure,
    Loss,
    Release,
    ReleaseFailure,
    FenceRegression,
}

/// The metric handles of one lock family (one namespace), registered with the recorder installed
/// when the family was created: install a recorder before creating lock families.
pub(crate) struct Metrics {
    acquisitions: Counter,
    busy_retries: Counter,
    handoffs: Counter,
    transient_retries: Counter,
    /// One per reason, in the order of [`TIMEOUT_REASONS`].
    timeouts: [Counter; TIMEOUT_REASONS.len()],
    renewals: Counter,
    renewal_failures: Counter,
    losses: Counter,
    releases: Counter,
    release_failures: Counter,
    fence_regressions: Counter,
    wait: Histogram,
    hold: Histogram,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub(crate) fn new(namespace: &Arc<str>) -> Self {
        let label = || SharedString::from(Arc::clone(namespace));
        Metrics {
            acquisitions: metrics::counter!("sage_lock_acquisitions_total", "namespace" => label()),
            busy_retries: metrics::counter!("sage_lock_busy_retries_total", "namespace" => label()),
            handoffs: metrics::counter!("sage_lock_handoffs_total", "namespace" => label()),
            transient_retries: metrics::counter!("sage_lock_transient_retries_total", "namespace" => label()),
            timeouts: TIMEOUT_REASONS.map(|reason| {
                metrics::counter!("sage_lock_timeouts_total", "namespace" => label(), "reason" => reason)
            }),
            renewals: metrics::counter!("sage_lock_renewals_total", "namespace" => label()),
            renewal_failures: metrics::counter!("sage_lock_renewal_failures_total", "namespace" => label()),
            losses: metrics::counter!("sage_lock_losses_total", "namespace" => label()),
            releases: metrics::counter!("sage_lock_releases_total", "namespace" => label()),
            release_failures: metrics::counter!("sage_lock_release_failures_total", "namespace" => label()),
            fence_regressions: metrics::counter!("sage_lock_fence_regressions_total", "namespace" => label()),
            wait: metrics::histogram!("sage_lock_wait_seconds", "namespace" => label()),
            hold: metrics::histogram!("sage_lock_hold_seconds", "namespace" => label()),
        }
    }

    /// Records the time a lock was held.
    pub(crate) fn held(&self, held: Duration) {
        self.hold.record(held.as_secs_f64());
    }
}

impl Stats {
    pub(crate) fn record(&self, metrics: &Metrics, event: Event) {
        let (counter, handle) = match event {
            Event::BusyRetry => (&self.busy_retries, &metrics.busy_retries),
            Event::Handoff => (&self.handoffs, &metrics.handoffs),
            Event::TransientRetry => (&self.transient_retries, &metrics.transient_retries),
            Event::Renewal => (&self.renewals, &metrics.renewals),
            Event::RenewalFailure => (&self.renewal_failures, &metrics.renewal_failures),
            Event::Loss => (&self.losses, &metrics.losses),
            Event::Release => (&self.releases, &metrics.releases),
            Event::ReleaseFailure => (&self.release_failures, &metrics.release_failures),
            Event::FenceRegression => (&self.fence_regressions, &metrics.fence_regressions),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        handle.increment(1);
    }

    /// Counts an acquisition that ended in `TimedOut` for `reason`.
    pub(crate) fn timed_out(&self, metrics: &Metrics, reason: &TimeoutReason) {
        self.timeouts.fetch_add(1, Ordering::Relaxed);
        metrics.timeouts[timeout_index(reason)].increment(1);
    }

    pub(crate) fn acquired(&self, metrics: &Metrics, waited: Duration) {
        self.acquisitions.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.wait_micros.fetch_add(micros, Ordering::Relaxed);
        metrics.acquisitions.increment(1);
        metrics.wait.record(waited.as_secs_f64());
    }

    pub(crate) fn snapshot(&self) -> LockStats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        LockStats {
            acquisitions: read(&self.acquisitions),
            busy_retries: read(&self.busy_retries),
            handoffs: read(&self.handoffs),
            transient_retries: read(&self.transient_retries),
            timeouts: read(&self.timeouts),
            renewals: read(&self.renewals),
            renewal_failures: read(&self.renewal_failures),
            losses: read(&self.losses),
            releases: read(&self.releases),
            release_failures: read(&self.release_failures),
            wait_micros: read(&self.wait_micros),
            fence_regressions: read(&self.fence_regressions),
        }
    }
}
