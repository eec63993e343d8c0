//! Which deployment a client talks to, and the checks replicated deployments need: `ROLE` (is the
//! node that granted the lock still a primary, and how many replicas does it have) and `WAIT` (did
//! those replicas acknowledge the write).

use std::time::Duration;

use tokio::time::Instant;

use fred::clients::Client;
use fred::error::{Error, ErrorKind};
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::config::{Server, ServerConfig};
use fred::types::{ClusterHash, CustomCommand, Value};

use crate::redirect::{MAX_REDIRECTIONS, after_redirection, is_redirected, owner};
use crate::replicas::ReplicaHints;
use crate::scripts::{ScriptCall, is_noscript};

/// The shape of the deployment behind a [`LockClient`](crate::LockClient), from
/// [`LockClient::deployment`](crate::LockClient::deployment) (see its example).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Deployment {
    /// One server. No `ROLE`, no `WAIT`.
    Standalone,
    /// A primary with replicas, reached directly or through Sentinel.
    Replicated,
    /// A Redis/Valkey Cluster (each shard a primary, usually with replicas).
    Cluster,
}

impl Deployment {
    /// The deployment a fred server configuration describes. A plain (centralized) server is
    /// standalone unless the caller says it has replicas (see `LockClientBuilder::replicated`).
    #[must_use]
    pub fn of(server: &ServerConfig) -> Self {
        match server {
            ServerConfig::Clustered { .. } => Deployment::Cluster,
            ServerConfig::Sentinel { .. } => Deployment::Replicated,
            _ => Deployment::Standalone,
        }
    }

    /// True when lock operations must check `ROLE` (and by default `WAIT`).
    #[must_use]
    pub fn is_replicated(self) -> bool {
        self != Deployment::Standalone
    }
}

/// A node's `ROLE`: its role name and, for a primary, the replicas it lists (`ip:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Role {
    pub(crate) name: String,
    pub(crate) replicas: Vec<String>,
}

impl Role {
    pub(crate) fn is_primary(&self) -> bool {
        self.name == "master" || self.name == "primary"
    }

    /// Whether this `ROLE` lists `node` as a replica (then `node` did not answer it).
    fn lists(&self, node: Option<&Server>) -> bool {
        node.is_some_and(|node| {
            self.replicas.iter().any(|id| {
                id.rsplit_once(':').is_some_and(|(host, port)| {
                    host == &*node.host && port.parse() == Ok(node.port)
                })
            })
        })
    }
}

/// Parses a `ROLE` reply: `["master", offset, [[ip, port, offset], ...]]` on a primary.
pub(crate) fn parse_role(value: Value) -> Result<Role, Error> {
    let protocol = || Error::new(ErrorKind::Protocol, "unexpected reply to ROLE");
    let Value::Array(items) = value else {
        return Err(protocol());
    };
    let name = items
        .first()
        .and_then(Value::as_string)
        .ok_or_else(protocol)?;
    let replicas = match items.get(2) {
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, entry)| replica_id(entry).unwrap_or_else(|| format!("#{i}")))
            .collect(),
        _ => Vec::new(),
    };
    Ok(Role { name, replicas })
}

/// `ip:port` of one replica entry of a primary's `ROLE` reply (`[ip, port, offset]`).
fn replica_id(entry: &Value) -> Option<String> {
    let Value::Array(fields) = entry else {
        return None;
    };
    let ip = fields.first()?.as_string()?;
    let port = fields.get(1)?.as_string()?;
    Some(format!("{ip}:{port}"))
}

/// The outcome of a lock script run with the replicated-deployment checks.
#[derive(Debug)]
pub(crate) struct Checked {
    /// The script's reply.
    pub(crate) reply: Value,
    /// The granting node's role when the script ran.
    pub(crate) role: Role,
    /// `(acknowledged, required)` replicas, when `WAIT` was requested.
    pub(crate) acknowledged: Option<(i64, i64)>,
}

