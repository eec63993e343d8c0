//! The multi-key lock's server side: its Lua scripts over the mutex's keys, and [`UnitRules`],
//! which states them to the [lease engine](crate::engine) for one unit (the keys taken by one
//! script call).

use std::sync::Arc;
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::Value;

use crate::engine::{self, Rules};
use crate::key::LockKeys;
use crate::primitives::mutex::{MutexRules, script_keys};
use crate::renewal::{HoldKind, RenewTarget};
use crate::retry::{millis, millis_ceil};
use crate::scripts::{Script, ScriptCall};

/// Acquire all. `KEYS`: lock, fence, waiter queue, waiter deadlines and grant time of each key
/// (the mutex's layout), in fives; `ARGV`: token (for several keys it starts with `m`, so the
/// mutex's release never hands one of them to this caller alone), lease ms, which key's fencing
/// token to reply (1-based), waiter TTL ms (0: a try, which never queues), queue TTL ms.
///
/// Granted only when every key is free or this token's, and no free key's waiter queue has a
/// live head other than this token (dead heads are dropped): then every key is set (or, already
/// this token's, extended), this token leaves each queue it headed, each grant marker says
/// whether its queue still holds anybody (as the mutex's does), each counter is incremented,
/// and the reply is `{1, fence of that key, fence of each key...}` (a key this token already
/// held gets a new one too: the writer and the semaphore of its name may have taken the counter
/// since). Else nothing is granted and the reply is `{0, ms}`: the soonest
/// positive PTTL of a held key or remaining place of another head (for a single key
/// `{0, ms, fence counter}`, as the mutex's, so that a hand-off to this caller is told from a
/// grant made before it queued). A refused try changes nothing; a refused waiting caller holds a place in the queue of every key it does not hold,
/// refreshed together, so its places have one deadline and every queue it shares with another
/// such caller orders the two alike (a place of its that lapsed or is missing puts it at every
/// tail again): the oldest of them heads all its queues, so they never wait on each other in a
/// circle. It also marks each holder's value `+` (queued behind), as the mutex's attempt does.
pub(in crate::primitives) const ACQUIRE_ALL: &str = concat!(
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[4])
local holders = {}
local headed = {}
local wait
for i = 1, #KEYS, 5 do
  local holder = redis.call('GET', KEYS[i])
  local ms
  if holder == ARGV[1] or holder == ARGV[1] .. '+' then
    holder = ARGV[1]
  elseif holder then
    ms = redis.call('PTTL', KEYS[i])
  else
    local head = redis.call('LINDEX', KEYS[i + 2], 0)
",
    crate::primitives::mutex::prune_head!("KEYS[i + 2]", "KEYS[i + 3]"),
    r"
    if head == ARGV[1] then
      headed[i] = true
    elseif head then
      ms = tonumber(redis.call('ZSCORE', KEYS[i + 3], head)) - now
    end
  end
  if ms then
    if ttl == 0 then
      return {0, ms}
    end
    if (not wait) or (ms > 0 and (wait <= 0 or ms < wait)) then
      wait = ms
    end
  end
  holders[i] = holder
