//! The lock primitives, each a small module stating its scripts and its rules on the shared
//! [lease engine](crate::engine).

/// The Lua functions of a waiter queue without hand-off (the semaphore's, the read-write lock's
/// writers' and readers'): a sorted set of waiting tokens scored by arrival (server µs, strictly increasing,
/// so arrivals never tie) and one scoring each by the end of its place (server ms). A script
/// that uses them starts with this text.
///
/// - `live_ahead(q, token, now, limit)`: walks the queue `KEYS[q]` (places in `KEYS[q + 1]`)
///   from its front, dropping waiters whose place has ended, until `limit` live waiters are
///   counted or `token` (or the end) is reached; answers the count and whether `token` was met.
/// - `first_live(q, now)`: the arrival score and the token of the first waiter in `KEYS[q]`
///   whose place has not ended (dropping those whose place has), or `nil` when there is none.
/// - `take_place(q, token, t, now, place)`: queues `token` at the back if it is not queued
///   (`t`: the script's `TIME` reply) and makes its place end `place` ms after `now`, keeping
///   both sets alive at least that long.
macro_rules! waiter_queue_lua {
    () => {
        r"
local function live_ahead(q, token, now, limit)
  local ahead = 0
  while ahead < limit do
    local waiter = redis.call('ZRANGE', KEYS[q], ahead, ahead)[1]
    if not waiter then
      return ahead, false
    end
    if waiter == token then
      return ahead, true
    end
    if tonumber(redis.call('ZSCORE', KEYS[q + 1], waiter) or '0') > now then
      ahead = ahead + 1
    else
      redis.call('ZREM', KEYS[q], waiter)
      redis.call('ZREM', KEYS[q + 1], waiter)
    end
  end
  return ahead, false
end
local function first_live(q, now)
  while true do
    local first = redis.call('ZRANGE', KEYS[q], 0, 0, 'WITHSCORES')
    if not first[1] then
      return nil
    end
    if tonumber(redis.call('ZSCORE', KEYS[q + 1], first[1]) or '0') > now then
      return tonumber(first[2]), first[1]
    end
    redis.call('ZREM', KEYS[q], first[1])
    redis.call('ZREM', KEYS[q + 1], first[1])
  end
end
local function take_place(q, token, t, now, place)
  if not redis.call('ZSCORE', KEYS[q], token) then
    local arrival = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local last = redis.call('ZRANGE', KEYS[q], -1, -1, 'WITHSCORES')[2]
    if last then
      arrival = math.max(arrival, tonumber(last) + 1)
    end
    redis.call('ZADD', KEYS[q], arrival, token)
  end
  redis.call('ZADD', KEYS[q + 1], now + place, token)
  for i = q, q + 1 do
    if redis.call('PTTL', KEYS[i]) < place then
      redis.call('PEXPIRE', KEYS[i], place)
    end
  end
end
"
    };
}

mod family;
mod multi;
pub(crate) mod mutex;
pub(crate) mod operator;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