/// The primary `conn` sends `slot`'s commands to: in a cluster, per the cached routing; else
/// the node it is connected to (Sentinel: the primary it reached), so that a promoted replica's
/// replica count is not taken for the old primary's.
fn primary_of(conn: &Client, slot: u16) -> Option<Server> {
    if conn.is_clustered() {
        owner(conn, slot)
    } else {
        conn.active_connections().into_iter().next()
    }
}

fn slot_command(name: &'static str, slot: u16) -> CustomCommand {
    CustomCommand::new_static(name, ClusterHash::Custom(slot), false)
}

fn wait_millis(timeout: Duration) -> i64 {
    // WAIT 0 would block forever: always at least 1 ms.
    i64::try_from(timeout.as_millis())
        .unwrap_or(i64::MAX)
        .max(1)
}

/// Runs a script call on the primary owning its slot, in one pipeline on `conn`:
/// `ROLE, EVALSHA[, WAIT n ms, ROLE]`.
///
/// With `wait_until = Some(deadline)`, `conn` must be a dedicated connection: `WAIT` blocks it,
/// until `deadline` at most. The number of replicas to wait for is the primary's own replica
/// count from `ROLE`, never below the floor of counts seen for that node recently, and at least
/// one (see [`crate::replicas`]: a replica that just left may have been promoted). The first
/// guess of that count comes from the last `ROLE` seen for the node; when it was too low, the
/// whole pipeline runs again with the right count (the lock scripts are idempotent for their
/// token), so the write and its `WAIT` always travel together on one connection and a reconnect
/// in between cannot fake an acknowledgement. Replicas listed by the second `ROLE` but not by
/// the first joined during `WAIT`: their acknowledgements are not counted.
///
/// In a cluster, fred follows no redirection (see [`crate::redirect`]): when the script is
/// redirected it did not run, and `ROLE`/`WAIT` judged the wrong node; the whole pipeline then
/// runs again on the slot's new owner (`MOVED`), or the call fails with a transient error
/// while the slot is migrating (`ASK`). So the write, `ROLE` and `WAIT` always ran on one node.
///
/// `acknowledged` is only meaningful when the script wrote.
pub(crate) async fn run_checked(
    conn: &Client,
    hints: &ReplicaHints,
    call: &ScriptCall<'_>,
    wait_until: Option<Instant>,
) -> Result<Checked, Error> {
    let slot = call.slot;
    let mut use_source = call.source_first;
    let (mut rounds, mut redirections) = (0, 0);
    loop {
        rounds += 1;
        let node = primary_of(conn, slot);
        let guess = hints.guess(&node);
        let pipeline = conn.pipeline();
        let _: () = pipeline
            .custom(slot_command("ROLE", slot), Vec::<Value>::new())
            .await?;
        let (cmd, cmd_args) = call.command(use_source);
        let _: () = pipeline.custom(cmd, cmd_args).await?;
        if let Some(deadline) = wait_until {
            let timeout = wait_millis(deadline.saturating_duration_since(Instant::now()));
            let wait_args = vec![Value::Integer(guess), Value::Integer(timeout)];
            let _: () = pipeline
                .custom(slot_command("WAIT", slot), wait_args)
                .await?;
            let _: () = pipeline
                .custom(slot_command("ROLE", slot), Vec::<Value>::new())
                .await?;
        }
        let results = pipeline.try_all::<Value>().await;
        // fred fails the whole pipeline on a redirection; only the script's can be one.
        if results.iter().any(is_redirected) {
            redirections += 1;
            if redirections > MAX_REDIRECTIONS {
                return Err(Error::new(
                    ErrorKind::Routing,
                    "too many cluster redirections",
                ));
            }
            after_redirection(conn, slot, node.as_ref())?;
            rounds -= 1;
            continue;
        }
        let mut results = results.into_iter();
        let role = parse_role(next(&mut results)?)?;
        // Another node answered when fred's routing changed while the pipeline was in flight
        // (it refreshes it in the background, e.g. after a reconnect), or when the node that
        // answered lists `node` as its replica: its `ROLE` must not be recorded as `node`'s (a
        // primary would seem to have lost a replica, and need one more acknowledgement than it
        // can get for `REPLICA_LOSS_HOLD`). The round runs again, on fresh routing (the lock
        // scripts are idempotent for their token).
        if role.lists(node.as_ref()) || primary_of(conn, slot) != node {
            redirections += 1;
            if redirections > MAX_REDIRECTIONS {
                return Err(Error::new(
                    ErrorKind::Routing,
                    "the cluster's routing kept changing while calls were in flight",
                ));
            }
            if conn.is_clustered() {
                let _ = conn.sync_cluster().await;
            }
            rounds -= 1;
            continue;
        }
        let reply = match next(&mut results) {
            Err(error) if is_noscript(&error) && !use_source => {
                use_source = true;
                continue;
            }
            other => other?,
        };
        let required = hints.observe(node.clone(), role.is_primary(), &role.replicas);
        if wait_until.is_none() {
            return Ok(Checked {
                reply,
                role,
                acknowledged: None,
            });
        }
        let counted = next(&mut results)?.as_i64().unwrap_or(0);
        // `WAIT` also counts replicas that attached while it blocked: one of those may be on its
        // way to another primary (Sentinel can attach a node to the old primary mid-failover),
        // so what it acknowledged does not count, and its arrival is recorded like any `ROLE`.
        let after = parse_role(next(&mut results)?)?;
        let joined = after
            .replicas
            .iter()
            .filter(|id| !role.replicas.contains(id))
            .count();
        let required =
            required.max(hints.observe(node.clone(), after.is_primary(), &after.replicas));
        let acknowledged = counted.saturating_sub(i64::try_from(joined).unwrap_or(i64::MAX));
        if acknowledged < required && guess < required && rounds < 3 && role.is_primary() {
            continue;
        }
        // A node demoted while `WAIT` blocked may drop the write: judged by its later role.
        let role = if after.is_primary() { role } else { after };
        return Ok(Checked {
            reply,
            role,
            acknowledged: Some((acknowledged, required)),
        });
    }
}

