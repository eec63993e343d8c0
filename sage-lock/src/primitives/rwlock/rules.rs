//! The read-write lock's server side: its key layout, its scripts and its [`Rules`] for readers
//! and writers (the parent module describes the design).

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::Value;

use super::super::semaphore::shorten_member;
use crate::engine::Rules;
use crate::key::LockKeys;
use crate::renewal::{HoldKind, RenewTarget};
use crate::retry::{millis, millis_ceil};
use crate::scripts::{Script, ScriptCall};

/// The suffix of the reader set.
const READERS: &str = ":r";
/// The suffix of the writer key.
const WRITER: &str = ":w";
/// The suffix of the writer queue: each waiting writer's token, scored by the server time (µs)
/// of its first refusal, made strictly increasing so that arrivals never tie.
const QUEUE: &str = ":wq";
/// The suffix of the waiting writers' places: each token scored by the server time (ms) its
/// place ends.
const DUES: &str = ":wd";
/// The suffix of the reader queue: each waiting reader's token, scored as in the writer queue
/// (the two queues' scores compare: whoever queued first goes first).
const READER_QUEUE: &str = ":rq";
/// The suffix of the waiting readers' places, as [`DUES`] for writers.
const READER_DUES: &str = ":rd";

/// How long a waiting writer's (or reader's) place in its queue lasts after its latest attempt
/// (never past the end of its wait): while it lasts, later writers and later readers wait behind
/// a writer, and later writers behind a reader. Its attempts come at most 250 ms apart, so a
/// live waiter keeps its place; a dead one holds up those behind it this long after its last
/// attempt at most while queued (once a release has handed it the lock, until that hand-off
/// lease ends).
pub const WRITER_INTENT: Duration = Duration::from_secs(1);

/// Read acquire. `KEYS`: readers, fence, writer, writer queue, writer places, reader queue,
/// reader places; `ARGV`: token, lease ms, place ms (0 for a try, which never queues). Granted
/// unless a writer holds the lock or a live writer queued before this reader (for an unqueued
/// reader: any live queued writer); the grant takes the reader out of its queue. A refused
/// waiting reader keeps (or takes) its place in the reader queue, ending place ms from now, and
/// the reply is `{0, ms to wait at most, fencing counter}`. A token that already reads (a retry
/// after an unknown or unacknowledged outcome, or a reader a release handed the lock to) is
/// granted again. Every grant, a repeated one too, takes a new fencing token: other readers'
/// grants may have moved the counter on since this token's first one, so the counter is nobody's
/// token but the latest grant's. With no writer holding or queued (one `EXISTS`), the grant reads
/// nothing else; every 16th grant (by fencing token) drops expired readers (writers drop them
/// before every check).
const READ_ACQUIRE: &str = concat!(
    waiter_queue_lua!(),
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local place = tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[3], KEYS[4]) > 0 then
  local wait = redis.call('PTTL', KEYS[3])
  if wait == -2 then
    local writer = first_live(4, now)
    if writer then
      local mine = redis.call('ZSCORE', KEYS[6], ARGV[1])
      if not mine or writer < tonumber(mine) then
        wait = 250
      end
    end
  end
  if wait ~= -2 and tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0') <= now then
    if place > 0 then
      take_place(6, ARGV[1], t, now, place)
      wait = math.min(wait, math.floor(place / 4))
    end
    return {0, math.max(wait, 1), tonumber(redis.call('GET', KEYS[2]) or '0')}
  end
end
if redis.call('ZREM', KEYS[6], ARGV[1]) == 1 then
  redis.call('ZREM', KEYS[7], ARGV[1])
end
local fence = redis.call('INCR', KEYS[2])
if fence % 16 == 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
if redis.call('PTTL', KEYS[1]) < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
return {1, fence}
"
);

/// Write acquire. `KEYS`: readers, fence, writer, writer queue, writer places, reader queue,
/// reader places; `ARGV`: token, lease ms, place ms (0 for a try, which never queues). Granted
/// when there is no writer, no unexpired reader, no live writer queued ahead of this one and no
/// live reader queued before it (waiters whose place has ended are dropped on the way); the
/// grant takes the writer out of the queue. Otherwise a waiting writer keeps (or takes) its
/// place in the writer queue, ending place ms from now, and the reply is `{0, ms to wait at
/// most, fencing counter}`. A writer the lock was handed to (its token in the writer key), or
/// retrying its grant, is granted again, with a new fencing token (the counter may have been
/// taken since by the mutex or the semaphore of the same name).
const WRITE_ACQUIRE: &str = concat!(
    waiter_queue_lua!(),
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local place = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local holder = redis.call('GET', KEYS[3])
if holder == ARGV[1] then
  -- Granted again: a token of its own (the mutex and the semaphore share the counter).
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return {1, redis.call('INCR', KEYS[2])}
end
local ahead, queued = live_ahead(4, ARGV[1], now, 1)
local hint
if holder then
  hint = redis.call('PTTL', KEYS[3])
elseif ahead > 0 then
  hint = 250
else
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[2] then
    hint = tonumber(first[2]) - now
  else
    local reader = first_live(6, now)
    if reader and (not queued or reader < tonumber(redis.call('ZSCORE', KEYS[4], ARGV[1]))) then
      hint = 250
    end
  end
end
if hint then
  if place > 0 then
    take_place(4, ARGV[1], t, now, place)
    hint = math.min(hint, math.floor(place / 4))
  end
  return {0, math.max(hint, 1), tonumber(redis.call('GET', KEYS[2]) or '0')}
end
if queued then
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('ZREM', KEYS[5], ARGV[1])
end
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
return {1, redis.call('INCR', KEYS[2])}
"
);

