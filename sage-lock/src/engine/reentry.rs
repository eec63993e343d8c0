//! Reentrancy: which locks the current task holds, so that a reentrant call
//! ([`LockOptions::reentrant`](crate::LockOptions::reentrant)) for one of them runs at once under
//! the held lease.
//!
//! The set is task-local, like [`current_lease`](crate::current_lease): a task spawned inside a
//! body holds nothing, so its calls acquire (and wait) like any other caller's.

use std::sync::{Arc, Weak};

use fred::bytes::Bytes;

use super::{Engine, Rules};
use crate::lease::Lease;

tokio::task_local! {
    static HOLDING: Arc<Holding>;
}

/// One hold of the current task (one lock, or the keys of a multi-key hold), and the ones it
/// held already when acquiring it.
struct Holding {
    /// The client (its engine) the lock was taken through.
    engine: Weak<Engine>,
    /// The primitive's kind ([`Rules::kind`]).
    kind: &'static str,
    /// The server key (namespace and key).
    lock: Bytes,
    /// The lease the lock is held under.
    lease: Lease,
    /// The other keys of a multi-key hold, each with its own view of the hold's lease.
    also: Vec<(Bytes, Lease)>,
    outer: Option<Arc<Holding>>,
}

impl Holding {
    /// The lease under which this hold holds `lock` through `engine`, if it does.
    fn lease_of(&self, engine: &Arc<Engine>, lock: &[u8]) -> Option<&Lease> {
        if !std::ptr::eq(self.engine.as_ptr(), Arc::as_ptr(engine)) {
            return None;
        }
        std::iter::once((&self.lock, &self.lease))
            .chain(self.also.iter().map(|(lock, lease)| (lock, lease)))
            .find(|(held, _)| *held == lock)
            .map(|(_, lease)| lease)
    }
}

/// The lease of the lock on `lock` of `rules`' kind, taken through `engine`, if the current task
/// holds it.
pub(crate) fn held(engine: &Arc<Engine>, rules: &dyn Rules, lock: &[u8]) -> Option<Lease> {
    let kind = rules.kind();
    HOLDING
        .try_with(|top| {
            let mut node = Some(top);
            while let Some(holding) = node {
                if holding.kind == kind
                    && let Some(lease) = holding.lease_of(engine, lock)
                {
                    return Some(lease.clone());
                }
                node = holding.outer.as_ref();
            }
            None
        })
        .ok()
        .flatten()
}

/// Whether the current task holds, through `engine`, a lock on `lock` of a kind that keeps a
/// call of `rules`' kind out ([`Rules::blocked_by`]).
pub(crate) fn blocks(engine: &Arc<Engine>, rules: &dyn Rules, lock: &[u8]) -> bool {
    HOLDING
        .try_with(|top| {
            let mut node = Some(top);
            while let Some(holding) = node {
                if rules.blocked_by(holding.kind) && holding.lease_of(engine, lock).is_some() {
                    return true;
                }
                node = holding.outer.as_ref();
            }
            false
        })
        .unwrap_or(false)
}

/// Runs `body` with the lock on `lock`, held under `lease`, added to the current task's holds.
pub(crate) fn scope<F: Future>(
    engine: &Arc<Engine>,
    rules: &dyn Rules,
    lock: Bytes,
    lease: Lease,
    body: F,
) -> impl Future<Output = F::Output> {
    scope_all(engine, rules, (lock, lease), Vec::new(), body)
}

/// Runs `body` with the locks of one multi-key hold (`first` and `also`, each with its lease)
/// added to the current task's holds.
pub(crate) fn scope_all<F: Future>(
    engine: &Arc<Engine>,
    rules: &dyn Rules,
    first: (Bytes, Lease),
    also: Vec<(Bytes, Lease)>,
    body: F,
) -> impl Future<Output = F::Output> {
    let (lock, lease) = first;
    let holding = Holding {
        engine: Arc::downgrade(engine),
        kind: rules.kind(),
        lock,
        lease,
        also,
        outer: HOLDING.try_with(Arc::clone).ok(),
    };
    HOLDING.scope(Arc::new(holding), body)
}
