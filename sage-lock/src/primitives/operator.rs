//! Operator tools on a mutex family: who holds a lock, for how long, forced release, and a scan
//! of the held locks of a namespace (`SCAN` on every primary, never `KEYS`). They see mutex
//! locks only, not a read-write lock's or a semaphore's holds (the README says where those are).
//!
//! Each server call is retried ([`retrying()`]), as the lock calls are: a read after any transient
//! failure, the forced release when the server refused it unrun. A slot being migrated (`ASK`,
//! `TRYAGAIN`) makes an operator call wait for the migration's end, within the command timeout,
//! rather than fail.

mod layout;
mod retrying;
mod scan;

use std::borrow::Borrow;
use std::sync::LazyLock;
use std::time::Duration;

use fred::bytes::Bytes;
use fred::error::{Error, ErrorKind};
use fred::interfaces::KeysInterface as _;
use fred::types::{Key, Value};
use tokio::time::Instant;

use super::mutex::{Locks, MUTEX, SINCE_HORIZON_MS};
use crate::connection::OpError;
use crate::error::LockError;
use crate::key::{KeyCodec, LockKeys};
use crate::scripts::{Script, parse_release};
use retrying::{bounded, refused, retrying, transient};

/// Inspect (read-only). KEYS: lock, fence, since; ARGV: the since marker's horizon
/// ([`SINCE_HORIZON_MS`]). Replies `{0}` when the lock key does not
/// exist, `{-1, type}` when it is not a mutex's (a string), else
/// `{1, pttl, fence, since_ms or -1, now_ms}`.
const INSPECT: &str = r"
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return {0} end
if kind ~= 'string' then return {-1, kind} end
local pttl = redis.call('PTTL', KEYS[1])
local fence = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local since = -1
local marked = redis.call('PEXPIRETIME', KEYS[3])
if marked > 0 then
  since = marked - tonumber(ARGV[1])
else
  -- Written by sage-lock 0.1 before the marker: the grant's server ms as the value.
  since = tonumber(redis.call('GET', KEYS[3]) or '-1') or -1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {1, pttl, fence, since, now}
";

static INSPECT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT));

/// How often [`Locks::force_unlock`] tries again when the holder changes under it.
const FORCE_ATTEMPTS: usize = 3;

/// The `by` of a [`Locks::force_unlock`] log, which names nobody.
const UNNAMED: &str = "(not named: Locks::force_unlock_by names who asked)";

/// Who holds a lock, as the server sees it: from [`Locks::holder`] or [`Locks::scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The key's fencing counter: the current hold's fencing token, unless a read-write lock or
    /// semaphore of the same name and namespace (which share the counter) was granted since.
    pub fencing_token: u64,
    /// How long the lease has left on the server (`PTTL`); `None` when the key has no expiry
    /// (it was set by hand).
    pub remaining: Option<Duration>,
    /// How long ago the lock was acquired (server time); `None` when unknown.
    pub held_for: Option<Duration>,
}

/// One held lock found by [`Locks::scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLock {
    /// The key, printable (non-UTF-8 bytes escaped).
    pub key: String,
    /// The key's bytes as [`KeyCodec`] encoded them (for [`Locks::force_unlock`] on a
    /// `Locks<[u8]>`).
    pub key_bytes: Vec<u8>,
    /// Its holder.
    pub holder: HolderInfo,
}

/// What the inspect script found.
enum Inspected {
    Free,
    Held(HolderInfo),
    /// The key exists but is not a mutex's.
    Other(String),
}

fn protocol(what: &str) -> Error {
    Error::new(ErrorKind::Protocol, format!("unexpected reply to {what}"))
}