/// The Lua function both releases end with, after the `waiter_queue_lua!` text.
/// `announce(channel, handoff)`, for `KEYS` readers, writer, writer queue, writer places, reader
/// queue, reader places, fencing counter: when no writer holds the lock, lets in who may enter
/// now, on the server. When the first live waiter is a reader, every reader queued before the
/// first live writer may: each (up to 32, so that a release's script time stays bounded) joins
/// the reader set for `handoff` ms with a new fencing token and leaves its queue, and
/// `token:fence:ms` is published for it (an empty message, "every waiter, try again", for any
/// readers past the cap). When it is a writer and no unexpired reader holds, the lock passes to
/// that writer (the writer key holds its token for `handoff` ms, with a new fencing token, and it
/// leaves the queue), and `token:fence:ms` is published. Returns the first waiter handed the lock and its fence (for the release's reply),
/// else nil: nobody may enter, and nothing is published.
macro_rules! announce_lua {
    () => {
        r"
local function announce(channel, handoff)
  if redis.call('EXISTS', KEYS[2]) == 1 then
    return nil
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local writer_at, writer = first_live(3, now)
  local reader_at, reader = first_live(5, now)
  if reader_at and (not writer_at or reader_at < writer_at) then
    local first, first_fence
    local handed = 0
    while reader_at and (not writer_at or reader_at < writer_at) do
      if handed == 32 then
        redis.pcall('SPUBLISH', channel, '')
        break
      end
      redis.call('ZADD', KEYS[1], 'GT', now + handoff, reader)
      redis.call('ZREM', KEYS[5], reader)
      redis.call('ZREM', KEYS[6], reader)
      local fence = redis.call('INCR', KEYS[7])
      redis.pcall('SPUBLISH', channel, reader .. ':' .. fence .. ':' .. handoff)
      if not first then
        first, first_fence = reader, fence
      end
      handed = handed + 1
      reader_at, reader = first_live(5, now)
    end
    if redis.call('PTTL', KEYS[1]) < handoff then
      redis.call('PEXPIRE', KEYS[1], handoff)
    end
    return first, first_fence
  elseif writer then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    if redis.call('EXISTS', KEYS[1]) == 0 then
      redis.call('SET', KEYS[2], writer, 'PX', handoff)
      redis.call('ZREM', KEYS[3], writer)
      redis.call('ZREM', KEYS[4], writer)
      local fence = redis.call('INCR', KEYS[7])
      redis.pcall('SPUBLISH', channel, writer .. ':' .. fence .. ':' .. handoff)
      return writer, fence
    end
  end
  return nil
end
"
    };
}

/// Read release. `KEYS`: readers, writer, writer queue, writer places, reader queue, reader
/// places, fencing counter; `ARGV`: token, release channel, hand-off lease ms. Removes the token
/// from the reader set and from the reader queue (a waiting reader that gives up leaves it this
/// way); if either freed something while a writer is queued, lets in who may enter now
/// (`announce`). Replies `{released, token, fence}` when it hands the lock to a waiter (the
/// first, when it hands it to several readers), else `released` (1 when the token was reading,
/// else 0).
const READ_RELEASE: &str = concat!(
    waiter_queue_lua!(),
    announce_lua!(),
    r"
local released = redis.call('ZREM', KEYS[1], ARGV[1])
local left = 0
if released == 0 then
  -- A reader that holds is never queued (its grant took it out of the queue).
  left = redis.call('ZREM', KEYS[5], ARGV[1])
  if left == 1 then
    redis.call('ZREM', KEYS[6], ARGV[1])
  end
end
if released + left > 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  local named, fence = announce(ARGV[2], tonumber(ARGV[3]))
  if named then
    return {released, named, fence}
  end
end
return released
"
);

