//! Taking an example's keys off a server of the user's (`SAGE_LOCK_URL`) when it ends.
//!
//! One `DEL` per key: in a cluster a `DEL` of keys in several hash slots fails with
//! `CROSSSLOT`, and the keys of one run (its data, and its locks' `{ns:key}` keys) lie in many.

use fred::clients::Client;
use fred::interfaces::{ClientLike as _, KeysInterface as _};
use fred::types::{ClusterHash, CustomCommand, Value};
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

/// Deletes every key matching `pattern` (a `SCAN ... MATCH` glob) on a standalone server or a
/// primary-with-replicas deployment's primary, one `DEL` each; returns how many it deleted.
///
/// # Errors
/// A failed `SCAN` or `DEL`; `InvalidArgument` for a cluster client (whose keys are spread over
/// several primaries that one `SCAN` does not see).
pub async fn delete_matching(fred: &Client, pattern: &str) -> Result<u64, fred::error::Error> {
    if fred.is_clustered() {
        return Err(fred::error::Error::new(
            fred::error::ErrorKind::InvalidArgument,
            "deleting keys by pattern is not supported on a cluster",
        ));
    }
    let mut cursor = String::from("0");
    let mut deleted = 0;
    loop {
        let command = CustomCommand::new_static("SCAN", ClusterHash::FirstKey, false);
        let reply: Value = fred
            .custom(
                command,
                vec![
                    cursor.clone(),
                    "MATCH".into(),
                    pattern.into(),
                    "COUNT".into(),
                    "1000".into(),
                ],
            )
            .await?;
        let (next, keys) = match reply {
            Value::Array(mut parts) if parts.len() == 2 => {
                let keys = parts.pop().unwrap_or(Value::Null);
                let next = parts.pop().unwrap_or(Value::Null);
                (next, keys)
            }
            other => {
                return Err(fred::error::Error::new(
                    fred::error::ErrorKind::Protocol,
                    format!("unexpected SCAN reply {other:?}"),
                ));
            }
        };
        let keys: Vec<Vec<u8>> = match keys {
            Value::Array(keys) => keys
                .into_iter()
                .filter_map(|key| key.as_bytes().map(<[u8]>::to_vec))
                .collect(),
            _ => Vec::new(),
        };
        deleted += delete_keys(fred, keys).await?;
        cursor = next.as_string().unwrap_or_else(|| "0".to_owned());
        if cursor == "0" {
            return Ok(deleted);
        }
    }
}
