//! [`Lease`]: what the body knows about the lock it runs under, through [`current_lease`].
//!
//! Lease arithmetic follows the machine's real monotonic clock ([`std::time::Instant`]), which
//! runs on like the server's, never tokio's clock, which a test may pause or advance: a body
//! that blocks past its lease under a paused tokio clock still sees the lease as spent. Only
//! timers are tokio's ([`timer_at`] converts).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
/// (see its example). Under [`Locks::with_locks`](crate::Locks::with_locks) it describes the
/// caller's first key, and [`Lease::fencing_token_of`] gives the token of every other key.
#[derive(Clone)]
pub struct Lease {
    state: Arc<LeaseState>,
    /// Every key of a several-key hold with its fencing token, in lock order (else `None`).
    parts: Option<Arc<[Part]>>,
    /// One key of a several-key hold seen on its own (a reentrant call for it): this lease's
    /// key and fencing token instead of the state's (else `None`).
    view: Option<Arc<Part>>,
}

/// One key of a several-key hold and its fencing token.
type Part = (Arc<LockKeys>, u64);

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
    /// Set when the hold ended (released, lost, or its call cancelled): no time is left.
    ended: AtomicBool,
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
                ended: AtomicBool::new(false),
            }),
            parts: None,
            view: None,
        };
        lease.extend_to(valid_until);
        lease
    }

    /// This lease (same state, so it observes the same renewals), naming every key of a
    /// several-key hold with its fencing token.
    pub(crate) fn with_parts(self, parts: Vec<Part>) -> Self {
        Lease {
            state: self.state,
            parts: Some(parts.into()),
            view: None,
        }
    }

    /// This lease (same state, so it observes the same renewals) as the lease of `keys` alone,
    /// one key of its several-key hold, with that key's fencing token.
    pub(crate) fn part(&self, keys: Arc<LockKeys>, fencing_token: u64) -> Self {
        Lease {
            state: Arc::clone(&self.state),
            parts: None,
            view: Some(Arc::new((keys, fencing_token))),
        }
    }

    /// The fencing token: a number that strictly increases with every acquisition of this key
    /// (across processes and lease expiries). A store that remembers the highest token it has
    /// seen per key and rejects lower ones is safe against a holder that lost its lease without
    /// noticing (a long pause, a network partition). Tokens are unique per key but may skip
    /// numbers (a retried or confirmed grant takes a token of its own).
    #[must_use]
    pub fn fencing_token(&self) -> u64 {
        self.view
            .as_ref()
            .map_or(self.state.fencing_token, |view| view.1)
    }

    /// The fencing token of `key`, spelled as [`Lease::key`] spells it: under
    /// [`Locks::with_locks`](crate::Locks::with_locks), of any of the caller's keys; otherwise
    /// of the lease's own key. `None` for a key this lease does not hold.
    ///
    /// ```no_run
    /// # async fn demo(locks: sage_lock::Locks<str>) -> Result<(), sage_lock::LockError> {
    /// use std::time::Duration;
    ///
    /// locks.with_locks(&["account:1", "account:2"], Duration::from_secs(2), async {
    ///     let lease = sage_lock::current_lease().expect("inside a lock body");
    ///     let from = lease.fencing_token_of("account:1");
    ///     let to = lease.fencing_token_of("account:2");
    ///     println!("debit with token {from:?}, credit with token {to:?}");
    /// }).await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn fencing_token_of(&self, key: &str) -> Option<u64> {
        self.fencing_tokens()
            .find(|(held, _)| *held == key)
            .map(|(_, token)| token)
    }

    /// Every key this lease holds with its fencing token: its own key, or under
    /// [`Locks::with_locks`](crate::Locks::with_locks) each distinct key of the call, in the
    /// order they were locked (hash slot, then name).
    pub fn fencing_tokens(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        let own = self
            .parts
            .is_none()
            .then(|| (self.key(), self.fencing_token()));
        let parts = self.parts.iter().flat_map(|parts| parts.iter());
        own.into_iter()
            .chain(parts.map(|(keys, token)| (keys.display().as_ref(), *token)))
    }

    /// The lock key, as text (non-UTF-8 bytes escaped).
    #[must_use]
    pub fn key(&self) -> &str {
        self.view
            .as_ref()
            .map_or(&self.state.keys, |view| &view.0)
            .display()
    }

    /// The lock's namespace.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.state.namespace
    }

    /// How much of the usable lease is left: zero once it has run out, and once the hold ended
    /// (released, lost, or its call cancelled), for a clone kept past the body. Renewals
    /// extend it.
    #[must_use]
    pub fn remaining(&self) -> Duration {
        if self.state.ended.load(Ordering::Acquire) {
            return Duration::ZERO;
        }
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// True while the usable lease has not run out and the hold has not ended.
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

    /// Marks the hold over (released, lost or cancelled): from now on no time is left.
    pub(crate) fn end(&self) {
        self.state.ended.store(true, Ordering::Release);
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
        let mut out = f.debug_struct("Lease");
        out.field("key", &self.key())
            .field("namespace", &self.namespace())
            .field("fencing_token", &self.fencing_token());
        if self.parts.is_some() {
            out.field("fencing_tokens", &self.fencing_tokens().collect::<Vec<_>>());
        }
        out.field("remaining", &self.remaining()).finish()
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
    fn every_key_of_a_several_key_hold_has_its_token() {
        let now = Instant::now();
        let keys = |name: &str| Arc::new(LockKeys::new("ns", name.as_bytes()));
        let single = Lease::new(keys("a"), "ns".into(), 7, now, now, Duration::ZERO);
        assert_eq!(single.fencing_tokens().collect::<Vec<_>>(), [("a", 7)]);
        assert_eq!(single.fencing_token_of("a"), Some(7));
        assert_eq!(single.fencing_token_of("b"), None);
        let several = single.with_parts(vec![(keys("a"), 7), (keys("b"), 3)]);
        assert_eq!(
            several.fencing_tokens().collect::<Vec<_>>(),
            [("a", 7), ("b", 3)]
        );
        assert_eq!(several.fencing_token_of("b"), Some(3));
        assert_eq!(several.fencing_token_of("c"), None);
        assert!(format!("{several:?}").contains(r#"fencing_tokens: [("a", 7), ("b", 3)]"#));
        let b = several.part(keys("b"), 3);
        assert_eq!((b.key(), b.fencing_token()), ("b", 3));
        assert_eq!(b.fencing_tokens().collect::<Vec<_>>(), [("b", 3)]);
        several.extend_to(now + Duration::from_secs(5));
        assert!(b.is_valid(), "a part's lease observes the hold's renewals");
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