fn parse_inspect(reply: &Value) -> Result<Inspected, Error> {
    let Value::Array(items) = reply else {
        return Err(protocol("the inspect script"));
    };
    let number = |index: usize| items.get(index).and_then(Value::as_i64);
    match number(0) {
        Some(0) => Ok(Inspected::Free),
        Some(-1) => Ok(Inspected::Other(
            items.get(1).and_then(Value::as_string).unwrap_or_default(),
        )),
        Some(1) => {
            let (pttl, fence, since, now) = (number(1), number(2), number(3), number(4));
            let (Some(pttl), Some(fence), Some(since), Some(now)) = (pttl, fence, since, now)
            else {
                return Err(protocol("the inspect script"));
            };
            let millis = |ms: i64| u64::try_from(ms).ok().map(Duration::from_millis);
            Ok(Inspected::Held(HolderInfo {
                fencing_token: u64::try_from(fence).unwrap_or(0),
                remaining: millis(pttl),
                held_for: if since < 0 {
                    None
                } else {
                    millis(now.saturating_sub(since).max(0))
                },
            }))
        }
        _ => Err(protocol("the inspect script")),
    }
}

impl<K: ?Sized> Locks<K> {
    /// A `Backend` error for `error`, with the grant that fixes an ACL denial.
    fn backend(&self, context: String, error: Error) -> LockError {
        if let Some(hint) = crate::acl::denial_hint(&error, Some(&*self.settings.namespace)) {
            return LockError::backend(format!("{context} ({hint})"), error);
        }
        // Unanswered while the connection is down: its last error says why (refused
        // credentials, a server at its client limit), as a lock call's timeout does.
        let unanswered = matches!(
            error.kind(),
            ErrorKind::Timeout | ErrorKind::IO | ErrorKind::Canceled
        );
        match self.engine.conn.why_down() {
            Some(why) if unanswered && !error.details().contains(&why) => {
                LockError::backend(format!("{context} (the connection is down: {why})"), error)
            }
            _ => LockError::backend(context, error),
        }
    }

    fn failed(&self, context: String, error: OpError) -> LockError {
        match error {
            OpError::Failed(error) => self.backend(context, error),
            OpError::PoolExhausted => LockError::backend(
                context,
                Error::new(ErrorKind::Timeout, "dedicated pool exhausted"),
            ),
        }
    }

    fn deadline(&self) -> Instant {
        crate::retry::deadline_after(self.engine.conn.command_timeout)
    }

    async fn inspect(&self, keys: &LockKeys) -> Result<Inspected, LockError> {
        self.engine.refuse_wrong_node().await?;
        let call = INSPECT_SCRIPT.call(
            keys.slot,
            vec![keys.lock.clone(), keys.fence.clone(), keys.since.clone()],
            vec![Value::Integer(SINCE_HORIZON_MS)],
        );
        let context = || format!("could not inspect the lock on {}", keys.display());
        let deadline = self.deadline();
        let (conn, call) = (&self.engine.conn, &call);
        let reply = retrying(deadline, transient, move || conn.run_plain(call, deadline))
            .await
            .map_err(|error| self.failed(context(), error))?;
        parse_inspect(&reply).map_err(|error| self.backend(context(), error))
    }

    /// Whether some owner holds the lock on `key` now (the mutex's: a read-write lock or a
    /// semaphore on the same name is another lock, not seen here).
    ///
    /// ```no_run
    /// # async fn demo(locks: sage_lock::Locks<str>) -> Result<(), sage_lock::LockError> {
    /// if locks.is_locked("account:42").await? {
    ///     println!("busy");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`] (argument `key`): the lock's server key holds another
    ///   type (set by hand or by another program); found on the server.
    /// - [`LockError::InvalidArgument`] (argument `from_fred`): the node of a
    ///   [`from_fred`](crate::LockClient::from_fred) client cannot hold locks.
    /// - [`LockError::Backend`]: the server cannot answer in time, the connection is down, the
    ///   call is outside a Tokio runtime, or the client was closed by
    ///   [`LockClient::quit`](crate::LockClient::quit). Brief server errors (a slot being
    ///   migrated, `TRYAGAIN`) are retried within the command timeout; a failure that outlasts
    ///   it may be transient (kind `Timeout`), and a later call may succeed.
    pub async fn is_locked<Q>(&self, key: &Q) -> Result<bool, LockError>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
    {
        let keys = self.keys(key);
        match self.inspect(&keys).await? {
            Inspected::Free => Ok(false),
            Inspected::Held(_) => Ok(true),
            Inspected::Other(kind) => Err(not_a_mutex(&keys, &kind)),
        }
    }

