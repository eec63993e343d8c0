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
//! ahead, so a dead waiter's place ends on its own; see the `waiter_queue_lua!` text). A free permit goes to the first live waiters only: a caller is granted when
//! fewer live waiters are queued ahead of it than permits are free. While the queue exists, a
//! release hands the free permits over to the first live waiters on the server (each a holder
//! for the hand-off lease, with a new fencing token) and names them on `{ns:k}:sem}:released`
//! (`token:fence:ms`), so they enter at once, in any process, and the others stay asleep.

use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::Value;

use super::family::Family;
use crate::engine::{self, Engine, Mode, Rules};
use crate::error::LockError;
use crate::key::{KeyCodec, LockKeys};
use crate::options::LockSettings;
use crate::renewal::{HoldKind, RenewTarget};
use crate::retry::{millis, millis_ceil};
use crate::scripts::{Script, ScriptCall};

/// The suffix of a semaphore's holder set.
pub(crate) const HOLDERS: &str = ":sem";

/// The suffix of the waiter queue: each waiting caller's token, scored by the server time (µs) of
/// its first refusal, made strictly increasing so that arrivals never tie.
const QUEUE: &str = ":sem-queue";
/// The suffix of the waiters' places: each waiting caller's token, scored by the server time
/// (ms) its place ends.
const DUES: &str = ":sem-due";

/// What the release channel is named after: `{ns:k}:sem}`, so the channel,
/// `{ns:k}:sem}:released`, ends in `}:released` like the mutex's (the README's ACL channel
/// pattern `&{ns:*}:released` covers it); the hash tag is still `ns:k`.
const ANNOUNCED: &str = ":sem}";

/// Acquire. `KEYS`: holder set, fencing counter, waiter queue, waiter places; `ARGV`: token,
/// lease ms, permits, place ms (0 for a try, which never queues). Granted when a permit is free
/// (holders whose expiry has passed do not count) and fewer live waiters are queued ahead of the
/// caller (all of them, for a caller not queued) than permits are free, dead waiters met on the
/// way being dropped; or when the token already holds a permit (a retry is safe). A grant takes a
/// new fencing token, a repeated one too (other holders' grants may have moved the counter on
/// since this token's first one), and takes the caller out of the queue: `{1, fence}`. Else
/// `{0, ms until the first permit expires, fencing counter}` (`-1` for the ms when the free
/// permits are the waiters'), and a waiting caller keeps (or takes) its place, ending place ms
/// from now. Expired holders are dropped when a caller is refused, and at every 16th grant (by
/// fencing token).
const ACQUIRE: &str = concat!(
    waiter_queue_lua!(),
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local place = tonumber(ARGV[4])
local free = tonumber(ARGV[3]) - redis.call('ZCOUNT', KEYS[1], now + 1, '+inf')
local granted, queued = false, false
if free > 0 then
  local ahead
  ahead, queued = live_ahead(3, ARGV[1], now, free)
  granted = ahead < free
end
if not granted then
  granted = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0') > now
end
if granted then
  local fence = redis.call('INCR', KEYS[2])
  if fence % 16 == 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  end
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  if redis.call('PTTL', KEYS[1]) < lease then
    redis.call('PEXPIRE', KEYS[1], lease)
  end
  if queued then
    redis.call('ZREM', KEYS[3], ARGV[1])
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
  return {1, fence}
end
if place > 0 then
  take_place(3, ARGV[1], t, now, place)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then
  return {0, math.max(tonumber(first[2]) - now, 1), counter}
end
return {0, -1, counter}
"
);

/// Release. `KEYS`: holder set, waiter queue, waiter places, fencing counter; `ARGV`: token,
/// release channel, permits, hand-off lease ms. Removes the token from the holder set and from
/// the queue (a waiting caller that gives up leaves it this way). If either freed something
/// while others wait, it hands the free permits over (by this caller's limit) to the first live
/// waiters: each becomes a holder for the hand-off lease with a new fencing token, leaves the
/// queue, and `token:fence:ms` is published on the channel. The reply is
/// `{released, token, fence}` when one waiter was handed a permit (else `released`: 1 if the
/// token held a permit, else 0).
const RELEASE: &str = concat!(
    waiter_queue_lua!(),
    r"
local released = redis.call('ZREM', KEYS[1], ARGV[1])
local left = 0
if released == 0 then
  -- A holder is never queued (its grant took it out of the queue).
  left = redis.call('ZREM', KEYS[2], ARGV[1])
  if left == 1 then
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
end
if released + left > 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local free = tonumber(ARGV[3]) - redis.call('ZCARD', KEYS[1])
  if free > 0 then
    local handoff = tonumber(ARGV[4])
    local named = live_waiters(2, now, free)
    local fence
    for _, waiter in ipairs(named) do
      fence = redis.call('INCR', KEYS[4])
      redis.call('ZADD', KEYS[1], now + handoff, waiter)
      redis.call('ZREM', KEYS[2], waiter)
      redis.call('ZREM', KEYS[3], waiter)
      redis.pcall('SPUBLISH', ARGV[2], waiter .. ':' .. fence .. ':' .. handoff)
    end
    if #named > 0 and redis.call('PTTL', KEYS[1]) < handoff then
      redis.call('PEXPIRE', KEYS[1], handoff)
    end
    if #named == 1 then
      return {released, named[1], fence}
    end
  end
end
return released
"
);

