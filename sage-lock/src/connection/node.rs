//! Whether the node a client reaches can hold locks at all (not a cluster node through a plain
//! configuration, a Sentinel, or a replica): the builder asks at connect, a client made by
//! `LockClient::from_fred` on its first lock or operator call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fred::clients::Client;
use fred::types::config::ServerConfig;

/// The longest the check may hold up a first call; a server that does not answer by then is let
/// through, and the next call asks again.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// The once-per-client node check: none to do, or its outcome once a server answered, and
/// whether a check went unanswered.
pub(crate) struct NodeCheck(Option<(tokio::sync::OnceCell<Option<String>>, AtomicBool)>);

impl NodeCheck {
    /// Nothing to check: the node was checked at connect, or the client is a cluster client.
    pub(crate) fn done() -> Self {
        NodeCheck(None)
    }

    /// Checked on first use: the client's configuration names one node (or Sentinels).
    pub(crate) fn on_first_use() -> Self {
        NodeCheck(Some((tokio::sync::OnceCell::new(), AtomicBool::new(false))))
    }

    /// Why no lock can be taken through `fred` (a cluster node, a Sentinel, a replica given
    /// directly), or `None`; what the answer says about `DELIFEQ` goes to `delifeq`. After the
    /// first answer, an atomic load. After a check went unanswered, a call while `fred` is not
    /// connected is let through unchecked (it fails within its own bounds), so that only the
    /// first call waits for the check's bound, not every call of an outage.
    pub(crate) async fn refusal(
        &self,
        fred: &Client,
        replicated: bool,
        delifeq: &(dyn Fn(bool) + Sync),
    ) -> Option<String> {
        use fred::interfaces::ClientLike as _;
        let (cell, unanswered) = self.0.as_ref()?;
        if let Some(known) = cell.get() {
            return known.clone();
        }
        if unanswered.load(Ordering::Relaxed) && !fred.is_connected() {
            return None;
        }
        // Boxed: asked once, and kept out of every lock call's future.
        let refusal = Box::pin(Self::ask(cell, fred, replicated, delifeq)).await;
        unanswered.store(cell.get().is_none(), Ordering::Relaxed);
        refusal
    }

    /// Asks the node, unless a concurrent first call already did; an unanswered question is
    /// not remembered.
    async fn ask(
        cell: &tokio::sync::OnceCell<Option<String>>,
        fred: &Client,
        replicated: bool,
        delifeq: &(dyn Fn(bool) + Sync),
    ) -> Option<String> {
        let outcome = cell
            .get_or_try_init(|| async {
                wrong_node_problem(fred, "the fred client's server", replicated, CHECK_TIMEOUT)
                    .await
                    .map(|report| {
                        if let Some(present) = report.delifeq {
                            delifeq(present);
                        }
                        report.problem.map(|problem| {
                            format!(
                                "{problem} (for LockClient::from_fred: build the fred client \
                                 from that URL, or give it a ServerConfig of that kind)"
                            )
                        })
                    })
            })
            .await;
        outcome.ok().and_then(Clone::clone)
    }
}

/// The server did not answer `INFO` in time, or could not be reached.
pub(crate) struct Unanswered;

/// What the node check's `INFO` said.
pub(crate) struct NodeReport {
    /// Why no lock can be taken there, if that is so.
    pub(crate) problem: Option<String>,
    /// Whether the server has `DELIFEQ` (`None`: `INFO` refused by an ACL).
    pub(crate) delifeq: Option<bool>,
}

/// What the node check learned about the node a client reaches.
#[derive(Default)]
struct NodeFacts {
    cluster: bool,
    sentinel: bool,
    /// A replica, with its primary's address when known (`host:port`).
    replica_of: Option<Option<String>>,
    /// A primary's connected replicas.
    replicas: Option<u64>,
    /// `INFO`'s `redis_version` (Valkey reports the Redis version it is compatible with).
    version: Option<String>,
}

