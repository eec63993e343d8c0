//! The mutex: [`Locks`], a family of exclusive locks (its scripts and server-side layout are in
//! [`rules`]).

mod rules;

use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{self, Engine, Mode};
use crate::error::LockError;
use crate::key::{KeyCodec, LockKeys};
use crate::options::LockSettings;

pub(in crate::primitives) use rules::{
    MUTEX, MutexRules, SINCE_HORIZON_MS, prune_head, script_keys,
};

/// A family of locks over keys of type `K` with one lease, namespace and acknowledgement mode.
///
/// Made by [`LockClient::lock`](crate::LockClient::lock) or
/// [`LockClient::lock_with`](crate::LockClient::lock_with); cheap to clone. See
/// [`Locks::with_lock`] for an example.
pub struct Locks<K: ?Sized> {
    pub(super) engine: Arc<Engine>,
    pub(super) settings: Arc<LockSettings>,
    _key: PhantomData<fn(&K)>,
}

impl<K: ?Sized> Clone for Locks<K> {
    fn clone(&self) -> Self {
        Locks {
            engine: Arc::clone(&self.engine),
            settings: Arc::clone(&self.settings),
            _key: PhantomData,
        }
    }
}

impl<K: ?Sized> fmt::Debug for Locks<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locks")
            .field("lease", &self.settings.lease)
            .field("namespace", &self.settings.namespace)
            .field(
                "replica_acknowledgement",
                &self.settings.replica_acknowledgement,
            )
            .finish_non_exhaustive()
    }
}

impl<K: ?Sized> Locks<K> {
    pub(crate) fn new(engine: Arc<Engine>, settings: LockSettings) -> Self {
        Locks {
            engine,
            settings: Arc::new(settings),
            _key: PhantomData,
        }
    }

