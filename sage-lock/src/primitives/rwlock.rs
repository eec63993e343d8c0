//! The read-write lock: [`RwLocks`], many readers or one writer per key, and its scripts.
//!
//! Key `k`'s readers are the members of the sorted set `{ns:k}:r`, each a reader's token scored
//! by its expiry in server milliseconds (`TIME`), so every reader has a lease of its own and a
//! crashed reader's share expires on its own. The writer is the string key `{ns:k}:w` holding
//! its token, with the lease as its TTL. A writer that finds readers (or another writer) leaves
//! its intent in `{ns:k}:wi` for [`WRITER_INTENT`], refreshed by each of its attempts: new
//! readers wait while it is there, so a stream of readers cannot starve a waiting writer, and a
//! writer that dies while waiting blocks readers for at most that long. Every grant (readers and
//! writers) increments the fencing counter `{ns:k}:fence`. Every release is announced on
//! `{ns:k}:w}:released` (an empty message), so waiters in any process try again at once.

use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::Value;

use super::family::Family;
use super::semaphore::shorten_member;
use crate::engine::{self, Engine, Mode, Rules};
use crate::error::LockError;
use crate::key::{KeyCodec, LockKeys};
use crate::options::LockSettings;
use crate::renewal::{HoldKind, RenewTarget};
use crate::retry::millis;
use crate::scripts::{Script, ScriptCall};

/// The suffix of the reader set.
pub(crate) const READERS: &str = ":r";
/// The suffix of the writer key.
pub(crate) const WRITER: &str = ":w";
/// The suffix of the waiting writer's intent.
pub(crate) const INTENT: &str = ":wi";
/// The suffix of the waiting mark: set by every refused attempt of a waiting caller, for what
/// is left of its wait (at most 2 s), so that releases announce themselves only while somebody
/// waits.
pub(crate) const WAITING: &str = ":rw-waiting";

/// How long a waiting writer's intent blocks new readers after its latest attempt. Its attempts
/// come at most 200 ms apart, so a live waiting writer keeps it; a dead one frees the readers
/// this long after its last attempt.
pub const WRITER_INTENT: Duration = Duration::from_secs(1);

/// Read acquire. `KEYS`: readers, fence, writer, intent, waiting mark; `ARGV`: token, lease ms,
/// mark ms (0 for a try). Granted unless a writer holds the lock or waits for it (a waiting
/// caller that is refused sets the waiting mark for mark ms, so releases announce themselves); a token that already reads (a retry after an
/// unknown or unacknowledged outcome) is granted again. Every grant, a repeated one too, takes
/// a new fencing token: other readers' grants may have moved the counter on since this token's
/// first one, so the counter is nobody's token but the latest grant's.
const READ_ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  local wait = redis.call('PTTL', KEYS[3])
  if wait == -2 then
    wait = redis.call('PTTL', KEYS[4])
  end
  if wait ~= -2 then
    if tonumber(ARGV[3]) > 0 then
      redis.call('SET', KEYS[5], '', 'PX', ARGV[3])
    end
    return {0, math.max(wait, 1)}
  end
end
local fence = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
if redis.call('PTTL', KEYS[1]) < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
return {1, fence}
";

/// Write acquire. `KEYS`: readers, fence, writer, intent, waiting mark; `ARGV`: token, lease
/// ms, intent ms (0: leave no intent, for `try_write`), mark ms (0 for a try). Granted when there
/// is no writer, no unexpired reader and no other writer's intent; otherwise (intent ms > 0, no
/// other intent) claims or refreshes the intent, and a waiting caller sets the waiting mark.
const WRITE_ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local intent_ms = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local holder = redis.call('GET', KEYS[3])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
local function refused(ms)
  if tonumber(ARGV[4]) > 0 then
    redis.call('SET', KEYS[5], '', 'PX', ARGV[4])
  end
  return {0, math.max(ms, 1)}
end
local intent = redis.call('GET', KEYS[4])
if intent and intent ~= ARGV[1] then
  return refused(redis.call('PTTL', KEYS[4]))
end
local hint
if holder then
  hint = redis.call('PTTL', KEYS[3])
else
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[2] then
    hint = tonumber(first[2]) - now
  end
