//! The expirable semaphore: [`Semaphores`], at most `permits` holders per key, each permit a
//! lease of its own.
//!
//! The holders of key `k` are the members of the sorted set `{ns:k}:sem`, each a holder's token
//! scored by its expiry in server milliseconds (`TIME`); every script first drops the expired
//! members, so a crashed holder's permit comes back when its lease ends. Grants increment the
//! fencing counter `{ns:k}:fence`.
//!
//! Waiting callers queue in arrival order: the sorted set `{ns:k}:sem-queue` scores each
//! waiter's token by the server time of its first refusal (µs, strictly increasing), and
//! `{ns:k}:sem-due` scores it by when its place ends (refreshed by each attempt, at most 2 s
//! ahead, so a dead waiter's place ends on its own; see the `waiter_queue_lua!` text). A free
//! permit goes to the first live waiters only: a caller is granted when fewer live waiters are
//! queued ahead of it than permits are free. While the queue exists, a release hands the free
//! permits over to the first live waiters on the server (each a holder for the hand-off lease,
//! with a new fencing token) and names them on `{ns:k}:sem}:released` (`token:fence:ms`), so
//! they enter at once, in any process, and the others stay asleep.
//!
//! The scripts and the rules the engine runs them by are in `rules`.

mod rules;

use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use rules::SemaphoreRules;
pub(crate) use rules::shorten_member;

use super::family::Family;
use crate::engine::{self, Engine, Mode, Rules};
use crate::error::LockError;
use crate::key::KeyCodec;
use crate::options::LockSettings;

/// A family of expirable semaphores over keys of type `K`: at most [`Semaphores::permits`]
/// holders per key at a time, each holding a permit under its own lease (renewed while its body
/// runs), so a crashed holder's permit comes back when its lease ends.
///
/// Waiting callers are served in arrival order, across processes: a free permit goes to the
/// callers that have waited longest (a place lasts at most 2 s after the caller's last attempt,
/// so a dead waiter holds a permit up no longer than that), and
/// [`try_acquire`](Semaphores::try_acquire) never takes a permit a waiting caller is owed.
///
/// Made by [`LockClient::semaphore`](crate::LockClient::semaphore) or
/// [`LockClient::semaphore_with`](crate::LockClient::semaphore_with); cheap to clone. Options,
/// errors and guarantees (renewal, loss, fencing, replica acknowledgement, cancellation) are the
/// mutex's, see [`Locks::with_lock`](crate::Locks::with_lock).
///
/// **The limit is per call.** The server stores holders, not the limit: a call is granted while
/// fewer holders than *its own* family's `permits` hold the key. So families with different
/// limits may share a key: one with a smaller limit waits until the holders drop below it, one
/// with a larger limit may add holders beyond the smaller limit. Holders are never revoked when
/// a limit changes; to lower a key's limit safely, deploy the new limit everywhere and let the
/// holders above it finish. Mixed limits keep the arrival order: a waiter of a smaller limit is
/// not passed by later callers of a larger one.
///
/// ```no_run
/// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
/// use std::time::Duration;
///
/// // At most 4 exports run at once, across every process.
/// let exports = client.semaphore::<str>(4);
/// let rows = exports
///     .acquire("export", Duration::from_secs(10), async { 1_000 })
///     .await?;
/// # Ok(()) }
/// ```
pub struct Semaphores<K: ?Sized> {
    family: Family,
    rules: Arc<dyn Rules>,
    permits: u32,
    _key: PhantomData<fn(&K)>,
}

impl<K: ?Sized> Clone for Semaphores<K> {
    fn clone(&self) -> Self {
        Semaphores {
            family: self.family.clone(),
            rules: Arc::clone(&self.rules),
            permits: self.permits,
            _key: PhantomData,
        }
    }
}

impl<K: ?Sized> fmt::Debug for Semaphores<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.family
            .debug(f, "Semaphores")
            .field("permits", &self.permits)
            .finish_non_exhaustive()
    }
}

/// Checks a semaphore's `permits`.
pub(crate) fn validate_permits(permits: u32) -> Result<(), LockError> {
    if permits == 0 {
        return Err(LockError::invalid(
            "permits",
            "must be at least 1, e.g. client.semaphore::<str>(4); a semaphore with 0 permits \
             could never be acquired",
        ));
    }
    Ok(())
}

impl<K: ?Sized> Semaphores<K> {
    /// A family on `engine`. With `permits == 0` every call fails with
    /// [`LockError::InvalidArgument`] ([`LockClient::semaphore_with`](crate::LockClient::semaphore_with)
    /// rejects it up front).
    pub(crate) fn new(engine: Arc<Engine>, settings: LockSettings, permits: u32) -> Self {
        Semaphores {
            family: Family::new(engine, settings),
            rules: Arc::new(SemaphoreRules::new(permits)),
            permits,
            _key: PhantomData,
        }
    }

