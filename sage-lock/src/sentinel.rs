//! What the Sentinels say, asked by this library rather than through fred: the primary's address,
//! for new dedicated connections ([`PrimaryRoute`]) and a first connection
//! ([`answering_sentinel_first`]), every Sentinel asked at once so that a frozen one delays
//! nothing; and the primary's replicas: the first replica-count floor of a client that has not
//! seen any `ROLE` yet (see [`crate::replicas`]).
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
use fred::types::config::{Config, Server, ServerConfig};
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
/// ACL denial a Sentinel answered, if one did. Every Sentinel is asked at once
/// ([`ask_each`]): a frozen one delays no other's answer.
pub(crate) async fn known_replicas(
    config: &Config,
    deadline: Instant,
) -> Result<i64, Option<fred::error::Error>> {
    let ServerConfig::Sentinel { service_name, .. } = &config.server else {
        return Err(None);
    };
    let args = vec![Value::from("REPLICAS"), Value::from(service_name.as_str())];
    let Some(mut replies) = ask_each(config, args, deadline) else {
        return Err(None);
    };
    let mut denied = None;
    while let Ok(Some((_, reply))) = tokio::time::timeout_at(deadline, replies.recv()).await {
        match reply {
            Ok(reply) => {
                if let Some(count) = count_up(reply) {
                    return Ok(count);
                }
            }
            Err(error) => {
                tracing::debug!(%error, "a Sentinel did not list the replicas");
                if error.details().contains("NOPERM") {
                    denied = Some(error);
                }
            }
        }
    }
    Err(denied)
}

/// The primary of `config`'s service per the first Sentinel that names one before `deadline`
/// (`SENTINEL GET-MASTER-ADDR-BY-NAME`, every Sentinel asked at once, see [`ask_each`]); `None`
/// for a non-Sentinel configuration, or when none did.
pub(crate) async fn primary_per_sentinels(config: &Config, deadline: Instant) -> Option<Server> {
    let ServerConfig::Sentinel { service_name, .. } = &config.server else {
        return None;
    };
    let args = vec![
        Value::from("GET-MASTER-ADDR-BY-NAME"),
        Value::from(service_name.as_str()),
    ];
    let mut replies = ask_each(config, args, deadline)?;
    while let Ok(Some((_, reply))) = tokio::time::timeout_at(deadline, replies.recv()).await {
        match reply.map(address) {
            Ok(Some(primary)) => return Some(primary),
            Ok(None) => tracing::debug!("a Sentinel named no primary"),
            Err(error) => tracing::debug!(%error, "a Sentinel did not name the primary"),
        }
    }
    None
}

/// `config` (a Sentinel configuration) with the Sentinel that first names the primary before
/// `deadline` ([`primary_per_sentinels`]' question) moved to the front of its list, where fred
/// starts. fred asks the Sentinels one after the other, and one that accepts the connection but
/// does not answer (a frozen process) costs it the command timeout (its `AUTH`, with
/// credentials) or ends the attempt (without, its `GET-MASTER-ADDR-BY-NAME` times out, and fred
/// tries no other Sentinel): a client whose first Sentinel was frozen connected after 5 s, or
/// not at all (audit 41). Unchanged when none answers in time.
pub(crate) async fn answering_sentinel_first(config: &mut Config, deadline: Instant) {
    let ServerConfig::Sentinel {
        hosts,
        service_name,
        ..
    } = &config.server
    else {
        return;
    };
    if hosts.len() < 2 {
        return;
    }
    let args = vec![
        Value::from("GET-MASTER-ADDR-BY-NAME"),
        Value::from(service_name.as_str()),
    ];
    let Some(mut replies) = ask_each(config, args, deadline) else {
        return;
    };
    let mut answering = None;
    while let Ok(Some((sentinel, reply))) = tokio::time::timeout_at(deadline, replies.recv()).await
    {
        if reply.ok().and_then(address).is_some() {
            answering = Some(sentinel);
            break;
        }
    }
    if let (Some(sentinel), ServerConfig::Sentinel { hosts, .. }) = (answering, &mut config.server)
        && let Some(at) = hosts.iter().position(|host| *host == sentinel)
        && at > 0
    {
        tracing::debug!(%sentinel, "asking the Sentinel that answered first first");
        let first = hosts.remove(at);
        hosts.insert(0, first);
    }
}

/// The address in a `SENTINEL GET-MASTER-ADDR-BY-NAME` reply (`[host, port]`; nil when the
/// Sentinel knows no such service).
fn address(reply: Value) -> Option<Server> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let host = parts.first()?.as_string()?;
    let port = parts.get(1)?.as_string()?.parse::<u16>().ok()?;
    Some(Server::new(host, port))
}

type Reply = Result<Value, fred::error::Error>;

