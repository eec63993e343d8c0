//! The multi-key lock: [`Locks::with_locks`], all of several mutex keys or none, deadlock-free.
//!
//! The keys are the mutex's own (`{ns:k}` with `{ns:k}:fence`), so a multi-key hold on `a` and
//! `b` excludes `with_lock("a")`. A waiting multi-key caller joins the mutex's server-side
//! waiter queue of every key of a unit, all in one script, with one deadline for its places, so
//! single-key waiters cannot starve it; the mutex's release leaves a key free for it rather than
//! handing it one key alone (its token starts with `m`), and its own release hands each freed
//! key to the next single-key waiter as the mutex's does. The keys are sorted into one global
//! order (hash slot, then server key) and deduplicated; each *unit* (the keys of one slot in a
//! cluster, all keys elsewhere) is taken atomically by one script call, units in order, the
//! earlier held while the caller waits for the next (see the engine's `multi`).

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::Value;

use super::mutex::{Locks, script_keys};
use crate::engine::{self, Mode, Rules, Unit};
use crate::error::LockError;
use crate::key::{KeyCodec, LockKeys};
use crate::renewal::{HoldKind, RenewTarget};
use crate::retry::{millis, millis_ceil};
use crate::scripts::{Script, ScriptCall};
use crate::topology::Deployment;