/// The oldest Redis sage-lock runs on: its scripts use `SET` with both `NX` and `GET`, sharded
/// pub/sub (`SPUBLISH`) and `PEXPIRETIME`, all Redis 7.0 (and every Valkey).
const MIN_REDIS_MAJOR: u64 = 7;

/// Why a server of `version` (`INFO`'s `redis_version`) cannot run sage-lock's locks, if so.
fn too_old(version: &str, target: &str) -> Option<String> {
    let major: u64 = version.split('.').next()?.trim().parse().ok()?;
    (major < MIN_REDIS_MAJOR).then(|| {
        format!(
            "{target} runs Redis {version}, and sage-lock needs Redis 7.0 or later (or Valkey): \
             its lock scripts use SET with NX and GET together, sharded pub/sub (SPUBLISH) and \
             PEXPIRETIME; upgrade the server"
        )
    })
}

impl NodeFacts {
    /// From `INFO`'s fields.
    fn from_info(info: &str) -> Self {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
        };
        let replica_of = matches!(field("role"), Some("slave" | "replica")).then(|| {
            match (field("master_host"), field("master_port")) {
                (Some(host), Some(port)) => Some(format!("{host}:{port}")),
                _ => None,
            }
        });
        NodeFacts {
            cluster: field("cluster_enabled") == Some("1"),
            sentinel: field("redis_mode") == Some("sentinel")
                || field("server_mode") == Some("sentinel"),
            replica_of,
            replicas: field("connected_slaves").and_then(|n| n.parse().ok()),
            version: field("redis_version").map(str::to_owned),
        }
    }

    /// From `ROLE` and `CLUSTER INFO`, for a user whose ACL denies `INFO` (the documented rule
    /// grants both); `None` when neither is answered.
    async fn without_info(client: &Client, timeout: Duration) -> Option<Self> {
        use fred::interfaces::ClientLike as _;
        use fred::types::{ClusterHash, CustomCommand, Value};
        let ask = |command: &'static str, args: Vec<Value>| {
            let command = CustomCommand::new_static(command, ClusterHash::Random, false);
            tokio::time::timeout(timeout, client.custom::<Value, Value>(command, args))
        };
        let role = match ask("ROLE", Vec::new()).await {
            Ok(Ok(Value::Array(items))) => Some(items),
            _ => None,
        };
        // A server without cluster support refuses `CLUSTER INFO` ("cluster support disabled").
        let cluster = match ask("CLUSTER", vec![Value::from("INFO")]).await {
            Ok(Ok(_)) => Some(true),
            Ok(Err(error)) if error.details().contains("cluster support disabled") => Some(false),
            _ => None,
        };
        if role.is_none() && cluster.is_none() {
            return None;
        }
        let role = role.unwrap_or_default();
        let text = |at: usize| role.get(at).and_then(Value::as_string);
        let name = text(0);
        // `["slave", host, port, state, offset]`, `["master", offset, [[ip, port, offset]..]]`.
        let replica_of = matches!(name.as_deref(), Some("slave" | "replica")).then(|| {
            match (text(1), text(2)) {
                (Some(host), Some(port)) => Some(format!("{host}:{port}")),
                _ => None,
            }
        });
        let replicas = match role.get(2) {
            Some(Value::Array(list)) if matches!(name.as_deref(), Some("master")) => {
                u64::try_from(list.len()).ok()
            }
            _ => None,
        };
        Some(NodeFacts {
            cluster: cluster == Some(true),
            sentinel: name.as_deref() == Some("sentinel"),
            replica_of,
            replicas,
            version: None,
        })
    }
}