    /// How long one acquisition or renewal holds the lock on the server (the family's
    /// [`LockOptions::lease`](crate::LockOptions::lease), 30 s by default).
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.settings.lease
    }

    /// The namespace the family's keys live in on the server (`lock` by default): families
    /// with the same namespace and key share the lock.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.settings.namespace
    }

    /// Waits up to `wait_timeout` for the lock on `key`, runs `body` while holding it (renewing
    /// as needed), releases it, and returns the body's output.
    ///
    /// Construct the work inside `body`: work started before the call may run unprotected, and
    /// tasks the body spawns without awaiting them may outlive the lock. The body runs at most
    /// once and is never retried. A body that panics propagates the panic out of this call; the
    /// lock is then released at once, in the background, as when the call is cancelled (a
    /// [`hold_at_least`](crate::LockOptions::hold_at_least) minimum hold is kept).
    ///
    /// After the body ends, the call waits for the release's reply: when the server stopped
    /// answering, a successful call returns up to [`RELEASE_TIMEOUT`](crate::RELEASE_TIMEOUT)
    /// (1 s) after its body ended.
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`]: `wait_timeout` is zero; a key of this lock on the
    ///   server holds a value of another type (argument `key`); the node of a
    ///   [`from_fred`](crate::LockClient::from_fred) client cannot hold locks (argument
    ///   `from_fred`).
    /// - [`LockError::TimedOut`]: not acquired within `wait_timeout` (which covers replies, retry
    ///   delays and replica acknowledgement, not the body). It returns at most about 25 ms past
    ///   the wait, also when the server stopped answering. Nested in the body of the task's own
    ///   hold of `key` in a family that is not [`reentrant`](crate::LockOptions::reentrant), it
    ///   returns at once with
    ///   [`TimeoutReason::HeldByThisTask`](crate::TimeoutReason::HeldByThisTask).
    /// - [`LockError::LockLost`]: the lease was lost; the body future was dropped. It returns
    ///   at the loss (at most about 25 ms later), the release that follows going on in the
    ///   background. A loss nobody noticed before the body ended (no renewal came between) is
    ///   not an error: the release finds it, logs it at `WARN` and counts it in
    ///   [`LockStats::losses`](crate::LockStats::losses).
    /// - [`LockError::Backend`]: a non-transient server or connection error (transient ones are
    ///   retried within the wait), a call outside a Tokio runtime, or a client closed by
    ///   [`LockClient::quit`](crate::LockClient::quit).
    ///
    /// Dropping the returned future stops renewal and releases the lock in the background.
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// use std::time::Duration;
    ///
    /// let locks = client.lock::<String>();
    /// let balance = locks
    ///     .with_lock("account:42", Duration::from_secs(2), async { 100 })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn with_lock<Q, F>(
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
        let keys = self.keys(key);
        // Boxed once here, so the futures wrapping it stay small however large the body is.
        let body = Box::pin(body);
        let (engine, settings) = (Arc::clone(&self.engine), Arc::clone(&self.settings));
        let rules = Arc::clone(&MUTEX);
        async move {
            if wait_timeout.is_zero() {
                return Err(LockError::invalid(
                    "wait_timeout",
                    "must be positive, e.g. Duration::from_secs(2); use try_with_lock to not wait",
                ));
            }
            match engine::run(
                engine,
                rules,
                settings,
                keys,
                Mode::Wait(wait_timeout),
                body,
            )
            .await?
            {
                Some(output) => Ok(output),
                None => Err(LockError::invalid(
                    "wait_timeout",
                    "internal: busy result in waiting mode",
                )),
            }
        }
    }

    /// Runs `body` under the lock on `key` if it is free now: `Ok(None)` when another owner holds
    /// it, or this task holds it already (the call is nested in its body, and the family is not
    /// [`reentrant`](crate::LockOptions::reentrant)); the body is not run then.
    /// `Ok(Some(output))` after running the body and releasing. Panics and the release wait
    /// are as for [`Locks::with_lock`].
    ///
    /// # Errors
    /// - [`LockError::TimedOut`]: transient failures did not clear within about one second
    ///   ([`TRY_LOCK_RETRY_WINDOW`](crate::TRY_LOCK_RETRY_WINDOW), bounded by the usable lease).
    /// - [`LockError::InvalidArgument`], [`LockError::LockLost`], [`LockError::Backend`]: as for
    ///   [`Locks::with_lock`] (except a zero `wait_timeout`, which has no meaning here).
    pub fn try_with_lock<Q, F>(
        &self,
        key: &Q,
        body: F,
    ) -> impl Future<Output = Result<Option<F::Output>, LockError>> + use<K, Q, F>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        let keys = self.keys(key);
        // Boxed once here, so the futures wrapping it stay small however large the body is.
        let body = Box::pin(body);
        let (engine, settings) = (Arc::clone(&self.engine), Arc::clone(&self.settings));
        engine::run(engine, Arc::clone(&MUTEX), settings, keys, Mode::Try, body)
    }

    pub(super) fn keys<Q: KeyCodec + ?Sized>(&self, key: &Q) -> Arc<LockKeys> {
        let mut encoded = Vec::new();
        key.encode_key(&mut encoded);
        Arc::new(LockKeys::new(&self.settings.namespace, &encoded))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LockClient, LockOptions};

    #[test]
    fn lock_futures_stay_small_whatever_the_body() {
        let client = LockClient::from_fred(fred::clients::Client::default());
        let locks: Locks<str> = client.lock();
        let big = [7_u8; 4096];
        let body = async move { big.len() };
        let waiting = locks.with_lock("k", Duration::from_secs(1), body);
        assert!(
            std::mem::size_of_val(&waiting) < 1024,
            "{}",
            std::mem::size_of_val(&waiting)
        );
        let trying = locks.try_with_lock("k", async move { big.len() });
        assert!(
            std::mem::size_of_val(&trying) < 1024,
            "{}",
            std::mem::size_of_val(&trying)
        );
    }

    #[test]
    fn invalid_options_name_the_fix() {
        let client = LockClient::from_fred(fred::clients::Client::default());
        let short = client.lock_with::<str>(LockOptions::new().lease(Duration::from_millis(5)));
        assert!(matches!(
            short,
            Err(LockError::InvalidArgument {
                argument: "lease",
                ..
            })
        ));
        let empty = client.lock_with::<str>(LockOptions::new().namespace(""));
        assert!(matches!(
            empty,
            Err(LockError::InvalidArgument {
                argument: "namespace",
                ..
            })
        ));
    }
}