/// Shorten (minimum hold). `KEYS`: holder set; `ARGV`: token, ms. Moves this token's expiry to
/// `ms` from now (keeping the set alive as long) if it still holds a permit. Replies 1 or 0.
const SHORTEN: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) > now then
  local keep = tonumber(ARGV[2])
  redis.call('ZADD', KEYS[1], now + keep, ARGV[1])
  if redis.call('PTTL', KEYS[1]) < keep then
    redis.call('PEXPIRE', KEYS[1], keep)
  end
  return 1
end
return 0
";

static SHORTEN_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SHORTEN));
static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE));
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));

/// Lets `token`'s member of the sorted set `{ns:key}<suffix>` expire in `keep_for` (rounded up)
/// instead of removing it: the minimum hold of the primitives whose holders are set members.
pub(crate) fn shorten_member(
    keys: &LockKeys,
    suffix: &str,
    token: &Bytes,
    keep_for: Duration,
) -> ScriptCall<'static> {
    let args = vec![
        Value::Bytes(token.clone()),
        Value::Integer(millis_ceil(keep_for)),
    ];
    SHORTEN_SCRIPT.call(keys.slot, vec![keys.companion(suffix)], args)
}

/// The semaphore's rules: at most `permits` holders.
#[derive(Debug)]
struct SemaphoreRules {
    permits: u32,
}

impl Rules for SemaphoreRules {
    fn wait_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        lease: Duration,
        waiter_ttl: Duration,
    ) -> ScriptCall<'static> {
        let args = vec![
            Value::Bytes(token.clone()),
            Value::Integer(millis(lease)),
            Value::Integer(i64::from(self.permits)),
            Value::Integer(millis(waiter_ttl)),
        ];
        let call_keys = vec![
            keys.companion(HOLDERS),
            keys.fence.clone(),
            keys.companion(QUEUE),
            keys.companion(DUES),
        ];
        ACQUIRE_SCRIPT.call(keys.slot, call_keys, args)
    }

    fn release_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        handoff_lease: Duration,
    ) -> ScriptCall<'static> {
        let call_keys = vec![
            keys.companion(HOLDERS),
            keys.companion(QUEUE),
            keys.companion(DUES),
            keys.fence.clone(),
        ];
        let channel = crate::notify::channel(&keys.companion(ANNOUNCED));
        let args = vec![
            Value::Bytes(token.clone()),
            Value::Bytes(channel),
            Value::Integer(i64::from(self.permits)),
            Value::Integer(millis(handoff_lease).max(1)),
        ];
        RELEASE_SCRIPT.call(keys.slot, call_keys, args)
    }

    fn release_announcement(&self, keys: &LockKeys) -> Option<Bytes> {
        Some(keys.companion(ANNOUNCED))
    }

    fn queues(&self) -> bool {
        true
    }

    fn shorten_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        keep_for: Duration,
    ) -> ScriptCall<'static> {
        shorten_member(keys, HOLDERS, token, keep_for)
    }

    fn renew_target(&self, keys: &LockKeys) -> RenewTarget {
        RenewTarget {
            key: keys.companion(HOLDERS),
            kind: HoldKind::Member,
        }
    }
}

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
/// holders above it finish.
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
            rules: Arc::new(SemaphoreRules { permits }),
            permits,
            _key: PhantomData,
        }
    }

    /// How many holders a key may have at once (through this family, see the type's docs).
    #[must_use]
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The lease duration of each permit.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.family.settings.lease
    }

    /// The namespace.
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
    /// `wait_timeout`), `TimedOut` (no permit within the wait), `LockLost` (the permit's lease
    /// was lost; the body was dropped), `Backend`.
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
