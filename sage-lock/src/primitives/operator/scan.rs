//! [`Locks::scan`]: `SCAN` on every primary, each sent to the node by its address, in a pass
//! that counts only when no slot moved around it (see [`super::layout`]).

use std::collections::BTreeMap;
use std::time::Duration;

use fred::bytes::Bytes;
use fred::error::{Error, ErrorKind};
use fred::interfaces::{ClientLike as _, ClusterInterface as _};
use fred::types::config::{Options, Server};
use fred::types::{ClusterHash, CustomCommand, Value};

use tokio::time::Instant;

use super::layout::{Layout, describe};
use super::retrying::{bounded, retrying, transient};
use super::{HeldLock, Inspected, not_a_mutex_text, protocol};
use crate::connection::OpError;
use crate::error::LockError;
use crate::key::{LockKeys, decode_lock_key, printable, scan_pattern};
use crate::primitives::mutex::Locks;

/// How many keys one `SCAN` call asks for.
const SCAN_COUNT: i64 = 1000;

/// How long `scan` waits before it looks again at a slot in flux.
const SETTLE_PAUSE: Duration = Duration::from_millis(50);

impl<K: ?Sized> Locks<K> {
    /// Every lock held in this family's namespace now, sorted by key: `SCAN` with a `MATCH` on
    /// the namespace on every primary, then one read per lock. In a cluster each pass reads the
    /// primaries from a routing refreshed for it (`CLUSTER SLOTS`) and scans each once, by its
    /// address; a pass counts only when no primary marked a slot migrating or importing before
    /// it and each primary's slots (`CLUSTER NODES`) are the same after it, so a lock whose slot
    /// moves is never left out (nor listed twice). Otherwise the scan waits and passes again,
    /// for at most the command timeout, then fails naming the slots. Locks taken or released
    /// during the scan may or may not be listed. A lock's key that holds another type (set by
    /// hand) is not listed, and a warning names it.
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
    ///   [`LockClient::quit`](crate::LockClient::quit). Brief server errors (`TRYAGAIN`) are
    ///   retried within the command timeout; a failure that outlasts it may be transient (kind
    ///   `Timeout`), and a later call may succeed.
    /// - [`LockError::Backend`] (kind `Cluster`): a slot was migrating (or moved) around every
    ///   pass for the command timeout; the error names the slots and the primaries marking them.
    ///   A later call succeeds once the migration ends (a stuck one needs `CLUSTER SETSLOT`).
    pub async fn scan(&self) -> Result<Vec<HeldLock>, LockError> {
        let namespace = &self.settings.namespace;
        let context = || format!("could not scan the locks of namespace {namespace}");
        if let Err(error) = self.engine.conn.ensure_open() {
            return Err(self.backend(context(), error));
        }
        self.engine.refuse_wrong_node().await?;
        // From the first pass that met a slot in flux: when, and until when to wait.
        let mut unsettled_since: Option<(Instant, Instant)> = None;
        let mut passes = 0_u32;
        loop {
            let nodes = self
                .primaries()
                .await
                .map_err(|error| self.failed(context(), error))?;
            let before = self.layout(&nodes).await?;
            let moving = before.as_ref().map(Layout::moving).unwrap_or_default();
            let unsettled = if moving.is_empty() {
                let found = self.scan_pass(&nodes).await?;
                let after = self.layout(&nodes).await?;
                let changes = match (&before, &after) {
                    (Some(before), Some(after)) => before.changes(after),
                    _ => BTreeMap::new(),
                };
                if changes.is_empty() {
                    return Ok(found.into_values().collect());
                }
                changes
            } else {
                moving
            };
            passes += 1;
            let now = Instant::now();
            let (since, until) = *unsettled_since.get_or_insert_with(|| (now, self.deadline()));
            if now >= until {
                let text = format!(
                    "slots were migrating around every pass for {:.1} s ({passes} tries; the \
                     command timeout bounds the wait): {}; a listing taken meanwhile could leave \
                     out the locks that move. Try again once the migration ends, or end a stuck \
                     one (CLUSTER SETSLOT <slot> NODE <id> on every primary, or STABLE)",
                    now.duration_since(since).as_secs_f64(),
                    describe(&unsettled),
                );
                return Err(self.backend(context(), Error::new(ErrorKind::Cluster, text)));
            }
            tokio::time::sleep_until((now + SETTLE_PAUSE).min(until)).await;
        }
    }

    /// One pass: every lock held on `nodes`, by key (a key listed by two nodes once).
    async fn scan_pass(
        &self,
        nodes: &[Option<Server>],
    ) -> Result<BTreeMap<Vec<u8>, HeldLock>, LockError> {
        let mut found: BTreeMap<Vec<u8>, HeldLock> = BTreeMap::new();
        for node in nodes {
            self.scan_node(node.as_ref(), &mut found).await?;
        }
        Ok(found)
    }

    /// Each of `nodes`' own word on its slots (`CLUSTER NODES`); `None` outside a cluster.
    async fn layout(&self, nodes: &[Option<Server>]) -> Result<Option<Layout>, LockError> {
        let namespace = &self.settings.namespace;
        let mut layout = Layout::default();
        for node in nodes {
            let Some(node) = node else {
                return Ok(None);
            };
            let context = || {
                format!(
                    "could not scan the locks of namespace {namespace}: no slot layout from \
                     {node} (CLUSTER NODES)"
                )
            };
            let reply = self
                .on_node(Some(node), "CLUSTER", &[Value::from("NODES")])
                .await
                .map_err(|error| self.failed(context(), error))?;
            let text = reply
                .as_bytes()
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
                .or_else(|| reply.as_string());
            text.and_then(|text| layout.add(node.to_string(), &text))
                .ok_or_else(|| self.backend(context(), protocol("CLUSTER NODES")))?;
        }
        Ok(Some(layout))
    }

    /// `command args` sent to `node` (the one server when `None`) whatever the keys' hash,
    /// retried after a transient failure within the command timeout.
    async fn on_node(
        &self,
        node: Option<&Server>,
        command: &'static str,
        args: &[Value],
    ) -> Result<Value, OpError> {
        let fred = self.engine.conn.fred();
        let options = Options {
            cluster_node: node.cloned(),
            ..Default::default()
        };
        let deadline = self.deadline();
        let options = &options;
        retrying(deadline, transient, move || {
            // Sent to `node` whatever the hash says (`cluster_node` comes first).
            let command = CustomCommand::new_static(command, ClusterHash::Random, false);
            let args = args.to_vec();
            async move {
                let routed = fred.with_options(options);
                let reply = routed.custom::<Value, Value>(command, args);
                bounded(deadline, reply).await
            }
        })
        .await
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
        let pattern = Value::Bytes(Bytes::from(scan_pattern(namespace)));
        let mut cursor = Bytes::from_static(b"0");
        loop {
            let args = [
                Value::Bytes(cursor.clone()),
                Value::from("MATCH"),
                pattern.clone(),
                Value::from("COUNT"),
                Value::Integer(SCAN_COUNT),
            ];
            let reply = self
                .on_node(node, "SCAN", &args)
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
