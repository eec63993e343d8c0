//! What Sentinel knows of the primary's replicas: the first replica-count floor of a client that
//! has not seen any `ROLE` yet (see [`crate::replicas`]).
//!
//! A client learns the floor from the `ROLE` replies it sees; a new process that first reaches the
//! primary in the middle of a failover, after the replica being promoted left it, would take the
//! smaller count at face value. Sentinel still lists that replica (until the failover ends, it is
//! a replica of the service like the others), so its count of replicas that are not down seeds
//! the floor of the first primary the client writes to. After a completed failover, Sentinel also
//! counts the demoted primary before it has rejoined: a new client then waits for it (or for
//! [`REPLICA_LOSS_HOLD`](crate::REPLICA_LOSS_HOLD)) before its writes count as acknowledged.

use std::sync::atomic::{AtomicU32, Ordering};

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::{Config, ServerConfig};
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::pool::{Link, close_in_background};
use crate::replicas::ReplicaHints;

/// How many operations ask Sentinel for the replica count before the client gives up on it.
const SEED_ATTEMPTS: u32 = 3;

/// Seeds, once per client, the replica floor of the first primary it writes to.
#[derive(Debug, Default)]
pub(crate) struct SentinelSeed {
    done: OnceCell<()>,
    failures: AtomicU32,
}

impl SentinelSeed {
    /// A seed for a client configured through Sentinel; `None` for any other client.
    pub(crate) fn for_client(fred: &Client) -> Option<SentinelSeed> {
        matches!(fred.client_config().server, ServerConfig::Sentinel { .. })
            .then(SentinelSeed::default)
    }

    /// Before the client's first replica-acknowledged write (on `conn`, a connection of
    /// `fred`'s): Sentinel's count of replicas that are up becomes the floor of the primary
    /// `conn` reaches, so a new client that arrives in the middle of a failover does not take
    /// the old primary's shrunk `ROLE` list at face value. Once per client (the next operations
    /// try again while no Sentinel answers, [`SEED_ATTEMPTS`] in all); bounded by `limit`.
    pub(crate) async fn seed(
        &self,
        fred: &Client,
        conn: &Client,
        hints: &ReplicaHints,
        limit: Instant,
    ) {
        let _ = self
            .done
            .get_or_try_init(|| async {
                let node = conn.active_connections().into_iter().next();
                let denied = match known_replicas(&fred.client_config(), limit).await {
                    Ok(count) => {
                        tracing::debug!(count, "replica floor seeded from Sentinel");
                        hints.seed(node, count);
                        return Ok(());
                    }
                    Err(denied) => denied,
                };
                tracing::debug!("no Sentinel answered; the replica floor starts from ROLE");
                if let Some(error) = denied {
                    // A missing permission does not go away by asking again: said once.
                    tracing::warn!(
                        %error,
                        "a Sentinel's ACL denies SENTINEL REPLICAS: grant +sentinel|replicas to \
                         this user on every Sentinel; until then a new client's replica-count \
                         floor starts from ROLE (see Failover under Limits in the README)"
                    );
                    return Ok(());
                }
                if self.failures.fetch_add(1, Ordering::Relaxed) + 1 >= SEED_ATTEMPTS {
                    Ok(())
                } else {
                    Err(())
                }
            })
            .await;
    }
}

/// Flags of a replica that Sentinel considers down (no valid reply for `down-after-milliseconds`).
/// Not `disconnected`: that is the Sentinel's own link, and the other Sentinels' links to the
/// replica being promoted are cut (`CLIENT KILL TYPE normal` with its `REPLICAOF NO ONE`) right
/// in the window this count is for.
const DOWN_FLAGS: [&str; 2] = ["s_down", "o_down"];