/// `SENTINEL args..` to every Sentinel of `config` at once, each on a connection of its own
/// (same credentials and TLS settings as the data nodes, as fred uses; closed afterwards) and
/// bounded by `deadline`: each reply or error with the Sentinel that gave it, in the order they
/// come, the channel closed once all came. A frozen or dead Sentinel delays no other's answer.
/// `None` for a non-Sentinel configuration.
fn ask_each(
    config: &Config,
    args: Vec<Value>,
    deadline: Instant,
) -> Option<tokio::sync::mpsc::UnboundedReceiver<(Server, Reply)>> {
    let ServerConfig::Sentinel { hosts, .. } = &config.server else {
        return None;
    };
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    for host in hosts {
        let mut single = config.clone();
        single.server = ServerConfig::Centralized {
            server: host.clone(),
        };
        single.database = None;
        let (sender, args, host) = (sender.clone(), args.clone(), host.clone());
        tokio::spawn(async move {
            let client = Client::new(single, None, None, None);
            let link = Link::new(Some(client.connect()));
            let asked = tokio::time::timeout_at(deadline, async {
                client.wait_for_connect().await?;
                client
                    .custom::<Value, Value>(
                        CustomCommand::new_static("SENTINEL", ClusterHash::FirstKey, false),
                        args,
                    )
                    .await
            })
            .await
            .unwrap_or_else(|_| {
                Err(fred::error::Error::new(
                    fred::error::ErrorKind::Timeout,
                    format!("the Sentinel at {host} did not answer in time"),
                ))
            });
            close_in_background(client, link);
            let _ = sender.send((host, asked));
        });
    }
    Some(receiver)
}

/// Where a pool's new dedicated connections go on a Sentinel deployment: straight to the
/// primary the client knows (the one Sentinel named last, else the shared connection's), with
/// the client's credentials and TLS settings, and not through fred's Sentinel resolution (see
/// [`answering_sentinel_first`]: a frozen Sentinel costs it the command timeout, or the
/// connection): with one frozen Sentinel asked first, every new connection missed its caller's
/// deadline, and every replica-acknowledged call failed (audit 41).
///
/// After a failed call or connect ([`PrimaryRoute::suspect`]: a failover may be under way),
/// the next connection asks every Sentinel at once ([`primary_per_sentinels`]) and goes where
/// the first answer says; when none answers in time (half of what is left, as a known address
/// remains to fall back to), to the last address known. A stale address cannot grant a lock:
/// a new connection straight to an address known from before asks `ROLE` first (as fred does
/// after asking a Sentinel) and, on a replica, is opened again where the Sentinels say; and
/// every replica-acknowledged call checks `ROLE` in its pipeline (see
/// [`crate::topology::run_checked`]): a node that is not the primary fails it as such and makes
/// this route suspect. Only new connections pay for this: a reused one, and the uncontended
/// path of a call, send nothing more.
#[derive(Debug)]
pub(crate) struct PrimaryRoute {
    known: std::sync::Mutex<Known>,
    /// The shared client's reconnection policy as the pool was made (fred counts a policy's
    /// attempts in it, and resets them only on a successful connection).
    policy: Option<fred::types::config::ReconnectPolicy>,
}

#[derive(Debug, Default)]
struct Known {
    /// The primary Sentinel named last.
    primary: Option<Server>,
    /// Set by [`PrimaryRoute::suspect`], cleared when a Sentinel names the primary.
    suspect: bool,
}

impl PrimaryRoute {
    /// A route for a pool of `fred`'s when it is configured through Sentinel; `None` otherwise.
    pub(crate) fn for_client(fred: &Client) -> Option<PrimaryRoute> {
        matches!(fred.client_config().server, ServerConfig::Sentinel { .. }).then(|| PrimaryRoute {
            known: std::sync::Mutex::default(),
            policy: fred.client_reconnect_policy(),
        })
    }

    /// Whether [`PrimaryRoute::suspect`] was called since a Sentinel last named the primary.
    pub(crate) fn is_suspect(&self) -> bool {
        self.known.lock().map_or(true, |known| known.suspect)
    }

    /// The primary may have changed: the next connection asks the Sentinels first.
    pub(crate) fn suspect(&self) {
        if let Ok(mut known) = self.known.lock() {
            known.suspect = true;
        }
    }

    /// Where the next dedicated connection of `template`'s (the shared client) goes, asking
    /// the Sentinels before `deadline` when the address known is suspect (or none is); `None`
    /// when no address is known and no Sentinel answered.
    pub(crate) async fn primary(&self, template: &Client, deadline: Instant) -> Option<Server> {
        let (cached, suspect) = self
            .known
            .lock()
            .map(|known| (known.primary.clone(), known.suspect))
            .unwrap_or_default();
        let known = cached.or_else(|| {
            template
                .is_connected()
                .then(|| template.active_connections().into_iter().next())
                .flatten()
        });
        if let (Some(known), false) = (&known, suspect) {
            return Some(known.clone());
        }
        let bound = if known.is_some() {
            Instant::now() + crate::retry::remaining(deadline) / 2
        } else {
            deadline
        };
        match primary_per_sentinels(&template.client_config(), bound).await {
            Some(primary) => {
                if let Ok(mut known) = self.known.lock() {
                    *known = Known {
                        primary: Some(primary.clone()),
                        suspect: false,
                    };
                }
                Some(primary)
            }
            None => known,
        }
    }

    /// A new client for a connection straight to `primary`, configured as `template` is.
    pub(crate) fn client(&self, template: &Client, primary: Server) -> Client {
        let mut config = template.client_config();
        config.server = ServerConfig::Centralized { server: primary };
        Client::new(
            config,
            Some(template.perf_config()),
            Some(template.connection_config().clone()),
            self.policy.clone(),
        )
    }
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
