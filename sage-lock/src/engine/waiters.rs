//! Tasks of this process waiting for a key, woken when this process releases it (so a local
//! waiter does not have to wait for its next poll).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// One notifier per key that local tasks wait on.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    by_key: Mutex<HashMap<Vec<u8>, Arc<Notify>>>,
    /// How many tasks are registered (skips the lock on release when none).
    waiting: AtomicUsize,
}

impl Waiters {
    /// The notifier local waiters for `lock_key` sleep on; hand it back with [`Waiters::forget`].
    pub(crate) fn register(&self, lock_key: &[u8]) -> Arc<Notify> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let Ok(mut by_key) = self.by_key.lock() else {
            return Arc::new(Notify::new());
        };
        Arc::clone(
            by_key
                .entry(lock_key.to_vec())
                .or_insert_with(|| Arc::new(Notify::new())),
        )
    }

    /// Drops the notifier for `lock_key` when no waiter holds it any more.
    pub(crate) fn forget(&self, lock_key: &[u8], notify: Arc<Notify>) {
        drop(notify);
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        if let Ok(mut by_key) = self.by_key.lock()
            && by_key
                .get(lock_key)
                .is_some_and(|n| Arc::strong_count(n) == 1)
        {
            by_key.remove(lock_key);
        }
    }

    /// Wakes one local waiter for `lock_key`, if any.
    pub(crate) fn wake_one(&self, lock_key: &[u8]) {
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        let notify = self
            .by_key
            .lock()
            .ok()
            .and_then(|w| w.get(lock_key).cloned());
        if let Some(notify) = notify {
            notify.notify_one();
        }
    }

    /// How many keys have a notifier (for tests of cancellation bookkeeping).
    #[cfg(test)]
    pub(crate) fn keys(&self) -> usize {
        self.by_key.lock().map_or(0, |w| w.len())
    }
}
