//! [`Lease`]: what the body knows about the lock it runs under, through [`current_lease`].
//!
//! Lease arithmetic follows the machine's real monotonic clock ([`std::time::Instant`]), which
//! runs on like the server's, never tokio's clock, which a test may pause or advance: a body
//! that blocks past its lease under a paused tokio clock still sees the lease as spent. Only
//! timers are tokio's ([`timer_at`] converts).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::key::LockKeys;

tokio::task_local! {
    static CURRENT_LEASE: Lease;
}

/// The lease the current task's lock body runs under, or `None` outside a lock body.
///
/// Set for the body's own task only: tasks the body spawns do not see it (pass the [`Lease`]
/// to them explicitly).
///
/// ```no_run
/// # async fn demo(locks: sage_lock::Locks<str>) -> Result<(), sage_lock::LockError> {
/// use std::time::Duration;
///
/// locks.with_lock("account:42", Duration::from_secs(2), async {
///     let lease = sage_lock::current_lease().expect("inside a lock body");
///     // Send the token with every write; the store rejects tokens lower than the highest seen.
///     println!("writing with fencing token {}", lease.fencing_token());
/// }).await?;
/// # Ok(()) }
/// ```
#[must_use]
pub fn current_lease() -> Option<Lease> {
    CURRENT_LEASE.try_with(Lease::clone).ok()
}

/// Runs `body` with `lease` as its [`current_lease`].
pub(crate) fn scope<F: Future>(lease: Lease, body: F) -> impl Future<Output = F::Output> {
    CURRENT_LEASE.scope(lease, body)
}

/// A held lock: its key, its fencing token, and how long it is still known to be valid.
///
/// Cheap to clone; clones observe renewals. Get it inside a lock body with [`current_lease`]
/// (see its example).
#[derive(Clone)]
pub struct Lease {
    state: Arc<LeaseState>,
}

struct LeaseState {
    /// The drift margin subtracted from the lease.
    margin: Duration,
    /// The lock's server names; the key's text is made only when asked for.
    keys: Arc<LockKeys>,
    namespace: Arc<str>,
    fencing_token: u64,
    acquired_at: Instant,
    /// Nanoseconds after `acquired_at` at which the usable lease ends.
    valid_for_nanos: AtomicU64,
}

impl Lease {
    pub(crate) fn new(
        keys: Arc<LockKeys>,
        namespace: Arc<str>,
        fencing_token: u64,
        acquired_at: Instant,
        valid_until: Instant,
        margin: Duration,
    ) -> Self {
        let lease = Lease {
            state: Arc::new(LeaseState {
                margin,
                keys,
                namespace,
                fencing_token,
                acquired_at,
                valid_for_nanos: AtomicU64::new(0),
            }),
        };
        lease.extend_to(valid_until);
        lease
    }

    /// The fencing token: a number that strictly increases with every acquisition of this key
    /// (across processes and lease expiries). A store that remembers the highest token it has
    /// seen per key and rejects lower ones is safe against a holder that lost its lease without
    /// noticing (a long pause, a network partition).
    #[must_use]
    pub fn fencing_token(&self) -> u64 {
        self.state.fencing_token
    }

    /// The lock key, as text (non-UTF-8 bytes escaped).
    #[must_use]
    pub fn key(&self) -> &str {
        self.state.keys.display()
    }

    /// The lock's namespace.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.state.namespace
    }

    /// How much of the usable lease is left (zero once it has run out). Renewals extend it.
    #[must_use]
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// True while the usable lease has not run out.
    #[must_use]
    pub fn is_valid(&self) -> bool {
        !self.remaining().is_zero()
    }

    /// How long ago the lock was acquired.
    #[must_use]
    pub fn held_for(&self) -> Duration {
        self.state.acquired_at.elapsed()
    }

    /// The drift margin between the usable lease and the server-side expiry.
    pub(crate) fn margin(&self) -> Duration {
        self.state.margin
    }

    /// When the attempt that acquired the lock was sent (real clock).
    pub(crate) fn acquired_at(&self) -> Instant {
        self.state.acquired_at
    }

    /// When the usable lease ends, as a tokio timer deadline (see [`timer_at`]).
    pub(crate) fn deadline(&self) -> tokio::time::Instant {
        timer_at(self.valid_until())
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.state.acquired_at
            + Duration::from_nanos(self.state.valid_for_nanos.load(Ordering::Acquire))
    }

    /// Moves the end of the usable lease (never backwards).
    pub(crate) fn extend_to(&self, valid_until: Instant) {
        let nanos = valid_until
            .saturating_duration_since(self.state.acquired_at)
            .as_nanos();
        let nanos = u64::try_from(nanos).unwrap_or(u64::MAX);
        self.state
            .valid_for_nanos
            .fetch_max(nanos, Ordering::AcqRel);
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key())
            .field("namespace", &self.namespace())
            .field("fencing_token", &self.fencing_token())
            .field("remaining", &self.remaining())
            .finish()
    }
}

/// The tokio timer deadline for the real-clock instant `real`: as far ahead of tokio's now as
/// `real` is of the real now (tokio's clock may be paused or advanced in tests).
pub(crate) fn timer_at(real: Instant) -> tokio::time::Instant {
    tokio::time::Instant::now() + real.saturating_duration_since(Instant::now())
}

/// The safety margin subtracted from every lease: 1% for clock drift plus 2 ms.
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn current_lease_is_scoped_to_the_body() {
        assert!(current_lease().is_none());
        let now = Instant::now();
        let lease = Lease::new(
            Arc::new(LockKeys::new("ns", b"k")),
            "ns".into(),
            7,
            now,
            now + Duration::from_secs(1),
            Duration::ZERO,
        );
        let seen = scope(lease, async {
            current_lease().map(|l| (l.fencing_token(), l.is_valid(), l.key().to_owned()))
        })
        .await;
        assert_eq!(seen, Some((7, true, "k".to_owned())));
        assert!(current_lease().is_none());
    }

    #[test]
    fn extend_never_moves_backwards() {
        let now = Instant::now();
        let lease = Lease::new(
            Arc::new(LockKeys::new("ns", b"k")),
            "ns".into(),
            1,
            now,
            now + Duration::from_secs(10),
            Duration::ZERO,
        );
        lease.extend_to(now + Duration::from_secs(1));
        assert!(lease.remaining() > Duration::from_secs(5));
    }
}
