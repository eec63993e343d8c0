//! The mutex's server side: its Lua scripts, the keys they touch, and [`MutexRules`], which
//! states them to the [lease engine](crate::engine).
//!
//! A lock on key `k` is the string key `{ns:k}` holding the owner's token, with the lease as its
//! TTL; its fencing counter is `{ns:k}:fence`. Waiters queue in arrival order on the server:
//! `{ns:k}:queue` (their tokens, oldest first) and `{ns:k}:waiters` (each one's deadline, so a
//! dead waiter is skipped), and a release publishes the next waiter's token on
//! `{ns:k}:released` (see [`crate::notify`]). `{ns:k}:since` marks the last grant for
//! `Locks::holder`: its expiry is the grant's server time plus [`SINCE_HORIZON_MS`] (one
//! `SET PX` in the grant, no `TIME` call), and the next grant overwrites it; its value (`q` or
//! empty) says whether waiters may queue (see [`ACQUIRE`]).

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::Value;

use crate::engine::{self, Rules};
use crate::key::LockKeys;
use crate::renewal::{HoldKind, RenewTarget};
use crate::retry::{millis, millis_ceil};
use crate::scripts::{Script, ScriptCall};

/// Drops dead waiters (deadline passed, or none) from the head of the queue; leaves the live
/// head (or nil) in `head`. Needs `now` (server ms) set first.
macro_rules! prune_head {
    ($queue:literal, $deadlines:literal) => {
        concat!(
            "
while head do
  local due = tonumber(redis.call('ZSCORE', ",
            $deadlines,
            ", head))
  if due and due > now then break end
  redis.call('LPOP', ",
            $queue,
            ")
  redis.call('ZREM', ",
            $deadlines,
            ", head)
  head = redis.call('LINDEX', ",
            $queue,
            ", 0)
end
"
        )
    };
}

pub(in crate::primitives) use prune_head;

/// How long after a grant its `:since` marker expires (10 years): the grant's server time is
/// the marker's `PEXPIRETIME` minus this.
pub(in crate::primitives) const SINCE_HORIZON_MS: i64 = 315_360_000_000;

/// Acquire. KEYS: lock, fence, queue (list of waiting tokens, oldest first), deadlines (sorted
/// set: token -> server ms after which the waiter counts as dead), since (grant marker, expiring
/// [`SINCE_HORIZON_MS`] after the grant). ARGV: token, lease ms, waiter
/// TTL ms (how long this waiter's place lasts without another attempt; 0: a try, which never
/// queues), queue TTL ms (how long the queue's keys last without an attempt: at least any
/// waiter's TTL, so a waiter with a short TTL never cuts another's place short).
///
/// Grants (`SET NX PX` + `INCR` fence) only when the lock is free and the queue's live head is
/// this token or nobody; a busy waiting caller joins the queue's tail (or refreshes its place).
/// The attempt comes first, as `SET NX PX GET` (Redis 7.0+, Valkey): one call tells a free key
/// (now set) from a held one (and its holder), so a queueing attempt on a held lock never reads
/// the queue's head; a free key whose queue has another live head is given back (`DEL`) in the
/// same script, so nobody sees it.
/// The grant marker's value is `q` whenever the queue may hold a waiter (a waiter that joins
/// writes it, a grant or hand-off that leaves waiters queued keeps it) and empty otherwise: the
/// grant sets it with `SET ... GET`, so an uncontended grant learns that nobody queues without
/// reading the queue (3 calls: the attempt, the marker, the fence). A stale `q` only costs a read.
/// The lock's value is the holder's token, with the queued mark `+` appended once anybody
/// queued behind it (at the grant, or since): a holder whose value is unmarked has nobody to
/// notify, so its release may be a plain `DELIFEQ key token` (which then finds no match once
/// marked). Every script that checks the holder (release, shorten, renewal, the multi-key
/// scripts) accepts the token with or without the mark.
/// Replies `{1, fence}` when granted (also when the key already holds this token, so a retry
/// after an unknown outcome is safe; such a repeated grant takes a new fencing token, since the
/// writer and the semaphore of the same name may have taken the counter since), or `{0, ms, fence}`: the holder's PTTL, or when free, how
/// long the live head's place lasts, and the fencing counter (a hand-off to this waiter that
/// the caller learns of later is genuine only if its fence is higher).
const ACQUIRE: &str = concat!(
    r"
local now
local head
local holder = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if not holder then
  -- The grant marker, written here, says whether anybody may queue: only then is the queue read.
  if redis.call('SET', KEYS[5], '', 'PX', '315360000000', 'GET') == 'q' then
    head = redis.call('LINDEX', KEYS[3], 0)
  end
  if head then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
",
    prune_head!("KEYS[3]", "KEYS[4]"),
    r"
  end
  if (not head) or head == ARGV[1] then
    if head then
      redis.call('LPOP', KEYS[3])
      redis.call('ZREM', KEYS[4], head)
      if redis.call('EXISTS', KEYS[3]) == 1 then
        redis.call('SET', KEYS[1], ARGV[1] .. '+', 'KEEPTTL')
        redis.call('SET', KEYS[5], 'q', 'KEEPTTL')
      end
    end
    return {1, redis.call('INCR', KEYS[2])}
  end
  -- Another live waiter is next: the key stays free for it (and the queue marked).
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[5], 'q', 'KEEPTTL')
elseif holder == ARGV[1] or holder == ARGV[1] .. '+' then
  -- Granted again: a token of its own, as the counter may have been taken since (the writer
  -- and the semaphore of this name share it).
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, redis.call('INCR', KEYS[2])}
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  if holder and string.sub(holder, -1) ~= '+' then
    redis.call('SET', KEYS[1], holder .. '+', 'KEEPTTL')
  end
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  -- ZADD counts only members it added: a new waiter joins the queue's tail, and marks it.
  if redis.call('ZADD', KEYS[4], now + ttl, ARGV[1]) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[1])
    redis.call('SET', KEYS[5], 'q', 'KEEPTTL')
  end
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 and head then
  pttl = math.max(0, tonumber(redis.call('ZSCORE', KEYS[4], head) or now) - now)
end
return {0, pttl, tonumber(redis.call('GET', KEYS[2]) or '0')}
"
);

/// Release. KEYS: lock, queue, deadlines, fence, since (see [`release_keys`]); ARGV: token,
/// release channel, hand-off lease ms, queue TTL ms.
///
/// Removes this token's hold (or, for a waiter that gives up, its place in the queue). If that
/// left the lock free and a live waiter heads the queue, the lock passes to it on the server: its
/// token becomes the value (marked `+` if others still queue) with the hand-off lease as TTL, the
/// fencing counter is incremented, and `token:fence:ms` (ms: the hand-off lease) is published on
/// the channel (`SPUBLISH`,
/// under `pcall` so a server or ACL without sharded pub/sub only costs the new owner a poll,
/// which finds its own token and confirms the grant). Waiters are popped off the queue's head
/// (`LPOP`) until a live one comes: dead ones are dropped, the live one is the next owner.
/// A live head that waits for several keys (its token starts with `m`, see
/// `Locks::with_locks`) is never handed this key alone: it keeps its place (the queue's keys
/// last the queue TTL again), the key stays free for it, and its bare token is published so
/// that it tries at once.
/// Replies 1 when it removed the hold, else 0; `{1 | 0, head, fence}` when it handed the lock
/// on, so this process can wake its own waiter at once (`{1 | 0, head}` when it only named it).
const RELEASE: &str = r"
local released = 0
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] or holder == ARGV[1] .. '+' then
  -- A holder is never queued (a grant takes it out of the queue). Its key is deleted below,
  -- unless a hand-off overwrites it.
  released = 1
elseif redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then
  redis.call('LREM', KEYS[2], 1, ARGV[1])
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return 0
  end
else
  return 0
end
local head = redis.call('LPOP', KEYS[2])
if head then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local due
  while head do
    due = tonumber(redis.call('ZSCORE', KEYS[3], head))
    redis.call('ZREM', KEYS[3], head)
    if due and due > now then break end
    head = redis.call('LPOP', KEYS[2])
  end
  if head and string.sub(head, 1, 1) == 'm' then
    redis.call('LPUSH', KEYS[2], head)
    redis.call('ZADD', KEYS[3], due, head)
    redis.call('PEXPIRE', KEYS[2], ARGV[4])
    redis.call('PEXPIRE', KEYS[3], ARGV[4])
    if released == 1 then
      redis.call('DEL', KEYS[1])
    end
    redis.pcall('SPUBLISH', ARGV[2], head)
    return {released, head}
  end
  if head then
    local value, queued = head, ''
    if redis.call('EXISTS', KEYS[2]) == 1 then
      value, queued = head .. '+', 'q'
    end
    redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
    redis.call('SET', KEYS[5], queued, 'PX', '315360000000')
    local fence = redis.call('INCR', KEYS[4])
    redis.pcall('SPUBLISH', ARGV[2], head .. ':' .. fence .. ':' .. ARGV[3])
    return {released, head, fence}
  end
end
if released == 1 then
  redis.call('DEL', KEYS[1])
end
return released
";

/// Shorten (the minimum hold): `PEXPIRE` to the remainder only while the key still holds this
/// token. Replies 1 or 0.
const SHORTEN: &str = r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] or holder == ARGV[1] .. '+' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE));
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));
static SHORTEN_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SHORTEN));

