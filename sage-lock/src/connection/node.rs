//! Whether the node a client reaches can hold locks at all (not a cluster node through a plain
//! configuration, a Sentinel, or a replica): the builder asks at connect, a client made by
//! `LockClient::from_fred` on its first lock or operator call.

use std::time::Duration;

use fred::clients::Client;
use fred::types::config::ServerConfig;

/// The longest the check may hold up a first call; a server that does not answer by then is let
/// through, and the next call asks again.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// The once-per-client node check: none to do, or its outcome once a server answered.
pub(crate) struct NodeCheck(Option<tokio::sync::OnceCell<Option<String>>>);

impl NodeCheck {
    /// Nothing to check: the node was checked at connect, or the client is a cluster client.
    pub(crate) fn done() -> Self {
        NodeCheck(None)
    }

    /// Checked on first use: the client's configuration names one node (or Sentinels).
    pub(crate) fn on_first_use() -> Self {
        NodeCheck(Some(tokio::sync::OnceCell::new()))
    }

    /// Why no lock can be taken through `fred` (a cluster node, a Sentinel, a replica given
    /// directly), or `None`; what the answer says about `DELIFEQ` goes to `delifeq`. After the
    /// first answer, an atomic load.
    pub(crate) async fn refusal(
        &self,
        fred: &Client,
        replicated: bool,
        delifeq: &(dyn Fn(bool) + Sync),
    ) -> Option<String> {
        let cell = self.0.as_ref()?;
        if let Some(known) = cell.get() {
            return known.clone();
        }
        // Boxed: asked once, and kept out of every lock call's future.
        Box::pin(Self::ask(cell, fred, replicated, delifeq)).await
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

/// Why no lock can be taken on the node `client` reaches through a plain configuration (or
/// the primary one Sentinel named), if that is so: a cluster node (as a standalone client it
/// would reach only that node's slots, `MOVED` for every other key, and scan one node), a
/// Sentinel (it runs no scripts) and, given directly, a replica (`READONLY` for every write).
/// A server that refuses `INFO` (an ACL without it) is let through. A primary with replicas
/// that the client does not treat as `replicated` is let through with a warning: its locks do
/// not wait for replica acknowledgement.
pub(crate) async fn wrong_node_problem(
    client: &Client,
    target: &str,
    replicated: bool,
    timeout: Duration,
) -> Result<NodeReport, Unanswered> {
    use fred::interfaces::ClientLike as _;
    let info = match tokio::time::timeout(timeout, client.info::<String>(None)).await {
        Ok(Ok(info)) => info,
        // An ACL without `INFO`: answered, and nothing to learn.
        Ok(Err(error)) if error.details().contains("NOPERM") => {
            return Ok(NodeReport {
                problem: None,
                delifeq: None,
            });
        }
        _ => return Err(Unanswered),
    };
    let delifeq = Some(super::delifeq::has_delifeq(&info));
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
    };
    let problem = if field("cluster_enabled") == Some("1") {
        format!(
            "{target} is a cluster node: connect with redis-cluster://host:port (any node's \
             address; the client finds the others), or rediss-cluster:// for TLS"
        )
    } else if field("redis_mode") == Some("sentinel") || field("server_mode") == Some("sentinel") {
        format!(
            "{target} is a Sentinel, which runs no locks: connect through it with \
             redis-sentinel://host:port?sentinelServiceName=NAME (the Sentinels' addresses; \
             they name the primary of the service NAME)"
        )
    } else if matches!(field("role"), Some("slave" | "replica"))
        && !matches!(client.client_config().server, ServerConfig::Sentinel { .. })
    {
        let primary = match (field("master_host"), field("master_port")) {
            (Some(host), Some(port)) => format!(" of {host}:{port}"),
            _ => String::new(),
        };
        format!(
            "{target} is a replica{primary}, which refuses writes: connect to the primary, or \
             through Sentinel (redis-sentinel://) to follow failovers"
        )
    } else {
        let replicas = field("connected_slaves").and_then(|n| n.parse::<u64>().ok());
        if !replicated && let Some(replicas @ 1..) = replicas {
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