/// Acquire all. `KEYS`: lock, fence, waiter queue, waiter deadlines and grant time of each key
/// (the mutex's layout), in fives; `ARGV`: token (it starts with `m`, so the mutex's release
/// never hands one of these keys to this caller alone), lease ms, which key's fencing token to
/// reply (1-based), waiter TTL ms (0: a try, which never queues), queue TTL ms.
///
/// Granted only when every key is free or this token's, and no free key's waiter queue has a
/// live head other than this token (dead heads are dropped): then every key is set (or, already
/// this token's, extended), this token leaves each queue it headed, each grant marker says
/// whether its queue still holds anybody (as the mutex's does), each counter is incremented,
/// and the reply is `{1, fence of that key, fence of each key...}` (a key this token already
/// held keeps its fence). Else nothing is granted and the reply is `{0, ms}`: the soonest
/// positive PTTL of a held key or remaining place of another head. A refused try changes
/// nothing; a refused waiting caller holds a place in the queue of every key it does not hold,
/// refreshed together, so its places have one deadline and every queue it shares with another
/// such caller orders the two alike (a place of its that lapsed or is missing puts it at every
/// tail again): the oldest of them heads all its queues, so they never wait on each other in a
/// circle. It also marks each holder's value `+` (queued behind), as the mutex's attempt does.
pub(super) const ACQUIRE_ALL: &str = concat!(
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
    super::mutex::prune_head!("KEYS[i + 2]", "KEYS[i + 3]"),
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
      fence = tonumber(redis.call('GET', KEYS[i + 1]) or '0')
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
pub(super) const RELEASE_ALL: &str = concat!(
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
    super::mutex::prune_head!("KEYS[i + 2]", "KEYS[i + 3]"),
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
struct UnitRules {
    /// The mutex's script keys of each part, in fives.
    script_keys: Vec<Bytes>,
    /// The release channel of each part.
    channels: Vec<Value>,
    /// The lock key of each part.
    locks: Vec<Bytes>,
    /// Which part's fencing token the acquire script replies (1-based).
    report: i64,
}

impl Rules for UnitRules {
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

    fn token_prefix(&self) -> &'static [u8] {
        b"m"
    }
}

/// Splits `keys` (the caller's order) into units in the global order, and says which unit holds
/// the caller's first key.
fn plan(all: Vec<Arc<LockKeys>>, by_slot: bool) -> (Vec<Unit>, usize) {
    let first = all.first().map(|keys| keys.lock.clone());
    let mut sorted = all;
    sorted.sort_by(|a, b| (a.slot, &a.lock).cmp(&(b.slot, &b.lock)));
    sorted.dedup_by(|a, b| a.lock == b.lock);
    let mut groups: Vec<Vec<Arc<LockKeys>>> = Vec::new();
    for keys in sorted {
        match groups.last_mut() {
            Some(group) if !by_slot || group[0].slot == keys.slot => group.push(keys),
            _ => groups.push(vec![keys]),
        }
    }
    let mut report = 0;
    let units = groups
        .into_iter()
        .enumerate()
        .map(|(index, parts)| {
            let position = parts.iter().position(|p| Some(&p.lock) == first.as_ref());
            if position.is_some() {
                report = index;
            }
            let position = position.unwrap_or(0);
            let rules = UnitRules {
                script_keys: parts.iter().flat_map(|p| script_keys(p)).collect(),
                channels: parts
                    .iter()
                    .map(|p| Value::Bytes(crate::notify::channel(&p.lock)))
                    .collect(),
                locks: parts.iter().map(|p| p.lock.clone()).collect(),
                report: i64::try_from(position + 1).unwrap_or(1),
            };
            Unit {
                rules: Arc::new(rules),
                keys: Arc::clone(&parts[position]),
                parts,
            }
        })
        .collect();
    (units, report)
}

fn no_keys() -> LockError {
    LockError::invalid(
        "keys",
        "must name at least one key, e.g. locks.with_locks(&[\"a\", \"b\"], wait, body); use \
         with_lock for a single key",
    )
}

impl<K: ?Sized> Locks<K> {
    /// Waits up to `wait_timeout` for the locks on *all* of `keys`, runs `body` while holding
    /// them, releases them, and returns the body's output: all or nothing.
    ///
    /// Never deadlocks against other callers asking for overlapping sets in any order: the
    /// keys are taken in one global order (hash slot, then server key; duplicates count once),
    /// all keys of one slot in one round trip (on a standalone or replicated deployment, all
    /// keys in one round trip), holding the earlier slots' keys (renewed) while it waits for the
    /// next slot's. While it waits it holds a place in the fair waiter queue of each key it
    /// waits for, as [`Locks::with_lock`]'s waiters do, so a stream of single-key callers
    /// cannot keep it out until its wait ends. Each key is a lease of its
    /// own, renewed while the body runs; losing any key is losing the whole: the body is
    /// dropped and [`LockError::LockLost`] names the lost key. The keys are the mutex's, so
    /// they exclude [`Locks::with_lock`] on any of them.
    ///
    /// [`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least) applies to every key;
    /// [`LockOptions::reentrant`](crate::LockOptions::reentrant) does not: `with_locks` always
    /// takes its keys, so inside a hold of one of them it waits for itself until `wait_timeout`.
    ///
    /// [`current_lease`](crate::current_lease) in the body is the lease of the caller's
    /// *first* key (its key and fencing token); every key's fencing counter is incremented, and
    /// [`Lease::fencing_token_of`](crate::Lease::fencing_token_of) gives each key's token.
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`]: `keys` is empty or `wait_timeout` is zero.
    /// - [`LockError::TimedOut`]: not all acquired within the wait. It names the key of the
    ///   round trip that was busy: in a cluster a key of the busy slot, elsewhere the caller's
    ///   first key.
    /// - [`LockError::LockLost`], [`LockError::Backend`]: as for [`Locks::with_lock`].
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// use std::time::Duration;
    ///
    /// let accounts = client.lock::<str>();
    /// // Move money between two accounts; another transfer may lock them as ["b", "a"].
    /// accounts
    ///     .with_locks(&["account:a", "account:b"], Duration::from_secs(2), async {
    ///         /* debit a, credit b */
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn with_locks<Q, F>(
        &self,
        keys: &[&Q],
        wait_timeout: Duration,
        body: F,
    ) -> impl Future<Output = Result<F::Output, LockError>> + use<K, Q, F>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        let planned = self.plan(keys);
        let body = Box::pin(body);
        let (engine, settings) = (Arc::clone(&self.engine), Arc::clone(&self.settings));
        async move {
            let (units, report) = planned?;
            if wait_timeout.is_zero() {
                return Err(LockError::invalid(
                    "wait_timeout",
                    "must be positive, e.g. Duration::from_secs(2); use try_with_locks to not \
                     wait",
                ));
            }
            let mode = Mode::Wait(wait_timeout);
            match engine::run_all(engine, settings, units, report, mode, body).await? {
                Some(output) => Ok(output),
                None => Err(LockError::invalid(
                    "wait_timeout",
                    "internal: busy result in waiting mode",
                )),
            }
        }
    }

    /// Runs `body` under the locks on all of `keys` if all are free now: `Ok(None)` when any
    /// is held by another owner (nothing is kept, the body is not run), `Ok(Some(output))`
    /// after running the body and releasing. See [`Locks::with_locks`].
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// let locks = client.lock::<u64>();
    /// if locks.try_with_locks(&[&1, &2], async { /* both */ }).await?.is_none() {
    ///     println!("one of them is busy");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_with_locks<Q, F>(
        &self,
        keys: &[&Q],
        body: F,
    ) -> impl Future<Output = Result<Option<F::Output>, LockError>> + use<K, Q, F>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        let planned = self.plan(keys);
        let body = Box::pin(body);
        let (engine, settings) = (Arc::clone(&self.engine), Arc::clone(&self.settings));
        async move {
            let (units, report) = planned?;
            engine::run_all(engine, settings, units, report, Mode::Try, body).await
        }
    }

    fn plan<Q: KeyCodec + ?Sized>(&self, keys: &[&Q]) -> Result<(Vec<Unit>, usize), LockError> {
        if keys.is_empty() {
            return Err(no_keys());
        }
        let all = keys.iter().map(|key| self.keys(*key)).collect();
        Ok(plan(
            all,
            self.engine.conn.deployment == Deployment::Cluster,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<Arc<LockKeys>> {
        names
            .iter()
            .map(|n| Arc::new(LockKeys::new("ns", n.as_bytes())))
            .collect()
    }

    #[test]
    fn any_order_gives_one_global_order() {
        let names = ["a", "b", "c", "d", "e", "f", "g"];
        let mut reversed = names;
        reversed.reverse();
        for by_slot in [false, true] {
            let (one, _) = plan(keys(&names), by_slot);
            let (other, _) = plan(keys(&reversed), by_slot);
            let order = |units: &[Unit]| -> Vec<Bytes> {
                units
                    .iter()
                    .flat_map(|u| u.parts.iter().map(|p| p.lock.clone()))
                    .collect()
            };
            assert_eq!(order(&one), order(&other));
            assert_eq!(order(&one).len(), names.len());
        }
        // Not a cluster: one unit, one round trip.
        assert_eq!(plan(keys(&names), false).0.len(), 1);
    }

    #[test]
    fn duplicates_count_once_and_the_first_key_is_reported() {
        let (units, report) = plan(keys(&["z", "a", "z", "a"]), true);
        let parts: usize = units.iter().map(|u| u.parts.len()).sum();
        assert_eq!(parts, 2);
        assert_eq!(&**units[report].keys.display(), "z");
        let (units, report) = plan(keys(&["z", "a"]), false);
        assert_eq!(units.len(), 1);
        assert_eq!(&**units[report].keys.display(), "z");
    }

    #[test]
    fn units_share_a_slot() {
        let many: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
        let names: Vec<&str> = many.iter().map(String::as_str).collect();
        let (units, _) = plan(keys(&names), true);
        for unit in &units {
            assert!(unit.parts.iter().all(|p| p.slot == unit.keys.slot));
        }
        assert!(units.windows(2).all(|w| w[0].keys.slot < w[1].keys.slot));
    }

    #[tokio::test]
    async fn empty_key_list_is_invalid() {
        let client = crate::LockClient::from_fred(fred::clients::Client::default());
        let locks = client.lock::<str>();
        let none: [&str; 0] = [];
        let waited = locks
            .with_locks(&none, Duration::from_secs(1), async {})
            .await;
        assert!(matches!(
            waited,
            Err(LockError::InvalidArgument {
                argument: "keys",
                ..
            })
        ));
        let tried = locks.try_with_locks(&none, async {}).await;
        assert!(matches!(
            tried,
            Err(LockError::InvalidArgument {
                argument: "keys",
                ..
            })
        ));
    }
}
