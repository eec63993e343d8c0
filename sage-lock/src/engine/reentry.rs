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

/// One lock the current task holds, and the ones it held already when acquiring it.
struct Holding {
    /// The client (its engine) the lock was taken through.
    engine: Weak<Engine>,
    /// The primitive's kind ([`Rules::kind`]).
    kind: &'static str,
    /// The server key (namespace and key).
    lock: Bytes,
    /// The lease the lock is held under.
    lease: Lease,
    outer: Option<Arc<Holding>>,
}

impl Holding {
    fn is(&self, engine: &Arc<Engine>, kind: &str, lock: &[u8]) -> bool {
        std::ptr::eq(self.engine.as_ptr(), Arc::as_ptr(engine))
            && self.kind == kind
            && self.lock == lock
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
                if holding.is(engine, kind, lock) {
                    return Some(holding.lease.clone());
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
                if std::ptr::eq(holding.engine.as_ptr(), Arc::as_ptr(engine))
                    && holding.lock == lock
                    && rules.blocked_by(holding.kind)
                {
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
    let holding = Holding {
        engine: Arc::downgrade(engine),
        kind: rules.kind(),
        lock,
        lease,
        outer: HOLDING.try_with(Arc::clone).ok(),
    };
    HOLDING.scope(Arc::new(holding), body)
}