    /// How many holders a key may have at once (through this family, see the type's docs).
    #[must_use]
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// How long each permit stays valid on the server without renewal (the family's
    /// [`LockOptions::lease`](crate::LockOptions::lease), 30 s by default).
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.family.settings.lease
    }

    /// The namespace the family's keys live in on the server (`lock` by default).
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.family.settings.namespace
    }

    /// Waits up to `wait_timeout` for a permit on `key`, runs `body` while holding it (renewing
    /// as needed), gives the permit back, and returns the body's output.
    ///
    /// [`current_lease`](crate::current_lease) inside the body is this permit's lease; its
    /// fencing token comes from the key's counter, incremented on every grant.
    ///
    /// # Errors
    /// As for [`Locks::with_lock`](crate::Locks::with_lock): `InvalidArgument` (zero
    /// `wait_timeout`, a family of `permits == 0` (argument `permits`), or as there),
    /// `TimedOut` (no permit within the wait), `LockLost` (the permit's lease was lost; the
    /// body was dropped), `Backend`.
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// use std::time::Duration;
    ///
    /// let slots = client.semaphore::<u64>(2);
    /// slots.acquire(&7, Duration::from_secs(2), async { /* one of at most 2 */ }).await?;
    /// # Ok(()) }
    /// ```
    pub fn acquire<Q, F>(
        &self,
        key: &Q,
        wait_timeout: Duration,
        body: F,
    ) -> impl Future<Output = Result<F::Output, LockError>> + use<K, Q, F>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        let keys = self.family.keys(key);
        let body = Box::pin(body);
        let Family { engine, settings } = self.family.clone();
        let (rules, permits) = (Arc::clone(&self.rules), self.permits);
        async move {
            validate_permits(permits)?;
            engine::run_waiting(
                engine,
                rules,
                settings,
                keys,
                wait_timeout,
                "try_acquire",
                body,
            )
            .await
        }
    }

    /// Runs `body` under a permit on `key` if one is free now: `Ok(None)` when all permits are
    /// held or the free ones are owed to waiting callers (the body is not run),
    /// `Ok(Some(output))` after running the body and giving the
    /// permit back. Transient failures are retried as for
    /// [`Locks::try_with_lock`](crate::Locks::try_with_lock).
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`]: a family of `permits == 0` (argument `permits`), or as
    ///   for [`Locks::with_lock`](crate::Locks::with_lock).
    /// - [`LockError::TimedOut`]: transient failures did not clear within about one second.
    /// - [`LockError::LockLost`], [`LockError::Backend`]: as for
    ///   [`Locks::with_lock`](crate::Locks::with_lock).
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// let slots = client.semaphore::<str>(2);
    /// if slots.try_acquire("crawl", async { /* work */ }).await?.is_none() {
    ///     println!("both crawlers busy; try later");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_acquire<Q, F>(
        &self,
        key: &Q,
        body: F,
    ) -> impl Future<Output = Result<Option<F::Output>, LockError>> + use<K, Q, F>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        let keys = self.family.keys(key);
        let body = Box::pin(body);
        let Family { engine, settings } = self.family.clone();
        let (rules, permits) = (Arc::clone(&self.rules), self.permits);
        async move {
            validate_permits(permits)?;
            engine::run(engine, rules, settings, keys, Mode::Try, body).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockClient;

    #[test]
    fn zero_permits_is_rejected_with_the_fix() {
        let client = LockClient::from_fred(fred::clients::Client::default());
        let zero = client.semaphore_with::<str>(0, crate::LockOptions::new());
        match zero {
            Err(LockError::InvalidArgument { argument, message }) => {
                assert_eq!(argument, "permits");
                assert!(message.contains("at least 1"), "{message}");
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        assert_eq!(client.semaphore::<str>(3).permits(), 3);
    }

    #[tokio::test]
    async fn zero_permits_family_fails_every_call() {
        let client = LockClient::from_fred(fred::clients::Client::default());
        let zero = client.semaphore::<str>(0);
        let waited = zero.acquire("k", Duration::from_secs(1), async {}).await;
        assert!(matches!(
            waited,
            Err(LockError::InvalidArgument {
                argument: "permits",
                ..
            })
        ));
        let tried = zero.try_acquire("k", async {}).await;
        assert!(matches!(
            tried,
            Err(LockError::InvalidArgument {
                argument: "permits",
                ..
            })
        ));
    }

    #[test]
    fn semaphore_futures_stay_small_whatever_the_body() {
        let client = LockClient::from_fred(fred::clients::Client::default());
        let sem = client.semaphore::<str>(2);
        let big = [7_u8; 4096];
        let waiting = sem.acquire("k", Duration::from_secs(1), async move { big.len() });
        assert!(std::mem::size_of_val(&waiting) < 1024);
        let trying = sem.try_acquire("k", async move { big.len() });
        assert!(std::mem::size_of_val(&trying) < 1024);
    }
}
