//! Tasks of this process waiting for the same key: one of them (the leader) asks the server,
//! the others wait their turn here, so a process never keeps more than one task polling the
//! server per key, and its tasks queue on the server one at a time behind other processes'.
//! Only for primitives whose waiting calls line up ([`Rules::local_line`](super::Rules):
//! the mutex); the others' calls each queue on the server.
//!
//! The leader hands over as soon as it is granted (or gives up), so the next local task joins
//! the server's queue while the lock is held. Leadership passes in arrival order: a task that
//! just released and asks again lines up behind the tasks already waiting. A release by this
//! process wakes the leader.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use fred::bytes::Bytes;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Every key local tasks wait on.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    /// Each entry is referenced by the map and by the [`WaitSlot`] of every task waiting for
    /// its key, and by nothing else: [`Waiters::leave`] drops it when the map's is the last.
    by_key: Mutex<HashMap<Bytes, Arc<KeyWaiters>>>,
    /// How many tasks are registered (skips the lock on release when none).
    waiting: AtomicUsize,
}

/// The local tasks waiting for one key.
#[derive(Debug)]
pub(crate) struct KeyWaiters {
    /// The leader's permit: one, handed to followers in arrival order (tokio's semaphore is
    /// fair, so a task that just released cannot take it back ahead of them).
    leader: Arc<Semaphore>,
    /// The leader waits here for a release by this process.
    released: Notify,
}

impl Default for KeyWaiters {
    fn default() -> Self {
        KeyWaiters {
            leader: Arc::new(Semaphore::new(1)),
            released: Notify::new(),
        }
    }
}

/// Being the key's leader; dropped, it passes to the longest-waiting follower.
#[derive(Debug)]
pub(crate) struct Leadership {
    _permit: OwnedSemaphorePermit,
}

impl KeyWaiters {
    /// Becomes the key's leader if nobody leads or waits to.
    pub(crate) fn try_lead(&self) -> Option<Leadership> {
        Arc::clone(&self.leader)
            .try_acquire_owned()
            .ok()
            .map(|permit| Leadership { _permit: permit })
    }

    /// Waits until this task is the leader (FIFO among followers). Cancel-safe: a dropped
    /// follower leaves the line, and a leadership it was handed passes on.
    pub(crate) async fn lead(&self) -> Option<Leadership> {
        Arc::clone(&self.leader)
            .acquire_owned()
            .await
            .ok()
            .map(|permit| Leadership { _permit: permit })
    }

    /// Resolves when this process releases the key (or a permit is stored from a release that
    /// came while the leader was busy).
    pub(crate) fn released(&self) -> tokio::sync::futures::Notified<'_> {
        self.released.notified()
    }
}

/// A task's place among this process's waiters for one key, handed back however the
/// acquisition ends (cancellation included); a leader hands over to the next local waiter.
pub(crate) struct WaitSlot<'a> {
    all: &'a Waiters,
    key: &'a Bytes,
    waiters: Option<Arc<KeyWaiters>>,
    leading: Option<Leadership>,
}

impl<'a> WaitSlot<'a> {
    /// A place for `key`, joined on first need.
    pub(crate) fn new(all: &'a Waiters, key: &'a Bytes) -> Self {
        WaitSlot {
            all,
            key,
            waiters: None,
            leading: None,
        }
    }

    fn waiters(&mut self) -> &Arc<KeyWaiters> {
        self.waiters.get_or_insert_with(|| self.all.join(self.key))
    }

    /// Leads at once if no other local task leads or waits to.
    pub(crate) fn try_lead(&mut self) -> bool {
        if self.leading.is_none() {
            self.leading = self.waiters().try_lead();
        }
        self.leading.is_some()
    }

    /// Waits (until `deadline`) for the local leader to hand over; false when out of time.
    pub(crate) async fn follow(&mut self, deadline: tokio::time::Instant) -> bool {
        let waiters = Arc::clone(self.waiters());
        self.leading = tokio::time::timeout_at(deadline, waiters.lead())
            .await
            .ok()
            .flatten();
        self.leading.is_some()
    }

    /// Hands leadership to the longest-waiting local follower, if leading. True when a
    /// follower may have been handed it (other local tasks wait for the key).
    pub(crate) fn resign(&mut self) -> bool {
        // Held by the key's entry and this slot; more: followers' slots.
        self.leading.take().is_some()
            && self
                .waiters
                .as_ref()
                .is_some_and(|waiters| Arc::strong_count(waiters) > 2)
    }

    /// The key's local waiters, once joined.
    pub(crate) fn local(&self) -> Option<&KeyWaiters> {
        self.waiters.as_deref()
    }
}

impl Drop for WaitSlot<'_> {
    fn drop(&mut self) {
        self.resign();
        if let Some(waiters) = self.waiters.take() {
            self.all.leave(self.key, waiters);
        }
    }
}