    /// Who holds the lock on `key`: its fencing token, the lease left on the server and how
    /// long it has been held; `None` when it is free.
    ///
    /// ```no_run
    /// # async fn demo(locks: sage_lock::Locks<str>) -> Result<(), sage_lock::LockError> {
    /// if let Some(holder) = locks.holder("account:42").await? {
    ///     println!("token {} held for {:?}", holder.fencing_token, holder.held_for);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`] (argument `key`): the lock's server key holds another
    ///   type (set by hand or by another program); found on the server.
    /// - [`LockError::InvalidArgument`] (argument `from_fred`): the node of a
    ///   [`from_fred`](crate::LockClient::from_fred) client cannot hold locks.
    /// - [`LockError::Backend`]: the server cannot answer in time, the connection is down, the
    ///   call is outside a Tokio runtime, or the client was closed by
    ///   [`LockClient::quit`](crate::LockClient::quit). Brief server errors (a slot being
    ///   migrated, `TRYAGAIN`) are retried within the command timeout; a failure that outlasts
    ///   it may be transient (kind `Timeout`), and a later call may succeed.
    pub async fn holder<Q>(&self, key: &Q) -> Result<Option<HolderInfo>, LockError>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
    {
        let keys = self.keys(key);
        match self.inspect(&keys).await? {
            Inspected::Free => Ok(None),
            Inspected::Held(holder) => Ok(Some(holder)),
            Inspected::Other(kind) => Err(not_a_mutex(&keys, &kind)),
        }
    }

    /// Releases the lock on `key` whoever holds it, for an operator clearing a stuck lock;
    /// logged at warn. Returns whether a hold was removed. [`Locks::force_unlock_by`] does the
    /// same and also logs who asked and why.
    ///
    /// The holder is not told: its next renewal finds the lock gone and its body is cancelled
    /// with [`LockError::LockLost`] (reason `NotOwner`), but until then it may still be
    /// running. Prefer waiting for the lease to run out when the holder may be alive.
    ///
    /// ```no_run
    /// # async fn demo(locks: sage_lock::Locks<str>) -> Result<(), sage_lock::LockError> {
    /// let removed = locks.force_unlock("account:42").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`] (argument `key`): the lock's server key holds another
    ///   type (set by hand or by another program); found on the server.
    /// - [`LockError::InvalidArgument`] (argument `from_fred`): the node of a
    ///   [`from_fred`](crate::LockClient::from_fred) client cannot hold locks.
    /// - [`LockError::Backend`]: the server cannot answer in time, the connection is down, the
    ///   call is outside a Tokio runtime, or the client was closed by
    ///   [`LockClient::quit`](crate::LockClient::quit). Brief server errors (a slot being
    ///   migrated, `TRYAGAIN`) are retried within the command timeout; a failure that outlasts
    ///   it may be transient (kind `Timeout`), and a later call may succeed.
    pub async fn force_unlock<Q>(&self, key: &Q) -> Result<bool, LockError>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
    {
        self.force_unlock_logged(key, UNNAMED).await
    }

    /// [`Locks::force_unlock`], with `by` (who asked, and why) in its warn log.
    ///
    /// ```no_run
    /// # async fn demo(locks: sage_lock::Locks<str>) -> Result<(), sage_lock::LockError> {
    /// let removed = locks.force_unlock_by("account:42", "alice, incident 1234").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`]: `by` is empty or blank (argument `by`, nothing sent),
    ///   or the lock's server key holds another type (argument `key`).
    /// - [`LockError::InvalidArgument`] (argument `from_fred`): the node of a
    ///   [`from_fred`](crate::LockClient::from_fred) client cannot hold locks.
    /// - [`LockError::Backend`]: the server cannot answer in time, the connection is down, the
    ///   call is outside a Tokio runtime, or the client was closed by
    ///   [`LockClient::quit`](crate::LockClient::quit). Brief server errors (a slot being
    ///   migrated, `TRYAGAIN`) are retried within the command timeout; a failure that outlasts
    ///   it may be transient (kind `Timeout`), and a later call may succeed.
    pub async fn force_unlock_by<Q>(&self, key: &Q, by: &str) -> Result<bool, LockError>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
    {
        if by.trim().is_empty() {
            return Err(LockError::invalid(
                "by",
                "say who forces the unlock and why, e.g. \"alice, incident 1234\"; it is logged \
                 (or call force_unlock)",
            ));
        }
        self.force_unlock_logged(key, by).await
    }