/// Why no lock can be taken on the node `client` reaches through a plain configuration (or
/// the primary one Sentinel named), if that is so: a cluster node (as a standalone client it
/// would reach only that node's slots, `MOVED` for every other key, and scan one node), a
/// Sentinel (it runs no scripts) and, given directly, a replica (`READONLY` for every write).
/// A server that refuses `INFO` (an ACL without it) is asked `ROLE` and `CLUSTER INFO`
/// instead; one that refuses those too is let through with a warning. A primary with replicas
/// that the client does not treat as `replicated` is let through with a warning: its locks do
/// not wait for replica acknowledgement.
pub(crate) async fn wrong_node_problem(
    client: &Client,
    target: &str,
    replicated: bool,
    timeout: Duration,
) -> Result<NodeReport, Unanswered> {
    use fred::interfaces::ClientLike as _;
    let (facts, delifeq) = match tokio::time::timeout(timeout, client.info::<String>(None)).await {
        Ok(Ok(info)) => (
            NodeFacts::from_info(&info),
            Some(super::delifeq::has_delifeq(&info)),
        ),
        // An ACL without `INFO`: ask what the rule grants.
        Ok(Err(error)) if error.details().contains("NOPERM") => {
            let facts = match NodeFacts::without_info(client, timeout).await {
                Some(facts) => facts,
                None => {
                    tracing::warn!(
                        "the ACL denies INFO, ROLE and CLUSTER INFO, so sage-lock cannot check \
                         what {target} is (a replica or a cluster node behind a plain URL \
                         fails every lock later); grant +info (see the README's \"Security: \
                         TLS and ACL\")"
                    );
                    NodeFacts::default()
                }
            };
            (facts, None)
        }
        _ => return Err(Unanswered),
    };
    let problem = if facts.cluster {
        format!(
            "{target} is a cluster node: connect with redis-cluster://host:port (any node's \
             address; the client finds the others), or rediss-cluster:// for TLS"
        )
    } else if facts.sentinel {
        format!(
            "{target} is a Sentinel, which runs no locks: connect through it with \
             redis-sentinel://host:port?sentinelServiceName=NAME (the Sentinels' addresses; \
             they name the primary of the service NAME)"
        )
    } else if let Some(old) = facts
        .version
        .as_deref()
        .and_then(|version| too_old(version, target))
    {
        old
    } else if let Some(primary) = facts
        .replica_of
        .as_ref()
        .filter(|_| !matches!(client.client_config().server, ServerConfig::Sentinel { .. }))
    {
        let primary = primary
            .as_ref()
            .map(|primary| format!(" of {primary}"))
            .unwrap_or_default();
        format!(
            "{target} is a replica{primary}, which refuses writes: connect to the primary, or \
             through Sentinel (redis-sentinel://) to follow failovers"
        )
    } else {
        if !replicated && let Some(replicas @ 1..) = facts.replicas {
            tracing::warn!(
                replicas,
                "{target} is a primary with {replicas} replicas, but this client treats it as a \
                 single server: no lock waits for replica acknowledgement (WAIT), so a failover \
                 can lose a granted lock; declare the deployment with \
                 LockClient::builder().replicated(true), or connect through Sentinel \
                 (redis-sentinel://)"
            );
        }
        return Ok(NodeReport {
            problem: None,
            delifeq,
        });
    };
    Ok(NodeReport {
        problem: Some(problem),
        delifeq,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis 6 and older are refused at connect, naming the version and the fix; Redis 7 and
    /// Valkey (which reports `redis_version:7.2.4`) pass. (No Redis 6 server is installed here,
    /// so the refusal is tested on `INFO` text.)
    #[test]
    fn servers_older_than_redis_7_are_named() {
        let facts = NodeFacts::from_info("# Server\r\nredis_version:6.2.14\r\nrole:master\r\n");
        let problem = facts
            .version
            .as_deref()
            .and_then(|version| too_old(version, "127.0.0.1:6379"))
            .expect("Redis 6 is too old");
        assert!(
            problem.contains("Redis 6.2.14") && problem.contains("7.0 or later"),
            "{problem}"
        );
        for info in [
            "redis_version:7.0.15\r\n",
            "redis_version:7.2.4\r\nvalkey_version:9.1.2\r\n",
            "redis_version:8.0.0\r\n",
            "redis_version:unknown\r\n",
        ] {
            let facts = NodeFacts::from_info(info);
            let version = facts.version.as_deref().expect("a version");
            assert_eq!(too_old(version, "node"), None, "{info}");
        }
    }
}