end
if hint then
  if intent_ms > 0 then
    redis.call('SET', KEYS[4], ARGV[1], 'PX', intent_ms)
    hint = math.min(hint, math.floor(intent_ms / 4))
  end
  return refused(hint)
end
if intent then
  redis.call('DEL', KEYS[4])
end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
return {1, redis.call('INCR', KEYS[2])}
";

/// Read release. `KEYS`: readers, waiting mark; `ARGV`: token, release channel. Removes the
/// token from the reader set and, if it was there while a caller waits (the mark), announces
/// the release (an empty message). Replies 1 or 0.
const READ_RELEASE: &str = r"
local released = redis.call('ZREM', KEYS[1], ARGV[1])
if released == 1 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.pcall('SPUBLISH', ARGV[2], '')
end
return released
";

/// Write release. `KEYS`: writer, intent, waiting mark; `ARGV`: token, release channel. Deletes
/// the writer key and the intent where they hold this token and, if either did while a caller
/// waits (the mark), announces the release (an empty message); replies 1 when the writer key
/// was ours.
const WRITE_RELEASE: &str = r"
local released = 0
local freed = false
if redis.call('GET', KEYS[1]) == ARGV[1] then
  released = redis.call('DEL', KEYS[1])
  freed = true
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  freed = true
end
if freed and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.pcall('SPUBLISH', ARGV[2], '')
end
return released
";

/// Write shorten (minimum hold). `KEYS`: writer, intent; `ARGV`: token, ms. Lets the writer key
/// expire in `ms` if it still holds this token, and drops this token's intent. Replies 1 or 0.
const WRITE_SHORTEN: &str = r"
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

static WRITE_SHORTEN_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(WRITE_SHORTEN));
static READ_ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(READ_ACQUIRE));
static WRITE_ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(WRITE_ACQUIRE));
static READ_RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(READ_RELEASE));
static WRITE_RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(WRITE_RELEASE));

/// What the release channel is named after: `{ns:k}:w}`, so the channel, `{ns:k}:w}:released`,
/// differs from a mutex's on the same key yet ends in `}:released` like it (the README's ACL
/// channel pattern `&{ns:*}:released` covers both); the hash tag is still `ns:k`.
const ANNOUNCED: &str = ":w}";

/// The channel both readers' and writers' releases are announced on.
fn announcement(keys: &LockKeys) -> Bytes {
    crate::notify::channel(&keys.companion(ANNOUNCED))
}

fn acquire_keys(keys: &LockKeys) -> Vec<Bytes> {
    vec![
        keys.companion(READERS),
        keys.fence.clone(),
        keys.companion(WRITER),
        keys.companion(INTENT),
        keys.companion(WAITING),
    ]
}

/// A reader's rules: shares with readers, waits for writers.
#[derive(Debug)]
struct ReadRules;

impl Rules for ReadRules {
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
            Value::Integer(millis(waiter_ttl)),
        ];
        READ_ACQUIRE_SCRIPT.call(keys.slot, acquire_keys(keys), args)
    }

    fn release_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        _handoff_lease: Duration,
    ) -> ScriptCall<'static> {
        let call_keys = vec![keys.companion(READERS), keys.companion(WAITING)];
        let args = vec![
            Value::Bytes(token.clone()),
            Value::Bytes(announcement(keys)),
        ];
        READ_RELEASE_SCRIPT.call(keys.slot, call_keys, args)
    }

    fn release_announcement(&self, keys: &LockKeys) -> Option<Bytes> {
        Some(keys.companion(ANNOUNCED))
    }

    fn shorten_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        keep_for: Duration,
    ) -> ScriptCall<'static> {
        shorten_member(keys, READERS, token, keep_for)
    }

    fn renew_target(&self, keys: &LockKeys) -> RenewTarget {
        RenewTarget {
            key: keys.companion(READERS),
            kind: HoldKind::Member,
        }
    }
}

/// A writer's rules: alone; when waiting, blocks new readers through its intent.
#[derive(Debug)]
struct WriteRules {
    /// Whether a busy attempt leaves the writer's intent (waiting calls only).
    claim_intent: bool,
}

