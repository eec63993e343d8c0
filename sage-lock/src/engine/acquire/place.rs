//! A waiting caller's place in a lock's server-side queue: how long it lasts, the release
//! channels it watches for the release that names it, and the grant such a release hands it.

use std::sync::Arc;
use std::time::Duration;

use fred::bytes::Bytes;
use tokio::time::Instant;

use super::super::handoff::handed_off;
use super::super::{Engine, Held, Rules, WAITER_TTL};
use crate::key::LockKeys;
use crate::lease::Lease;
use crate::notify::{Subscribed, Watch};
use crate::options::LockSettings;
use crate::retry::remaining;

/// A waiter's watch on the release channels of its place (empty until its first refusal).
#[derive(Default)]
pub(super) struct Place<'a> {
    /// The release channels watched once refused (empty until then, or when none).
    watches: Vec<Watch<'a>>,
    /// Whether every watched channel is subscribed, so a release will name this waiter.
    pub(super) subscribed: bool,
    /// When the last attempt that found the lock busy (and so queued) was sent: a release can
    /// only hand the lock over after that.
    queued_at: Option<std::time::Instant>,
    /// The fencing counter that attempt saw: a genuine hand-off to this waiter came later, so
    /// its fence is higher (a grant that was lost before that attempt, announced late, is not).
    counter_seen: Option<u64>,
    /// That attempt's round trip: what a renewal of a handed-off grant may take too.
    round_trip: Duration,
}

impl<'a> Place<'a> {
    /// An attempt sent at `sent` found the lock busy (its answer just came), with the fencing
    /// counter at `fence`: it queued (or refreshed) this waiter's place.
    pub(super) fn queued(&mut self, sent: std::time::Instant, fence: Option<u64>) {
        self.queued_at = Some(sent);
        self.counter_seen = fence;
        self.round_trip = sent.elapsed();
    }

    /// The lease of the hold a release handed this waiter since it queued, if one did and
    /// enough of it is left to trust without asking the server.
    pub(super) fn handed_off(
        &self,
        settings: &LockSettings,
        keys: &Arc<LockKeys>,
    ) -> Option<Lease> {
        let (watch, queued_at, counter_seen) =
            (self.watches.first()?, self.queued_at?, self.counter_seen?);
        let grant = watch.take_grant()?;
        if grant.fence <= counter_seen {
            return None;
        }
        handed_off(grant, queued_at, self.round_trip, settings, keys)
    }

    /// Watches the channels a release of `keys` names the next waiter on (or announces itself
    /// on) and subscribes them, spending at most a second; true when one was subscribed just
    /// now, so a release may have slipped past: the caller tries again at once.
    pub(super) async fn watch(
        &mut self,
        engine: &'a Engine,
        rules: &Arc<dyn Rules>,
        keys: &LockKeys,
        token: &Bytes,
        deadline: Instant,
    ) -> bool {
        if self.watches.is_empty() {
            self.watches = rules
                .watched_keys(keys)
                .iter()
                .map(|key| engine.notifier.watch(key, token.clone()))
                .collect();
        }
        if self.watches.is_empty() || self.subscribed {
            return false;
        }
        let limit = deadline.min(Instant::now() + Duration::from_secs(1));
        let mut fresh = false;
        let mut unavailable = false;
        for watch in &self.watches {
            match Box::pin(watch.subscribe(limit)).await {
                Subscribed::Already => {}
                Subscribed::New => fresh = true,
                Subscribed::Unavailable => unavailable = true,
            }
        }
        self.subscribed = !unavailable;
        fresh
    }

    /// A poll found the release this place waited for (its watches heard nothing): their
    /// channels are subscribed again by the next watch (see [`Watch::missed_release`]).
    pub(super) fn missed_release(&mut self) {
        self.watches.iter().for_each(Watch::missed_release);
        self.subscribed = false;
    }

    /// Resolves when a release names this waiter on any watched channel (never, with none).
    pub(super) async fn named(&self) {
        if self.watches.is_empty() {
            return std::future::pending().await;
        }
        let mut notified: Vec<_> = self
            .watches
            .iter()
            .map(|w| Box::pin(w.notified()))
            .collect();
        std::future::poll_fn(|cx| {
            if notified.iter_mut().any(|n| n.as_mut().poll(cx).is_ready()) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
    }
}

/// How long a queued waiter's place lasts after an attempt sent now: [`WAITER_TTL`], or less
/// when the wait ends sooner (a waiter never needs its place past its own deadline, so one that
/// dies holds up the queue no longer than it would have waited). At least 1 ms: 0 would mean a
/// try, which does not queue.
pub(super) fn place_ttl(deadline: Instant) -> Duration {
    remaining(deadline).clamp(Duration::from_millis(1), WAITER_TTL)
}

/// Takes `held`'s token out of the lock's server-side queue (the release call does that too).
pub(super) async fn leave_queue(
    engine: &Engine,
    rules: &Arc<dyn Rules>,
    keys: &LockKeys,
    held: &Held,
    deadline: Instant,
) {
    let call = rules.release_call(keys, &held.token, held.handoff_lease);
    let limit = deadline.min(Instant::now() + super::super::RELEASE_TIMEOUT);
    if let Err(error) = engine.conn.run_plain(&call, limit).await {
        tracing::debug!(?error, "leaving the waiter queue failed; the place expires");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{WAITER_TTL, place_ttl};

    #[test]
    fn a_place_lasts_until_the_wait_ends_at_most() {
        let now = Instant::now();
        assert_eq!(place_ttl(now + Duration::from_secs(60)), WAITER_TTL);
        let short = place_ttl(now + Duration::from_millis(300));
        assert!(short <= Duration::from_millis(300) && short > Duration::from_millis(250));
        // A wait that is over still queues (0 would make the attempt a try).
        assert_eq!(place_ttl(now), Duration::from_millis(1));
    }
}
