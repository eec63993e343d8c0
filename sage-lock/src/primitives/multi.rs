//! The multi-key lock: [`Locks::with_locks`], all of several mutex keys or none, deadlock-free.
//!
//! The keys are the mutex's own (`{ns:k}` with `{ns:k}:fence`), so a multi-key hold on `a` and
//! `b` excludes `with_lock("a")`. A multi-key caller does not join the mutex's server-side
//! waiter queues: it takes a key only when no live queued mutex waiter is at the queue's head,
//! and its release notifies that head as the mutex's release does. They are sorted into one global order (hash slot, then server
//! key) and deduplicated; each *unit* (the keys of one slot in a cluster, all keys elsewhere) is
//! taken atomically by one script call, units in order with rollback (see the engine's `multi`).

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
/// (the mutex's layout), in fives; `ARGV`: token, lease ms, which key's fencing token to reply (1-based).
/// Granted only when no key has another owner and no key has a live queued mutex waiter at its
/// head (multi-key callers never queue): then every key is set (or, already this token's,
/// extended), its grant marker says whether its queue still holds anybody (as the mutex's does),
/// and its counter incremented, and the reply is `{1, fence of that key, fence of each key...}`
/// (a key this token already held keeps its fence); else nothing changes and the reply is
/// `{0, ms}` for a busy key.
pub(super) const ACQUIRE_ALL: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holders = {}
local queued = {}
for i = 1, #KEYS, 5 do
  local holder = redis.call('GET', KEYS[i])
  if holder == ARGV[1] .. '+' then
    holder = ARGV[1]
  end
  if holder and holder ~= ARGV[1] then
    return {0, redis.call('PTTL', KEYS[i])}
  end
  local head
  if not holder then
    head = redis.call('LINDEX', KEYS[i + 2], 0)
    if head and head ~= ARGV[1] then
      local due = tonumber(redis.call('ZSCORE', KEYS[i + 3], head) or '0')
      if due > now then
        return {0, due - now}
      end
    end
  end
  holders[i] = holder
  queued[i] = head and 'q' or ''
end
local reply = {1, 0}
for i = 1, #KEYS, 5 do
  local fence
  if holders[i] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
    fence = tonumber(redis.call('GET', KEYS[i + 1]) or '0')
  else
    redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
    redis.call('SET', KEYS[i + 4], queued[i], 'PX', '315360000000')
    fence = redis.call('INCR', KEYS[i + 1])
  end
  reply[#reply + 1] = fence
  if (i + 4) / 5 == tonumber(ARGV[3]) then
    reply[2] = fence
  end
end
return reply
";

/// Release all. `KEYS` as for acquire; `ARGV`: token, then each key's release channel. `DEL`s
/// each key that still holds this token and publishes the live head of its mutex waiter queue on
/// its channel (`SPUBLISH` under `pcall`, as the mutex's release does). Replies 1 if any key was
/// released, else 0.
pub(super) const RELEASE_ALL: &str = r"
local released = 0
local now
for i = 1, #KEYS, 5 do
  local holder = redis.call('GET', KEYS[i])
  if holder == ARGV[1] or holder == ARGV[1] .. '+' then
    released = released + redis.call('DEL', KEYS[i])
    local head = redis.call('LINDEX', KEYS[i + 2], 0)
    if head then
      if not now then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      if tonumber(redis.call('ZSCORE', KEYS[i + 3], head) or '0') > now then
        redis.pcall('SPUBLISH', ARGV[(i + 4) / 5 + 1], head)
      end
    end
  end
end
if released > 0 then
  return 1
end
return 0
";

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
    /// The mutex's script keys of each part, in fours.
    script_keys: Vec<Bytes>,
    /// The release channel of each part.
    channels: Vec<Value>,
    /// Which part's fencing token the acquire script replies (1-based).
    report: i64,
}

impl Rules for UnitRules {
    /// All parts at once or none; there is no queue for a set of keys, so waiting changes nothing.
    fn wait_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        lease: Duration,
        _waiter_ttl: Duration,
    ) -> ScriptCall<'static> {
        let args = vec![
            Value::Bytes(token.clone()),
            Value::Integer(millis(lease)),
            Value::Integer(self.report),
        ];
        ACQUIRE_ALL_SCRIPT.call(keys.slot, self.script_keys.clone(), args)
    }

    fn release_call(
        &self,
        keys: &LockKeys,
        token: &Bytes,
        _handoff_lease: Duration,
    ) -> ScriptCall<'static> {
        let mut args = Vec::with_capacity(1 + self.channels.len());
        args.push(Value::Bytes(token.clone()));
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
    /// keys in one round trip), and when a later slot's keys are busy the ones already taken are
    /// released and the call backs off and retries within the wait. Each key is a lease of its
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