impl Rules for WriteRules {
    fn wait_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        lease: Duration,
        waiter_ttl: Duration,
    ) -> ScriptCall<'static> {
        let intent = if self.claim_intent {
            millis(WRITER_INTENT)
        } else {
            0
        };
        let args = vec![
            Value::Bytes(token.clone()),
            Value::Integer(millis(lease)),
            Value::Integer(intent),
            Value::Integer(millis(waiter_ttl)),
        ];
        WRITE_ACQUIRE_SCRIPT.call(keys.slot, acquire_keys(keys), args)
    }

    fn release_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        _handoff_lease: Duration,
    ) -> ScriptCall<'static> {
        let call_keys = vec![
            keys.companion(WRITER),
            keys.companion(INTENT),
            keys.companion(WAITING),
        ];
        let args = vec![
            Value::Bytes(token.clone()),
            Value::Bytes(announcement(keys)),
        ];
        WRITE_RELEASE_SCRIPT.call(keys.slot, call_keys, args)
    }

    fn release_announcement(&self, keys: &LockKeys) -> Option<Bytes> {
        Some(keys.companion(ANNOUNCED))
    }

    fn shorten_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        keep_for: Duration,
    ) -> ScriptCall<'static> {
        // Rounded up: never shorter than asked.
        let millis = i64::try_from(keep_for.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX);
        let args = vec![Value::Bytes(token.clone()), Value::Integer(millis)];
        let call_keys = vec![keys.companion(WRITER), keys.companion(INTENT)];
        WRITE_SHORTEN_SCRIPT.call(keys.slot, call_keys, args)
    }

    fn renew_target(&self, keys: &LockKeys) -> RenewTarget {
        RenewTarget {
            key: keys.companion(WRITER),
            kind: HoldKind::Owner,
        }
    }
}

static READ: LazyLock<Arc<dyn Rules>> = LazyLock::new(|| Arc::new(ReadRules));
static WRITE: LazyLock<Arc<dyn Rules>> =
    LazyLock::new(|| Arc::new(WriteRules { claim_intent: true }));
static TRY_WRITE: LazyLock<Arc<dyn Rules>> = LazyLock::new(|| {
    Arc::new(WriteRules {
        claim_intent: false,
    })
});

/// A family of read-write locks over keys of type `K`: per key, many readers or one writer.
///
/// Each reader holds a lease of its own (renewed while its body runs; renewing one reader never
/// extends another's), so a crashed reader's share expires on its own. A waiting writer is not
/// starved by a stream of readers: while it waits, new readers wait behind it (see
/// [`WRITER_INTENT`]). Readers and writers both get fencing tokens from the key's counter, so a
/// writer's token is above every earlier grant's. A read-write lock on key `k` is a different
/// lock from the mutex ([`Locks`](crate::Locks)) on `k`.
///
/// Made by [`LockClient::rw_lock`](crate::LockClient::rw_lock) or
/// [`LockClient::rw_lock_with`](crate::LockClient::rw_lock_with); cheap to clone. Options,
/// errors and guarantees are the mutex's, see [`Locks::with_lock`](crate::Locks::with_lock).
///
/// ```no_run
/// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
/// use std::time::Duration;
///
/// let reports = client.rw_lock::<str>();
/// let wait = Duration::from_secs(2);
/// let total = reports.read("report:7", wait, async { 42 }).await?; // shared with other readers
/// reports.write("report:7", wait, async { /* alone */ }).await?;
/// # Ok(()) }
/// ```
pub struct RwLocks<K: ?Sized> {
    family: Family,
    _key: PhantomData<fn(&K)>,
}

impl<K: ?Sized> Clone for RwLocks<K> {
    fn clone(&self) -> Self {
        RwLocks {
            family: self.family.clone(),
            _key: PhantomData,
        }
    }
}

impl<K: ?Sized> fmt::Debug for RwLocks<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.family.debug(f, "RwLocks").finish_non_exhaustive()
    }
}

impl<K: ?Sized> RwLocks<K> {
    pub(crate) fn new(engine: Arc<Engine>, settings: LockSettings) -> Self {
        RwLocks {
            family: Family::new(engine, settings),
            _key: PhantomData,
        }
    }

