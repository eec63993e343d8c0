//! The multi-key lock: [`Locks::with_locks`], all of several mutex keys or none, deadlock-free.
//!
//! The keys are the mutex's own (`{ns:k}` with `{ns:k}:fence`), so a multi-key hold on `a` and
//! `b` excludes `with_lock("a")`. A waiting multi-key caller joins the mutex's server-side
//! waiter queue of every key of a unit, all in one script, with one deadline for its places, so
//! single-key waiters cannot starve it; the mutex's release leaves a key free for it rather than
//! handing it one key alone (its token starts with `m`; a unit of one key is handed it as a
//! single-key waiter is), and its own release hands each freed key to the next single-key
//! waiter as the mutex's does. The keys are sorted into one global order (hash slot, then
//! server key) and deduplicated; each *unit* (the keys of one slot in a
//! cluster, all keys elsewhere) is taken atomically by one script call, units in order, the
//! earlier held while the caller waits for the next (see the engine's `multi`).

pub(in crate::primitives) mod rules;

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::Duration;

use rules::UnitRules;

use super::mutex::Locks;
use crate::engine::{self, Mode, Unit};
use crate::error::LockError;
use crate::key::{KeyCodec, LockKeys};
use crate::topology::Deployment;

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
            let rules = UnitRules::new(&parts, position);
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
    /// takes its keys, so nested in the task's own hold of one of them (a `with_lock`, or
    /// another `with_locks`) it returns [`TimeoutReason::HeldByThisTask`](crate::TimeoutReason)
    /// at once, naming that key. The other way round, the hold is the task's hold of each key:
    /// a `with_lock` of one of them nested in the body fails at once the same way, or with
    /// `reentrant` runs under the hold, its [`current_lease`](crate::current_lease) showing
    /// that key and its fencing token.
    ///
    /// [`current_lease`](crate::current_lease) in the body is the lease of the caller's
    /// *first* key (its key and fencing token); every key's fencing counter is incremented, and
    /// [`Lease::fencing_token_of`](crate::Lease::fencing_token_of) gives each key's token.
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`]: `keys` is empty or `wait_timeout` is zero; otherwise as
    ///   for [`Locks::with_lock`] (arguments `key`, `from_fred`).
    /// - [`LockError::TimedOut`]: not all acquired within the wait. It names the keys of the
    ///   round trip that was busy (all keys on a standalone or replicated deployment, the busy
    ///   slot's in a cluster): `one of a, b, c` (at most 8 named, then how many more) for
    ///   several, the key alone for one.
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
    /// is held by another owner or by this task (the call is nested in its body; nothing is
    /// kept, the body is not run), `Ok(Some(output))` after running the body and releasing.
    /// See [`Locks::with_locks`].
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`]: `keys` is empty; otherwise as for [`Locks::with_lock`].
    /// - [`LockError::TimedOut`]: transient failures did not clear within about one second
    ///   ([`TRY_LOCK_RETRY_WINDOW`](crate::TRY_LOCK_RETRY_WINDOW)).
    /// - [`LockError::LockLost`], [`LockError::Backend`]: as for [`Locks::with_lock`].
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
    use fred::bytes::Bytes;

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
