//! Taking an example's keys off a server of the user's (`SAGE_LOCK_URL`) when it ends.
//!
//! One `DEL` per key: in a cluster a `DEL` of keys in several hash slots fails with
//! `CROSSSLOT`, and the keys of one run (its data, and its locks' `{ns:key}` keys) lie in many.

use fred::clients::Client;
use fred::interfaces::KeysInterface as _;
use sage_lock::LockClient;

/// What a lock on one key may leave on the server, after its own key (`""`): the fencing
/// counter and the grant marker (kept by design, see the README's "Semantics"), and the queue
/// of waiters that an interrupted run cut off (those expire by themselves, 4 s later).
pub const LOCK_KEY_SUFFIXES: [&str; 5] = ["", ":fence", ":since", ":queue", ":waiters"];

/// Every server key a mutex on `key` in `namespace` may leave (see [`LOCK_KEY_SUFFIXES`]).
#[must_use]
pub fn lock_keys(namespace: &str, key: &str) -> Vec<Vec<u8>> {
    let lock = LockClient::server_key(namespace, key);
    LOCK_KEY_SUFFIXES
        .iter()
        .map(|suffix| [lock.as_slice(), suffix.as_bytes()].concat())
        .collect()
}

/// Deletes `keys`, one `DEL` each (so that it works in a cluster, whatever slots they are in);
/// returns how many existed.
///
/// # Errors
/// The first `DEL` that fails.
pub async fn delete_keys(
    fred: &Client,
    keys: impl IntoIterator<Item = Vec<u8>>,
) -> Result<u64, fred::error::Error> {
    let mut deleted = 0;
    for key in keys {
        let removed: u64 = fred.del(fred::bytes::Bytes::from(key)).await?;
        deleted += removed;
    }
    Ok(deleted)
}
