//! The mutex: [`Locks`], a family of exclusive locks, and the scripts behind it.
//!
//! A lock on key `k` is the string key `{ns:k}` holding the owner's token, with the lease as its
//! TTL; its fencing counter is `{ns:k}:fence`.

use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::Value;

use crate::engine::{self, Engine, Mode, Rules};
use crate::error::LockError;
use crate::key::{KeyCodec, LockKeys};
use crate::options::LockSettings;
use crate::renewal::{HoldKind, RenewTarget};
use crate::retry::millis;
use crate::scripts::{Script, ScriptCall};

/// Acquire: `SET NX PX` and, when granted, `INCR` the fencing counter, in one step.
///
/// Replies `{1, fence}` when granted (also when the key already holds this token, so a retry
/// after an unknown outcome is safe), or `{0, pttl}` when another owner holds it.
const ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[2])}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// Release: `DEL` only while the key still holds this token. Replies 1 or 0.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE));
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));

/// The mutex's rules: one owner at a time.
#[derive(Debug)]
pub(crate) struct MutexRules;

impl Rules for MutexRules {
    fn acquire_call(&self, keys: &LockKeys, token: &Bytes, lease: Duration) -> ScriptCall<'static> {
        let args = vec![Value::Bytes(token.clone()), Value::Integer(millis(lease))];
        ACQUIRE_SCRIPT.on_lock(keys, args)
    }

    fn release_call(&self, keys: &LockKeys, token: &Bytes) -> ScriptCall<'static> {
        RELEASE_SCRIPT.on_lock(keys, vec![Value::Bytes(token.clone())])
    }

    fn renew_target(&self, keys: &LockKeys) -> RenewTarget {
        RenewTarget {
            key: keys.lock.clone(),
            kind: HoldKind::Owner,
        }
    }
}

/// The shared rules value (no state).
static MUTEX: LazyLock<Arc<dyn Rules>> = LazyLock::new(|| Arc::new(MutexRules));

/// A family of locks over keys of type `K` with one lease, namespace and acknowledgement mode.
///
/// Made by [`LockClient::lock`](crate::LockClient::lock) or
/// [`LockClient::lock_with`](crate::LockClient::lock_with); cheap to clone. See
/// [`Locks::with_lock`] for an example.
pub struct Locks<K: ?Sized> {
    engine: Arc<Engine>,
    settings: Arc<LockSettings>,
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

    /// The lease duration.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.settings.lease
    }

    /// The namespace.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.settings.namespace
    }

    /// Waits up to `wait_timeout` for the lock on `key`, runs `body` while holding it (renewing
    /// as needed), releases it, and returns the body's output.
    ///
    /// Construct the work inside `body`: work started before the call may run unprotected, and
    /// tasks the body spawns without awaiting them may outlive the lock. The body runs at most
    /// once and is never retried.
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`]: `wait_timeout` is zero.
    /// - [`LockError::TimedOut`]: not acquired within `wait_timeout` (which covers replies, retry
    ///   delays and replica acknowledgement, not the body); cleanup may add up to a second.
    /// - [`LockError::LockLost`]: the lease was lost; the body future was dropped.
    /// - [`LockError::Backend`]: a non-transient server or connection error.
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
    /// it (the body is not run), `Ok(Some(output))` after running the body and releasing.
    ///
    /// Transient failures are retried for up to about one second (bounded by the usable lease),
    /// then [`LockError::TimedOut`]. Other errors as for [`Locks::with_lock`].
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

    fn keys<Q: KeyCodec + ?Sized>(&self, key: &Q) -> Arc<LockKeys> {
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