    /// The lease duration of each reader and writer.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.family.settings.lease
    }

    /// The namespace.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.family.settings.namespace
    }

    /// Waits up to `wait_timeout` to read-lock `key` (shared with other readers, excluding
    /// writers), runs `body`, releases, and returns the body's output.
    ///
    /// # Errors
    /// As for [`Locks::with_lock`](crate::Locks::with_lock).
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// # use std::time::Duration;
    /// let rw = client.rw_lock::<u64>();
    /// rw.read(&7, Duration::from_secs(2), async { /* many readers at once */ }).await?;
    /// # Ok(()) }
    /// ```
    pub fn read<Q, F>(
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
        self.waiting(&READ, key, wait_timeout, "try_read", body)
    }

    /// Waits up to `wait_timeout` to write-lock `key` (alone: no reader, no other writer), runs
    /// `body`, releases, and returns the body's output. While it waits, new readers wait too.
    ///
    /// # Errors
    /// As for [`Locks::with_lock`](crate::Locks::with_lock).
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// # use std::time::Duration;
    /// let rw = client.rw_lock::<u64>();
    /// rw.write(&7, Duration::from_secs(2), async { /* alone */ }).await?;
    /// # Ok(()) }
    /// ```
    pub fn write<Q, F>(
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
        self.waiting(&WRITE, key, wait_timeout, "try_write", body)
    }

    /// Read-locks `key` if no writer holds or waits for it now: `Ok(None)` otherwise (the body
    /// is not run), `Ok(Some(output))` after running the body and releasing.
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// let rw = client.rw_lock::<str>();
    /// let cached = rw.try_read("cache", async { 1 }).await?; // None while a writer is at it
    /// # Ok(()) }
    /// ```
    pub fn try_read<Q, F>(
        &self,
        key: &Q,
        body: F,
    ) -> impl Future<Output = Result<Option<F::Output>, LockError>> + use<K, Q, F>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        self.trying(&READ, key, body)
    }

    /// Write-locks `key` if it is free now (no reader, no writer, no waiting writer):
    /// `Ok(None)` otherwise (the body is not run, and no intent is left behind),
    /// `Ok(Some(output))` after running the body and releasing.
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// let rw = client.rw_lock::<str>();
    /// if rw.try_write("cache", async { /* rebuild */ }).await?.is_none() {
    ///     println!("in use; rebuild later");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_write<Q, F>(
        &self,
        key: &Q,
        body: F,
    ) -> impl Future<Output = Result<Option<F::Output>, LockError>> + use<K, Q, F>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        self.trying(&TRY_WRITE, key, body)
    }

    fn waiting<Q, F>(
        &self,
        rules: &Arc<dyn Rules>,
        key: &Q,
        wait_timeout: Duration,
        try_fn: &'static str,
        body: F,
    ) -> impl Future<Output = Result<F::Output, LockError>> + use<K, Q, F>
    where
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        let keys = self.family.keys(key);
        let body = Box::pin(body);
        let Family { engine, settings } = self.family.clone();
        engine::run_waiting(
            engine,
            Arc::clone(rules),
            settings,
            keys,
            wait_timeout,
            try_fn,
            body,
        )
    }

    fn trying<Q, F>(
        &self,
        rules: &Arc<dyn Rules>,
        key: &Q,
        body: F,
    ) -> impl Future<Output = Result<Option<F::Output>, LockError>> + use<K, Q, F>
    where
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        let keys = self.family.keys(key);
        let body = Box::pin(body);
        let Family { engine, settings } = self.family.clone();
        engine::run(engine, Arc::clone(rules), settings, keys, Mode::Try, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockClient;

    #[test]
    fn rw_futures_stay_small_whatever_the_body() {
        let client = LockClient::from_fred(fred::clients::Client::default());
        let rw = client.rw_lock::<str>();
        let big = [7_u8; 4096];
        let read = rw.read("k", Duration::from_secs(1), async move { big.len() });
        assert!(std::mem::size_of_val(&read) < 1024);
        let write = rw.try_write("k", async move { big.len() });
        assert!(std::mem::size_of_val(&write) < 1024);
    }

    #[test]
    fn companion_keys_are_distinct() {
        let keys = LockKeys::new("ns", b"k");
        let all = acquire_keys(&keys);
        assert_eq!(&all[0][..], b"{ns:k}:r");
        assert_eq!(&all[2][..], b"{ns:k}:w");
        assert_eq!(&all[3][..], b"{ns:k}:wi");
        assert!(all.iter().all(|k| *k != keys.lock));
    }
}