impl Waiters {
    /// The waiters of `lock_key`; hand them back with [`Waiters::leave`].
    pub(crate) fn join(&self, lock_key: &Bytes) -> Arc<KeyWaiters> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let Ok(mut by_key) = self.by_key.lock() else {
            return Arc::new(KeyWaiters::default());
        };
        Arc::clone(by_key.entry(lock_key.clone()).or_default())
    }

    /// Drops the entry for `lock_key` when no task waits for it any more.
    pub(crate) fn leave(&self, lock_key: &[u8], waiters: Arc<KeyWaiters>) {
        drop(waiters);
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        if let Ok(mut by_key) = self.by_key.lock()
            && by_key
                .get(lock_key)
                .is_some_and(|n| Arc::strong_count(n) == 1)
        {
            by_key.remove(lock_key);
        }
    }

    /// Whether any local task waits for any key (skips the bookkeeping when none).
    pub(crate) fn any(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }

    /// Wakes the local leader for `lock_key`, if any.
    ///
    /// Wakes it under the map's lock, without taking a reference to the key's entry: a waiter
    /// leaving meanwhile ([`Waiters::leave`]) must see only the references of tasks still
    /// waiting, or it keeps an entry that nobody removes. (`notify_one` only stores a permit or
    /// schedules the woken task: it never waits.)
    pub(crate) fn wake_one(&self, lock_key: &[u8]) {
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Ok(by_key) = self.by_key.lock()
            && let Some(waiters) = by_key.get(lock_key)
        {
            waiters.released.notify_one();
        }
    }

    /// Wakes the local leader of every key (the client was closed: their next attempt fails).
    pub(crate) fn wake_all(&self) {
        if let Ok(by_key) = self.by_key.lock() {
            for waiters in by_key.values() {
                waiters.released.notify_one();
            }
        }
    }

    /// How many keys have local waiters (for tests of cancellation bookkeeping).
    pub(crate) fn keys(&self) -> usize {
        self.by_key.lock().map_or(0, |w| w.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_leader_at_a_time_in_arrival_order() {
        let waiters = Arc::new(Waiters::default());
        let key = Bytes::from_static(b"k");
        let first = waiters.join(&key);
        let leading = first.try_lead().expect("the first task leads");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let (w, key, order) = (Arc::clone(&waiters), key.clone(), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                let kw = w.join(&key);
                let leading = kw.lead().await;
                order.lock().map(|mut o| o.push(i)).ok();
                drop(leading);
                w.leave(&key, kw);
            }));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            first.try_lead().is_none(),
            "a second leader while the first leads"
        );
        drop(leading);
        // Handed to the first follower at once: the task that just resigned cannot barge back.
        assert!(
            first.try_lead().is_none(),
            "the resigned leader took it back"
        );
        waiters.leave(&key, first);
        for task in tasks {
            task.await.ok();
        }
        assert_eq!(
            *order.lock().map(|o| o.clone()).unwrap_or_default(),
            [0, 1, 2]
        );
        assert_eq!(waiters.keys(), 0);
    }

    #[test]
    fn a_dropped_wait_slot_leaves_no_waiter_behind() {
        let all = Waiters::default();
        for key in [b"a".as_slice(), b"b", b"a"] {
            let key = Bytes::copy_from_slice(key);
            let mut slot = WaitSlot::new(&all, &key);
            assert!(slot.try_lead());
            assert_eq!(all.keys(), 1);
            drop(slot);
            let mut next = WaitSlot::new(&all, &key);
            assert!(next.try_lead(), "a dropped leader handed over");
        }
        assert_eq!(all.keys(), 0);
    }

    /// A release waking the key's leader while its last waiter leaves (a cancelled waiter
    /// beside a holder's release, in one process) leaves no entry behind. `wake_one` used to
    /// hold the key's entry outside the map's lock while it woke the leader: a waiter leaving
    /// then saw a second reference, kept the entry, and nobody removed it.
    #[test]
    fn a_waiter_leaving_while_a_release_wakes_the_key_leaves_no_entry() {
        use std::sync::atomic::AtomicBool;
        let all = Arc::new(Waiters::default());
        let key = Bytes::from_static(b"k");
        let stop = Arc::new(AtomicBool::new(false));
        let waker = std::thread::spawn({
            let (all, key, stop) = (Arc::clone(&all), key.clone(), Arc::clone(&stop));
            move || {
                while !stop.load(Ordering::Relaxed) {
                    all.wake_one(&key);
                }
            }
        });
        let mut left_behind = 0;
        for round in 0..100_000_u32 {
            let waiters = all.join(&key);
            // Give the waker time to see the waiter (a varying time, so its wake-ups fall at
            // every point of the leaving).
            for _ in 0..round % 64 {
                std::hint::spin_loop();
            }
            all.leave(&key, waiters);
            // Only this thread joins: once it left, the entry must be gone. One left behind is
            // counted and cleared (the next round would reuse it and hide it).
            if all.keys() != 0 {
                left_behind += 1;
                if let Ok(mut by_key) = all.by_key.lock() {
                    by_key.clear();
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        waker.join().ok();
        assert_eq!(left_behind, 0, "entries left behind by leaving waiters");
    }
}