/// The keys of one mutex's scripts: lock, fence, waiter queue, waiter deadlines, grant time.
pub(in crate::primitives) fn script_keys(keys: &LockKeys) -> Vec<Bytes> {
    vec![
        keys.lock.clone(),
        keys.fence.clone(),
        keys.queue.clone(),
        keys.waiters.clone(),
        keys.since.clone(),
    ]
}

/// The keys of the release script: lock, waiter queue, waiter deadlines, fence, grant time.
fn release_keys(keys: &LockKeys) -> Vec<Bytes> {
    vec![
        keys.lock.clone(),
        keys.queue.clone(),
        keys.waiters.clone(),
        keys.fence.clone(),
        keys.since.clone(),
    ]
}

/// The mutex's rules: one owner at a time.
#[derive(Debug)]
pub(crate) struct MutexRules;

impl Rules for MutexRules {
    fn blocked_by(&self, kind: &str) -> bool {
        kind == self.kind()
    }

    fn local_line(&self) -> bool {
        true
    }

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
            Value::Integer(if waiter_ttl.is_zero() {
                0
            } else {
                millis(waiter_ttl).max(1)
            }),
            Value::Integer(millis(engine::QUEUE_TTL)),
        ];
        ACQUIRE_SCRIPT.call(keys.slot, script_keys(keys), args)
    }

    fn release_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        handoff_lease: Duration,
    ) -> ScriptCall<'static> {
        let args = vec![
            Value::Bytes(token.clone()),
            Value::Bytes(crate::notify::channel(&keys.lock)),
            Value::Integer(millis(handoff_lease).max(1)),
            Value::Integer(millis(engine::QUEUE_TTL)),
        ];
        RELEASE_SCRIPT.call(keys.slot, release_keys(keys), args)
    }

    fn shorten_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        keep_for: Duration,
    ) -> ScriptCall<'static> {
        let args = vec![
            Value::Bytes(token.clone()),
            Value::Integer(millis_ceil(keep_for)),
        ];
        SHORTEN_SCRIPT.on_lock(keys, args)
    }

    fn renew_target(&self, keys: &LockKeys) -> RenewTarget {
        RenewTarget {
            key: keys.lock.clone(),
            kind: HoldKind::Owner,
        }
    }

    fn notifies(&self) -> bool {
        true
    }

    fn plain_release_key(&self, keys: &LockKeys) -> Option<Bytes> {
        Some(keys.lock.clone())
    }
}

/// The shared rules value (no state).
pub(in crate::primitives) static MUTEX: LazyLock<Arc<dyn Rules>> =
    LazyLock::new(|| Arc::new(MutexRules));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_checks_accept_the_queued_mark() {
        let marked = "holder == ARGV[1] or holder == ARGV[1] .. '+'";
        for script in [
            RELEASE,
            SHORTEN,
            crate::primitives::multi::rules::RELEASE_ALL,
        ] {
            assert!(script.contains(marked), "{script}");
        }
        assert!(ACQUIRE.contains(marked) && ACQUIRE.contains("holder .. '+', 'KEEPTTL'"));
        assert!(crate::primitives::multi::rules::ACQUIRE_ALL.contains("holder == ARGV[1] .. '+'"));
    }

    #[test]
    fn grant_scripts_use_the_since_horizon() {
        let horizon = format!("'{SINCE_HORIZON_MS}'");
        assert!(ACQUIRE.contains(&horizon) && RELEASE.contains(&horizon));
        assert!(crate::primitives::multi::rules::ACQUIRE_ALL.contains(&horizon));
    }
}