/// Write release. `KEYS` and `ARGV` as for the read release. Deletes the writer key where it
/// holds this token and takes the token out of the writer queue (a waiting writer that gives up
/// leaves it this way); if either freed something while somebody is queued (a writer or a
/// reader), lets in who may enter now (`announce`). Replies `{released, token, fence}` when it
/// hands the lock to a waiter (the first, when it hands it to several readers), else `released`
/// (1 when the writer key was ours, else 0).
const WRITE_RELEASE: &str = concat!(
    waiter_queue_lua!(),
    announce_lua!(),
    r"
local released = 0
if redis.call('GET', KEYS[2]) == ARGV[1] then
  released = redis.call('DEL', KEYS[2])
end
local left = redis.call('ZREM', KEYS[3], ARGV[1])
if left == 1 then
  redis.call('ZREM', KEYS[4], ARGV[1])
end
if released + left > 0 and redis.call('EXISTS', KEYS[3], KEYS[5]) > 0 then
  local named, fence = announce(ARGV[2], tonumber(ARGV[3]))
  if named then
    return {released, named, fence}
  end
end
return released
"
);

/// Write shorten (minimum hold). `KEYS`: writer; `ARGV`: token, ms. Lets the writer key expire in
/// `ms` if it still holds this token. Replies 1 or 0.
const WRITE_SHORTEN: &str = r"
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
        keys.companion(QUEUE),
        keys.companion(DUES),
        keys.companion(READER_QUEUE),
        keys.companion(READER_DUES),
    ]
}

/// Either release script's call (they take the same keys and arguments).
fn release_call(
    script: &'static Script,
    keys: &LockKeys,
    token: &Bytes,
    handoff_lease: Duration,
) -> ScriptCall<'static> {
    let call_keys = vec![
        keys.companion(READERS),
        keys.companion(WRITER),
        keys.companion(QUEUE),
        keys.companion(DUES),
        keys.companion(READER_QUEUE),
        keys.companion(READER_DUES),
        keys.fence.clone(),
    ];
    let args = vec![
        Value::Bytes(token.clone()),
        Value::Bytes(announcement(keys)),
        Value::Integer(millis(handoff_lease).max(1)),
    ];
    script.call(keys.slot, call_keys, args)
}

/// A reader's rules: shares with readers, waits for a writer that holds or queued first; a
/// waiting reader queues in arrival order.
#[derive(Debug)]
struct ReadRules;

impl Rules for ReadRules {
    fn blocked_by(&self, kind: &str) -> bool {
        kind == std::any::type_name::<WriteRules>()
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
            Value::Integer(millis(waiter_ttl.min(WRITER_INTENT))),
        ];
        READ_ACQUIRE_SCRIPT.call(keys.slot, acquire_keys(keys), args)
    }

    fn release_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        handoff_lease: Duration,
    ) -> ScriptCall<'static> {
        release_call(&READ_RELEASE_SCRIPT, keys, token, handoff_lease)
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
        shorten_member(keys, READERS, token, keep_for)
    }

    fn renew_target(&self, keys: &LockKeys) -> RenewTarget {
        RenewTarget {
            key: keys.companion(READERS),
            kind: HoldKind::Member,
        }
    }
}

/// A writer's rules: alone; a waiting writer queues in arrival order, behind the live readers
/// that queued before it, and readers that come later wait behind it.
#[derive(Debug)]
struct WriteRules;

impl Rules for WriteRules {
    fn blocked_by(&self, kind: &str) -> bool {
        kind == self.kind() || kind == std::any::type_name::<ReadRules>()
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
            Value::Integer(millis(waiter_ttl.min(WRITER_INTENT))),
        ];
        WRITE_ACQUIRE_SCRIPT.call(keys.slot, acquire_keys(keys), args)
    }

    fn release_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        handoff_lease: Duration,
    ) -> ScriptCall<'static> {
        release_call(&WRITE_RELEASE_SCRIPT, keys, token, handoff_lease)
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
        let args = vec![
            Value::Bytes(token.clone()),
            Value::Integer(millis_ceil(keep_for)),
        ];
        WRITE_SHORTEN_SCRIPT.call(keys.slot, vec![keys.companion(WRITER)], args)
    }

    fn renew_target(&self, keys: &LockKeys) -> RenewTarget {
        RenewTarget {
            key: keys.companion(WRITER),
            kind: HoldKind::Owner,
        }
    }
}

pub(super) static READ: LazyLock<Arc<dyn Rules>> = LazyLock::new(|| Arc::new(ReadRules));
pub(super) static WRITE: LazyLock<Arc<dyn Rules>> = LazyLock::new(|| Arc::new(WriteRules));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn companion_keys_are_distinct() {
        let keys = LockKeys::new("ns", b"k");
        let all = acquire_keys(&keys);
        assert_eq!(&all[0][..], b"{ns:k}:r");
        assert_eq!(&all[2][..], b"{ns:k}:w");
        assert_eq!(&all[3][..], b"{ns:k}:wq");
        assert_eq!(&all[4][..], b"{ns:k}:wd");
        assert_eq!(&all[5][..], b"{ns:k}:rq");
        assert_eq!(&all[6][..], b"{ns:k}:rd");
        assert!(all.iter().all(|k| *k != keys.lock));
    }
}
