//! The last fencing token this client saw per key, to notice a counter that went backwards.
//!
//! The fencing counter `{ns:k}:fence` has no TTL; it only disappears when the server loses data
//! (eviction under a `maxmemory-policy` other than `noeviction`/`volatile-*`, `FLUSHALL`, a
//! restart without persistence). A token of an exclusive grant (a mutex's, a writer's, a
//! one-permit semaphore's) lower than one already seen for the key is then logged at `warn` and
//! counted (`LockStats::fence_regressions`): stores that reject stale tokens would reject the new
//! holder's writes. Grants that share (readers, a semaphore's permits) are not compared: their
//! replies come in any order. Nor are grants of different primitives on one name (the mutex, the
//! writer, a one-permit semaphore): they share the counter but not their exclusion, so each
//! primitive's tokens are compared only with its own.

use std::collections::HashMap;
use std::sync::Mutex;

use fred::bytes::Bytes;

/// Keys per generation of the memory: a key is remembered across at least this many other keys
/// seen after it, and at most twice this many are kept (detection is best effort).
const MAX_KEYS: usize = 4096;

/// One primitive (its rules' kind) and lock key.
type Seen = HashMap<(&'static str, Bytes), u64>;

/// Last token seen per primitive and lock key, in two generations: when the current one is
/// full it becomes the previous one (the one before is forgotten), so keys seen recently stay.
#[derive(Debug, Default)]
pub(crate) struct Fences(Mutex<(Seen, Seen)>);

impl Fences {
    /// Records `token` of a `kind` grant on `key`; returns the previous token when `token` is
    /// lower.
    pub(crate) fn observe(&self, kind: &'static str, key: &Bytes, token: u64) -> Option<u64> {
        let Ok(mut seen) = self.0.lock() else {
            return None;
        };
        let (current, previous) = &mut *seen;
        let entry = (kind, key.clone());
        let last = current
            .get(&entry)
            .or_else(|| previous.get(&entry))
            .copied();
        if current.len() >= MAX_KEYS && !current.contains_key(&entry) {
            *previous = std::mem::take(current);
        }
        current.insert(entry, token);
        last.filter(|&last| token < last)
    }

    /// How many keys are remembered (at most twice [`MAX_KEYS`]; for tests).
    pub(crate) fn remembered(&self) -> usize {
        self.0.lock().map_or(0, |seen| seen.0.len() + seen.1.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_tokens_are_reported_once() {
        let fences = Fences::default();
        let key = Bytes::from_static(b"k");
        assert_eq!(fences.observe("mutex", &key, 1), None);
        assert_eq!(fences.observe("mutex", &key, 5), None);
        assert_eq!(fences.observe("mutex", &key, 2), Some(5));
        assert_eq!(fences.observe("mutex", &key, 3), None);
        assert_eq!(
            fences.observe("mutex", &Bytes::from_static(b"other"), 1),
            None
        );
        // Another primitive on the same name shares the counter, not the order.
        assert_eq!(fences.observe("write", &key, 2), None);
        assert_eq!(fences.observe("mutex", &key, 4), None);
    }

    /// A key is remembered across at least [`MAX_KEYS`] other keys seen after it (the memory
    /// forgot every key at once when full: helper 31 saw no regression reported past 4,096
    /// keys, or after one more key when the memory happened to be full).
    #[test]
    fn a_key_is_remembered_across_max_keys_others() {
        let fences = Fences::default();
        for i in 0..MAX_KEYS - 1 {
            fences.observe("mutex", &Bytes::from(format!("before:{i}")), 1);
        }
        let key = Bytes::from_static(b"payment");
        assert_eq!(fences.observe("mutex", &key, 5), None);
        for i in 0..MAX_KEYS {
            fences.observe("mutex", &Bytes::from(format!("after:{i}")), 1);
        }
        assert_eq!(fences.observe("mutex", &key, 1), Some(5));
    }

    /// A service locking unique keys for days: the memory stays bounded.
    #[test]
    fn the_memory_of_unique_keys_stays_bounded() {
        let fences = Fences::default();
        for i in 0..3 * MAX_KEYS {
            fences.observe("mutex", &Bytes::from(format!("order:{i}")), 1);
            assert!(
                fences.remembered() <= 2 * MAX_KEYS,
                "{} keys",
                fences.remembered()
            );
        }
        assert!(fences.remembered() > 0);
    }
}
