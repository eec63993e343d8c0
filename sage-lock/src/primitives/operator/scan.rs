//! [`Locks::scan`]: `SCAN` on every primary, each sent to the node by its address.

use std::collections::BTreeMap;

use fred::bytes::Bytes;
use fred::error::{Error, ErrorKind};
use fred::interfaces::{ClientLike as _, ClusterInterface as _};
use fred::types::config::{Options, Server};
use fred::types::{ClusterHash, CustomCommand, Value};

use super::retrying::{bounded, retrying, transient};
use super::{HeldLock, Inspected, not_a_mutex_text, protocol};
use crate::connection::OpError;
use crate::error::LockError;
use crate::key::{LockKeys, decode_lock_key, printable, scan_pattern};
use crate::primitives::mutex::Locks;

/// How many keys one `SCAN` call asks for.
const SCAN_COUNT: i64 = 1000;

impl<K: ?Sized> Locks<K> {
    /// Every lock held in this family's namespace now, sorted by key: `SCAN` with a `MATCH` on
    /// the namespace on every primary, then one read per lock. In a cluster the primaries are
    /// read once per scan from a routing refreshed for it (`CLUSTER SLOTS`), and each is scanned
    /// exactly once, by its address, whichever slots move meanwhile; a key that moves during the
    /// scan is listed once. Locks taken or released (or moved) during the scan may or may not
    /// be listed. A lock's key that holds another type (set by hand) is not listed, and a
    /// warning names it.
    ///
    /// ```no_run
    /// # async fn demo(locks: sage_lock::Locks<str>) -> Result<(), sage_lock::LockError> {
    /// for held in locks.scan().await? {
    ///     println!("{} token {} left {:?}", held.key, held.holder.fencing_token, held.holder.remaining);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// - [`LockError::InvalidArgument`] (argument `from_fred`): the node of a
    ///   [`from_fred`](crate::LockClient::from_fred) client cannot hold locks.
    /// - [`LockError::Backend`]: the server cannot answer in time, the connection is down, the
    ///   call is outside a Tokio runtime, or the client was closed by
    ///   [`LockClient::quit`](crate::LockClient::quit). Brief server errors (a slot being
    ///   migrated, `TRYAGAIN`) are retried within the command timeout; a failure that outlasts
    ///   it may be transient (kind `Timeout`), and a later call may succeed.
    pub async fn scan(&self) -> Result<Vec<HeldLock>, LockError> {
        let namespace = &self.settings.namespace;
        let context = || format!("could not scan the locks of namespace {namespace}");
        if let Err(error) = self.engine.conn.ensure_open() {
            return Err(self.backend(context(), error));
        }
        self.engine.refuse_wrong_node().await?;
        let nodes = self
            .primaries()
            .await
            .map_err(|error| self.failed(context(), error))?;
        let mut found: BTreeMap<Vec<u8>, HeldLock> = BTreeMap::new();
        for node in &nodes {
            self.scan_node(node.as_ref(), &mut found).await?;
        }
        Ok(found.into_values().collect())
    }

    /// The nodes to `SCAN`: outside a cluster the one server (`None`); in a cluster every
    /// primary of fred's routing, refreshed now.
    async fn primaries(&self) -> Result<Vec<Option<Server>>, OpError> {
        let fred = self.engine.conn.fred();
        if !fred.is_clustered() {
            return Ok(vec![None]);
        }
        let deadline = self.deadline();
        retrying(deadline, transient, move || async move {
            bounded(deadline, fred.sync_cluster()).await?;
            match fred.cached_cluster_state() {
                Some(routing) => Ok(routing
                    .unique_primary_nodes()
                    .into_iter()
                    .map(Some)
                    .collect()),
                None => Err(OpError::Failed(Error::new(
                    ErrorKind::Cluster,
                    "no cluster routing after a refresh",
                ))),
            }
        })
        .await
    }

    /// `SCAN`s `node` (the one server when `None`) to its end, adding the held locks it lists
    /// to `found`.
    async fn scan_node(
        &self,
        node: Option<&Server>,
        found: &mut BTreeMap<Vec<u8>, HeldLock>,
    ) -> Result<(), LockError> {
        let namespace = &self.settings.namespace;
        let context = || match node {
            Some(node) => format!("could not scan the locks of namespace {namespace} on {node}"),
            None => format!("could not scan the locks of namespace {namespace}"),
        };
        let fred = self.engine.conn.fred();
        let options = Options {
            cluster_node: node.cloned(),
            ..Default::default()
        };
        let pattern = Value::Bytes(Bytes::from(scan_pattern(namespace)));
        let mut cursor = Bytes::from_static(b"0");
        loop {
            let deadline = self.deadline();
            let (options, pattern, page_cursor) = (&options, &pattern, &cursor);
            let reply = retrying(deadline, transient, move || {
                // Sent to `node` whatever the hash says (`cluster_node` comes first).
                let command = CustomCommand::new_static("SCAN", ClusterHash::Random, false);
                let args = vec![
                    Value::Bytes(page_cursor.clone()),
                    Value::from("MATCH"),
                    pattern.clone(),
                    Value::from("COUNT"),
                    Value::Integer(SCAN_COUNT),
                ];
                async move {
                    let routed = fred.with_options(options);
                    let page = routed.custom::<Value, Value>(command, args);
                    bounded(deadline, page).await
                }
            })
            .await
            .map_err(|error| self.failed(context(), error))?;
            let (next, server_keys) =
                parse_scan(reply).ok_or_else(|| self.backend(context(), protocol("SCAN")))?;
            for server_key in server_keys {
                let Some(key) = decode_lock_key(namespace, &server_key) else {
                    continue;
                };
                if found.contains_key(&key) {
                    // Listed by another node too (moved during the scan).
                    continue;
                }
                let keys = LockKeys::new(namespace, &key);
                match self.inspect(&keys).await? {
                    Inspected::Held(holder) => {
                        let held = HeldLock {
                            key: printable(&key),
                            key_bytes: key.clone(),
                            holder,
                        };
                        found.insert(key, held);
                    }
                    Inspected::Other(kind) => {
                        let why = not_a_mutex_text(&keys, &kind);
                        tracing::warn!("scan skipped a key: {why}");
                    }
                    Inspected::Free => {}
                }
            }
            if next == b"0" {
                return Ok(());
            }
            cursor = Bytes::from(next);
        }
    }
}

/// `SCAN`'s `[cursor, [key, ...]]`.
fn parse_scan(reply: Value) -> Option<(Vec<u8>, Vec<Vec<u8>>)> {
    let Value::Array(mut items) = reply else {
        return None;
    };
    if items.len() != 2 {
        return None;
    }
    let keys = items.pop()?;
    let cursor = items.pop()?.as_bytes()?.to_vec();
    let Value::Array(keys) = keys else {
        return None;
    };
    let keys = keys
        .into_iter()
        .map(|key| key.as_bytes().map(<[u8]>::to_vec))
        .collect::<Option<Vec<_>>>()?;
    Some((cursor, keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_replies() {
        let reply = Value::Array(vec![
            Value::from("17"),
            Value::Array(vec![Value::from("{lock:a}"), Value::from("{lock:b}")]),
        ]);
        let (cursor, keys) = parse_scan(reply).expect("parsed");
        assert_eq!(cursor, b"17");
        assert_eq!(keys, vec![b"{lock:a}".to_vec(), b"{lock:b}".to_vec()]);
        assert!(parse_scan(Value::Null).is_none());
    }
}