end
if not wait then
  local reply = {1, 0}
  for i = 1, #KEYS, 5 do
    local fence
    if headed[i] then
      redis.call('LPOP', KEYS[i + 2])
      redis.call('ZREM', KEYS[i + 3], ARGV[1])
    end
    if holders[i] then
      redis.call('PEXPIRE', KEYS[i], ARGV[2])
      -- Granted again: a token of its own (other primitives of this name share the counter).
      fence = redis.call('INCR', KEYS[i + 1])
    else
      -- Nobody queued unless this token headed the queue (others may be behind it).
      local queued = ''
      if headed[i] and redis.call('EXISTS', KEYS[i + 2]) == 1 then
        queued = 'q'
      end
      redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
      redis.call('SET', KEYS[i + 4], queued, 'PX', '315360000000')
      fence = redis.call('INCR', KEYS[i + 1])
    end
    reply[#reply + 1] = fence
    if (i + 4) / 5 == tonumber(ARGV[3]) then
      reply[2] = fence
    end
  end
  return reply
end
local placed = true
for i = 1, #KEYS, 5 do
  if holders[i] ~= ARGV[1]
    and tonumber(redis.call('ZSCORE', KEYS[i + 3], ARGV[1]) or '0') <= now then
    placed = false
  end
end
for i = 1, #KEYS, 5 do
  local holder = holders[i]
  if holder ~= ARGV[1] then
    if not placed then
      if redis.call('ZREM', KEYS[i + 3], ARGV[1]) == 1 then
        redis.call('LREM', KEYS[i + 2], 1, ARGV[1])
      end
      redis.call('RPUSH', KEYS[i + 2], ARGV[1])
      redis.call('SET', KEYS[i + 4], 'q', 'KEEPTTL')
    end
    redis.call('ZADD', KEYS[i + 3], now + ttl, ARGV[1])
    redis.call('PEXPIRE', KEYS[i + 2], ARGV[5])
    redis.call('PEXPIRE', KEYS[i + 3], ARGV[5])
    if holder and string.sub(holder, -1) ~= '+' then
      redis.call('SET', KEYS[i], holder .. '+', 'KEEPTTL')
    end
  end
end
if #KEYS == 5 then
  return {0, wait, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return {0, wait}
"
);

/// Release all. `KEYS` as for acquire; `ARGV`: token, hand-off lease ms, then each key's release
/// channel. `DEL`s each key that still holds this token, and takes this token out of each queue
/// it waits in. Where that left a key free, its queue's dead heads are dropped and the live
/// head, if any, is told on the key's channel (`SPUBLISH` under `pcall`, as the mutex's release
/// does): a single-key waiter is handed the key as the mutex's release hands it
/// (`token:fence:ms`), a caller of several keys (token `m…`) keeps its place and gets its bare
/// token, so it tries at once. Replies 1 if any key was released, else 0.
pub(in crate::primitives) const RELEASE_ALL: &str = concat!(
    r"
local released = 0
local now
for i = 1, #KEYS, 5 do
  local holder = redis.call('GET', KEYS[i])
  local freed = false
  if holder == ARGV[1] or holder == ARGV[1] .. '+' then
    released = released + redis.call('DEL', KEYS[i])
    freed = true
  elseif redis.call('ZREM', KEYS[i + 3], ARGV[1]) == 1 then
    redis.call('LREM', KEYS[i + 2], 1, ARGV[1])
    freed = not holder
  end
  local head = freed and redis.call('LINDEX', KEYS[i + 2], 0)
  if head then
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
",
    crate::primitives::mutex::prune_head!("KEYS[i + 2]", "KEYS[i + 3]"),
    r"
    local channel = ARGV[(i + 4) / 5 + 2]
    if head and string.sub(head, 1, 1) == 'm' then
      redis.pcall('SPUBLISH', channel, head)
    elseif head then
      redis.call('LPOP', KEYS[i + 2])
      redis.call('ZREM', KEYS[i + 3], head)
      local value, queued = head, ''
      if redis.call('EXISTS', KEYS[i + 2]) == 1 then
        value, queued = head .. '+', 'q'
      end
      redis.call('SET', KEYS[i], value, 'PX', ARGV[2])
      redis.call('SET', KEYS[i + 4], queued, 'PX', '315360000000')
      local fence = redis.call('INCR', KEYS[i + 1])
      redis.pcall('SPUBLISH', channel, head .. ':' .. fence .. ':' .. ARGV[2])
    end
  end
end
if released > 0 then
  return 1
end
return 0
"
);

/// Shorten all (minimum hold). `KEYS` as for acquire; `ARGV`: token, ms. Lets each key that still
/// holds this token expire in `ms`. Replies 1 if any did, else 0.
const SHORTEN_ALL: &str = r"
local kept = 0
for i = 1, #KEYS, 5 do
  local holder = redis.call('GET', KEYS[i])
  if holder == ARGV[1] or holder == ARGV[1] .. '+' then
    kept = kept + redis.call('PEXPIRE', KEYS[i], ARGV[2])
  end
end
if kept > 0 then
  return 1
end
return 0
";

static SHORTEN_ALL_SCRIPT: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(SHORTEN_ALL));
static ACQUIRE_ALL_SCRIPT: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(ACQUIRE_ALL));
static RELEASE_ALL_SCRIPT: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(RELEASE_ALL));

