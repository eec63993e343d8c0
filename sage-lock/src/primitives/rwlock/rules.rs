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
use crate::retry::millis;
use crate::scripts::{Script, ScriptCall};

/// The suffix of the reader set.
const READERS: &str = ":r";
/// The suffix of the writer key.
const WRITER: &str = ":w";
/// The suffix of the waiting writer's intent.
const INTENT: &str = ":wi";
/// The suffix of the waiting mark: set by every refused attempt of a waiting caller, for what
/// is left of its wait (at most 2 s), so that releases announce themselves only while somebody
/// waits.
const WAITING: &str = ":rw-waiting";

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

pub(super) static READ: LazyLock<Arc<dyn Rules>> = LazyLock::new(|| Arc::new(ReadRules));
pub(super) static WRITE: LazyLock<Arc<dyn Rules>> =
    LazyLock::new(|| Arc::new(WriteRules { claim_intent: true }));
pub(super) static TRY_WRITE: LazyLock<Arc<dyn Rules>> = LazyLock::new(|| {
    Arc::new(WriteRules {
        claim_intent: false,
    })
});

#[cfg(test)]
mod tests {
    use super::*;

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