fn next(results: &mut impl Iterator<Item = Result<Value, Error>>) -> Result<Value, Error> {
    results.next().unwrap_or_else(|| {
        Err(Error::new(
            ErrorKind::Protocol,
            "pipeline returned too few replies",
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A primary's `ROLE` that lists `node` as a replica was not `node`'s own answer.
    #[test]
    fn a_role_listing_the_node_is_not_the_nodes() {
        let role = Role {
            name: "master".into(),
            replicas: vec!["127.0.0.1:7001".into(), "#1".into()],
        };
        assert!(role.lists(Some(&Server::new("127.0.0.1", 7001))));
        assert!(!role.lists(Some(&Server::new("127.0.0.1", 7000))));
        assert!(!role.lists(Some(&Server::new("127.0.0.2", 7001))));
        assert!(!role.lists(None));
    }

    #[test]
    fn role_parsing() {
        let replica = |port: &str| {
            Value::Array(vec![
                Value::from("127.0.0.1"),
                Value::from(port),
                Value::from("10"),
            ])
        };
        let primary = Value::Array(vec![
            Value::from("master"),
            Value::Integer(10),
            Value::Array(vec![replica("7001"), replica("7002"), Value::Array(vec![])]),
        ]);
        let role = parse_role(primary).ok();
        assert_eq!(
            role.as_ref().map(|r| r.replicas.clone()),
            Some(vec![
                "127.0.0.1:7001".to_owned(),
                "127.0.0.1:7002".to_owned(),
                "#2".to_owned()
            ])
        );
        assert!(role.is_some_and(|r| r.is_primary()));
        let replica = Value::Array(vec![
            Value::from("slave"),
            Value::from("h"),
            Value::Integer(1),
        ]);
        assert!(parse_role(replica).is_ok_and(|r| !r.is_primary()));
    }
}
