//! The semaphore's server side: its Lua scripts, the keys they touch, and [`SemaphoreRules`],
//! which states them to the [lease engine](crate::engine).

use std::sync::LazyLock;
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::Value;

use crate::engine::Rules;
use crate::key::LockKeys;
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
/// for the caller after the live waiters queued ahead of it (all of them, for a caller not
/// queued) each take one, in queue order and within their own limit (the `<permits>` of a
/// token's `s<permits>-` prefix; the caller's for a token without one), a waiter whose limit is
/// reached keeping everyone behind it out (so families of different limits keep the arrival
/// order), dead waiters met on the way being dropped (holders whose expiry has passed do not
/// count); or when the token already holds a permit (a retry is safe). A grant takes a
/// new fencing token, a repeated one too (other holders' grants may have moved the counter on
/// since this token's first one), and takes the caller out of the queue: `{1, fence}`. Else
/// `{0, ms until the first permit expires, fencing counter}` (`-1` for the ms when the free
/// permits are the waiters'), and a waiting caller keeps (or takes) its place, ending place ms
/// from now. Expired holders are dropped when a caller is refused, and at every 16th grant (by
/// fencing token).
const ACQUIRE: &str = concat!(
    waiter_queue_lua!(),
    r"
local function fits(token, now, holders, mine)
  local at = 0
  while holders < mine do
    local waiter = redis.call('ZRANGE', KEYS[3], at, at)[1]
    if not waiter or waiter == token then
      return true, waiter == token
    end
    if tonumber(redis.call('ZSCORE', KEYS[4], waiter) or '0') > now then
      if holders >= tonumber(string.match(waiter, '^s(%d+)-') or mine) then
        return false, false
      end
      holders = holders + 1
      at = at + 1
    else
      redis.call('ZREM', KEYS[3], waiter)
      redis.call('ZREM', KEYS[4], waiter)
    end
  end
  return false, false
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local place = tonumber(ARGV[4])
local granted, queued = fits(ARGV[1], now,
  redis.call('ZCOUNT', KEYS[1], now + 1, '+inf'), tonumber(ARGV[3]))
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
/// while others wait, it hands free permits to the first live waiters, in queue order, each
/// within its own limit (the `<permits>` of its token's `s<permits>-` prefix; this caller's
/// for a token without one), stopping at the first whose limit is reached: each becomes a
/// holder for the hand-off lease with a new fencing token, leaves the queue, and
/// `token:fence:ms` is published on the channel. The reply is `{released, token, fence}` when
/// one waiter was handed a permit (else `released`: 1 if the token held a permit, else 0).
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
  local holders = redis.call('ZCARD', KEYS[1])
  local handoff = tonumber(ARGV[4])
  local named, fence = {}, nil
  while true do
    local _, waiter = first_live(2, now)
    if not waiter then
      break
    end
    local limit = tonumber(string.match(waiter, '^s(%d+)-') or ARGV[3])
    if holders >= limit then
      break
    end
    fence = redis.call('INCR', KEYS[4])
    redis.call('ZADD', KEYS[1], now + handoff, waiter)
    redis.call('ZREM', KEYS[2], waiter)
    redis.call('ZREM', KEYS[3], waiter)
    redis.pcall('SPUBLISH', ARGV[2], waiter .. ':' .. fence .. ':' .. handoff)
    holders = holders + 1
    named[#named + 1] = waiter
  end
  if #named > 0 and redis.call('PTTL', KEYS[1]) < handoff then
    redis.call('PEXPIRE', KEYS[1], handoff)
  end
  if #named == 1 then
    return {released, named[1], fence}
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
pub(super) struct SemaphoreRules {
    pub(super) permits: u32,
    /// `s<permits>-`: what this family's tokens start with, so that a release by a family of
    /// another limit hands its waiters permits within their own.
    token_prefix: Box<[u8]>,
}

impl SemaphoreRules {
    pub(super) fn new(permits: u32) -> SemaphoreRules {
        SemaphoreRules {
            permits,
            token_prefix: format!("s{permits}-").into_bytes().into_boxed_slice(),
        }
    }
}

impl Rules for SemaphoreRules {
    /// A semaphore of one holder keeps its own holder out, as a mutex does.
    fn blocked_by(&self, kind: &str) -> bool {
        self.permits == 1 && kind == self.kind()
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

    fn token_prefix(&self) -> &[u8] {
        &self.token_prefix
    }
}