/// How many replicas of `config`'s service the first Sentinel that answers before `deadline`
/// considers up (`SENTINEL REPLICAS`); otherwise (a non-Sentinel configuration, no answer) the
/// ACL denial a Sentinel answered, if one did.
/// Each Sentinel is asked on a connection of its own (same credentials and TLS settings as the
/// data nodes, as fred uses), closed afterwards.
pub(crate) async fn known_replicas(
    config: &Config,
    deadline: Instant,
) -> Result<i64, Option<fred::error::Error>> {
    let ServerConfig::Sentinel {
        hosts,
        service_name,
        ..
    } = &config.server
    else {
        return Err(None);
    };
    let mut denied = None;
    for host in hosts {
        let mut single = config.clone();
        single.server = ServerConfig::Centralized {
            server: host.clone(),
        };
        single.database = None;
        let client = Client::new(single, None, None, None);
        let link = Link::new(Some(client.connect()));
        let asked = tokio::time::timeout_at(deadline, async {
            client.wait_for_connect().await?;
            client
                .custom::<Value, Value>(
                    CustomCommand::new_static("SENTINEL", ClusterHash::FirstKey, false),
                    vec![Value::from("REPLICAS"), Value::from(service_name.as_str())],
                )
                .await
        })
        .await;
        close_in_background(client, link);
        match asked {
            Ok(Ok(reply)) => {
                if let Some(count) = count_up(reply) {
                    return Ok(count);
                }
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, "a Sentinel did not list the replicas");
                if error.details().contains("NOPERM") {
                    denied = Some(error);
                }
            }
            Err(_) => return Err(denied),
        }
    }
    Err(denied)
}

/// Counts the replicas in a `SENTINEL REPLICAS` reply (RESP2 flat key/value arrays or RESP3
/// maps) whose `flags` name none of [`DOWN_FLAGS`].
fn count_up(reply: Value) -> Option<i64> {
    let Value::Array(replicas) = reply else {
        return None;
    };
    let up = replicas
        .into_iter()
        .filter(|replica| {
            flags(replica).is_some_and(|flags| {
                !flags
                    .split(',')
                    .any(|flag| DOWN_FLAGS.contains(&flag.trim()))
            })
        })
        .count();
    i64::try_from(up).ok()
}

fn flags(replica: &Value) -> Option<String> {
    match replica {
        Value::Array(fields) => fields
            .chunks(2)
            .find(|pair| pair.first().and_then(Value::as_str).as_deref() == Some("flags"))
            .and_then(|pair| pair.get(1))
            .and_then(Value::as_string),
        Value::Map(map) => map
            .clone()
            .inner()
            .into_iter()
            .find(|(key, _)| key.as_str() == Some("flags"))
            .and_then(|(_, value)| value.as_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(flags: &str) -> Value {
        Value::Array(vec![
            Value::from("name"),
            Value::from("127.0.0.1:7001"),
            Value::from("flags"),
            Value::from(flags),
        ])
    }

    #[test]
    fn counts_replicas_that_are_not_down() {
        let reply = Value::Array(vec![
            replica("slave"),
            replica("s_down,slave"),
            replica("slave,o_down"),
            replica("slave,disconnected"),
            replica("slave,promoted"),
        ]);
        assert_eq!(count_up(reply), Some(3));
        assert_eq!(count_up(Value::Array(Vec::new())), Some(0));
        assert_eq!(count_up(Value::from("unexpected")), None);
    }

    /// On RESP3 a Sentinel lists each replica as a map (seen from Redis 7's Sentinel:
    /// `Array([Map({"name": .., "flags": "slave", ..}), ..])`).
    #[test]
    fn counts_replicas_listed_as_resp3_maps() {
        let replica = |flags: &str| {
            let mut map = fred::types::Map::new();
            map.insert("name".into(), Value::from("127.0.0.1:7001"));
            map.insert("flags".into(), Value::from(flags));
            Value::Map(map)
        };
        let reply = Value::Array(vec![
            replica("slave"),
            replica("s_down,slave"),
            replica("slave,disconnected"),
        ]);
        assert_eq!(count_up(reply), Some(2));
    }
}