/// The rules of one unit: every key of `parts` owned by one token, taken and given back at once.
#[derive(Debug)]
pub(super) struct UnitRules {
    /// The mutex's script keys of each part, in fives.
    script_keys: Vec<Bytes>,
    /// The release channel of each part.
    channels: Vec<Value>,
    /// The lock key of each part.
    locks: Vec<Bytes>,
    /// Which part's fencing token the acquire script replies (1-based).
    report: i64,
}

impl UnitRules {
    /// The rules of `parts`, replying the fencing token of `parts[report]`.
    pub(super) fn new(parts: &[Arc<LockKeys>], report: usize) -> Self {
        UnitRules {
            script_keys: parts.iter().flat_map(|p| script_keys(p)).collect(),
            channels: parts
                .iter()
                .map(|p| Value::Bytes(crate::notify::channel(&p.lock)))
                .collect(),
            locks: parts.iter().map(|p| p.lock.clone()).collect(),
            report: i64::try_from(report + 1).unwrap_or(1),
        }
    }
}

impl Rules for UnitRules {
    /// The mutex's: a multi-key hold is a mutex hold of each of its keys, so a reentrant
    /// `with_lock` for one of them runs under it.
    fn kind(&self) -> &'static str {
        MutexRules.kind()
    }

    /// As the mutex: kept out by the task's own hold of any of its keys.
    fn blocked_by(&self, kind: &str) -> bool {
        MutexRules.blocked_by(kind)
    }

    /// As the mutex: in line with the process's other waiters of its naming key.
    fn local_line(&self) -> bool {
        true
    }

    /// All parts at once or none; a waiting caller queues on every part's waiter queue.
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
            Value::Integer(self.report),
            Value::Integer(if waiter_ttl.is_zero() {
                0
            } else {
                millis(waiter_ttl).max(1)
            }),
            Value::Integer(millis(engine::QUEUE_TTL)),
        ];
        ACQUIRE_ALL_SCRIPT.call(keys.slot, self.script_keys.clone(), args)
    }

    fn release_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        handoff_lease: Duration,
    ) -> ScriptCall<'static> {
        let mut args = Vec::with_capacity(2 + self.channels.len());
        args.push(Value::Bytes(token.clone()));
        args.push(Value::Integer(millis(handoff_lease).max(1)));
        args.extend(self.channels.iter().cloned());
        RELEASE_ALL_SCRIPT.call(keys.slot, self.script_keys.clone(), args)
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
        SHORTEN_ALL_SCRIPT.call(keys.slot, self.script_keys.clone(), args)
    }

    fn renew_target(&self, keys: &LockKeys) -> RenewTarget {
        RenewTarget {
            key: keys.lock.clone(),
            kind: HoldKind::Owner,
        }
    }

    fn queues(&self) -> bool {
        true
    }

    /// A release of any part may name this caller (its bare token: try now).
    fn watched_keys(&self, _keys: &LockKeys) -> Vec<Bytes> {
        self.locks.clone()
    }

    /// `m` for several keys, which no release hands one of alone; a unit of one key (a slot of
    /// its own in a cluster) is handed its key as a single-key waiter is (and, as one, confirms
    /// the hand-off with an attempt of its own where replicas must acknowledge).
    fn token_prefix(&self) -> &[u8] {
        if self.locks.len() > 1 { b"m" } else { b"" }
    }
}