    async fn force_unlock_logged<Q>(&self, key: &Q, by: &str) -> Result<bool, LockError>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
    {
        let keys = self.keys(key);
        let context = || format!("could not force-unlock {}", keys.display());
        for _ in 0..FORCE_ATTEMPTS {
            let fencing_token = match self.inspect(&keys).await? {
                Inspected::Free => return Ok(false),
                Inspected::Other(kind) => return Err(not_a_mutex(&keys, &kind)),
                Inspected::Held(holder) => holder.fencing_token,
            };
            let deadline = self.deadline();
            let (fred, lock) = (self.engine.conn.fred(), &keys.lock);
            let read = retrying(deadline, transient, move || {
                bounded(
                    deadline,
                    fred.get::<Option<Bytes>, _>(Key::from(lock.clone())),
                )
            })
            .await;
            let token = match read {
                Ok(Some(token)) => token,
                Ok(None) => return Ok(false),
                Err(error) => return Err(self.failed(context(), error)),
            };
            // The release script: compare-and-delete, then hand the lock to the next waiter.
            // Sent again only when refused unrun: a copy that ran unanswered would make the next
            // one find the lock gone, and report no hold removed.
            let call = MUTEX.release_call(&keys, &token, crate::engine::HANDOFF_LEASE);
            let deadline = self.deadline();
            let (conn, call) = (&self.engine.conn, &call);
            let reply = retrying(deadline, refused, move || conn.run_plain(call, deadline))
                .await
                .map_err(|error| self.failed(context(), error))?;
            let reply = parse_release(&reply).map_err(|error| self.backend(context(), error))?;
            if reply.released {
                match (&reply.head, reply.handed_off) {
                    (Some(head), Some(fence)) => self.engine.notifier.wake_local(
                        &keys.lock,
                        head,
                        Some(
                            crate::notify::Grant::new(fence, None)
                                .with_lease(crate::engine::HANDOFF_LEASE),
                        ),
                    ),
                    _ => self.engine.waiters.wake_one(&keys.lock),
                }
                tracing::warn!(
                    key = %keys.display(),
                    namespace = %self.settings.namespace,
                    by,
                    fencing_token,
                    "lock force-unlocked"
                );
                return Ok(true);
            }
            // Released or re-acquired between the two reads: look again.
        }
        Ok(false)
    }
}

fn not_a_mutex(keys: &LockKeys, kind: &str) -> LockError {
    LockError::invalid("key", not_a_mutex_text(keys, kind))
}

/// Why a lock's key of another type is no lock, and how to look at it.
fn not_a_mutex_text(keys: &LockKeys, kind: &str) -> String {
    format!(
        "{} holds a {kind}, not a lock: sage-lock writes only strings at a lock's key (its other \
         primitives use keys of their own), so it was set by hand or by another program; look \
         at it with redis-cli (TYPE {server_key}), and delete it there if it is stale",
        keys.display(),
        server_key = String::from_utf8_lossy(&keys.lock),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inspect_replies() {
        let held = Value::Array(vec![
            Value::Integer(1),
            Value::Integer(1500),
            Value::Integer(7),
            Value::Integer(1_000),
            Value::Integer(3_500),
        ]);
        let Ok(Inspected::Held(holder)) = parse_inspect(&held) else {
            panic!("held not parsed");
        };
        assert_eq!(holder.fencing_token, 7);
        assert_eq!(holder.remaining, Some(Duration::from_millis(1500)));
        assert_eq!(holder.held_for, Some(Duration::from_millis(2500)));
        let no_ttl = Value::Array(vec![
            Value::Integer(1),
            Value::Integer(-1),
            Value::Integer(0),
            Value::Integer(-1),
            Value::Integer(3_500),
        ]);
        let Ok(Inspected::Held(holder)) = parse_inspect(&no_ttl) else {
            panic!("held not parsed");
        };
        assert_eq!((holder.remaining, holder.held_for), (None, None));
        assert!(matches!(
            parse_inspect(&Value::Array(vec![Value::Integer(0)])),
            Ok(Inspected::Free)
        ));
        assert!(parse_inspect(&Value::Null).is_err());
    }
}
