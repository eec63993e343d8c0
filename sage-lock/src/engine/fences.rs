//! The last fencing token this client saw per key, to notice a counter that went backwards.
//!
//! The fencing counter `{ns:k}:fence` has no TTL; it only disappears when the server loses data
//! (eviction under a `maxmemory-policy` other than `noeviction`/`volatile-*`, `FLUSHALL`, a
//! restart without persistence). A token of an exclusive grant (a mutex's, a writer's, a
//! one-permit semaphore's) lower than one already seen for the key is then logged at `warn` and
//! counted (`LockStats::fence_regressions`): stores that reject stale tokens would reject the new
//! holder's writes. Grants that share (readers, a semaphore's permits) are not compared: their
//! replies come in any order.

use std::collections::HashMap;
use std::sync::Mutex;

use fred::bytes::Bytes;

/// Most keys remembered; past it, the memory starts over (detection is best effort).
const MAX_KEYS: usize = 4096;

/// Last token seen per lock key.
#[derive(Debug, Default)]
pub(crate) struct Fences(Mutex<HashMap<Bytes, u64>>);

impl Fences {
    /// Records `token` for `key`; returns the previous token when `token` is lower.
    pub(crate) fn observe(&self, key: &Bytes, token: u64) -> Option<u64> {
        let Ok(mut seen) = self.0.lock() else {
            return None;
        };
        if seen.len() >= MAX_KEYS && !seen.contains_key(key) {
            seen.clear();
        }
        let last = seen.entry(key.clone()).or_insert(token);
        if token < *last {
            let previous = *last;
            *last = token;
            return Some(previous);
        }
        *last = token;
        None
    }

    /// How many keys are remembered (at most [`MAX_KEYS`]; for tests).
    pub(crate) fn remembered(&self) -> usize {
        self.0.lock().map_or(0, |seen| seen.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_tokens_are_reported_once() {
        let fences = Fences::default();
        let key = Bytes::from_static(b"k");
        assert_eq!(fences.observe(&key, 1), None);
        assert_eq!(fences.observe(&key, 5), None);
        assert_eq!(fences.observe(&key, 2), Some(5));
        assert_eq!(fences.observe(&key, 3), None);
        assert_eq!(fences.observe(&Bytes::from_static(b"other"), 1), None);
    }

    /// A service locking unique keys for days: the memory stays bounded.
    #[test]
    fn the_memory_of_unique_keys_stays_bounded() {
        let fences = Fences::default();
        for i in 0..3 * MAX_KEYS {
            fences.observe(&Bytes::from(format!("order:{i}")), 1);
            assert!(
                fences.remembered() <= MAX_KEYS,
                "{} keys",
                fences.remembered()
            );
        }
        assert!(fences.remembered() > 0);
    }
}
