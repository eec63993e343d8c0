//! A first connection that failed: whether it is worth trying again (a primary down before the
//! cluster or the Sentinels fail it over; a cluster state not ok yet), and the error that names
//! why it failed.

use std::time::Duration;

use fred::error::Error;
use fred::types::config::{Config, ServerConfig};
use tokio::time::Instant;

use super::sentinel_probe;
use crate::error::LockError;
use crate::topology::Deployment;

/// How long a cluster connect refused by one of its nodes waits before trying again.
pub(super) const RETRY_AFTER: Duration = Duration::from_millis(250);

/// The hint of a refused connection to a cluster: the client connects to every primary the
/// cluster lists, so the refusing node need not be one of the URL's addresses.
const CLUSTER_NODE_REFUSED: &str = "a cluster node refused the connection: the client connects \
     to every primary the cluster lists (CLUSTER SLOTS), not only to the URL's addresses, so a \
     primary that is down fails the connect until the cluster fails it over \
     (cluster-node-timeout; the connect tries again until its connect timeout while one of the \
     URL's addresses accepts connections); check CLUSTER NODES on a running node for a failed \
     primary, and that the URL's addresses are the nodes' (host and port)";

/// Why a failed first connection is worth trying again before `deadline`, if it is: one of
/// the URL's addresses (cluster nodes, or Sentinels) accepts connections, so the deployment is
/// there, and it is not whole yet. In a cluster a node refused the connection (a primary the
/// cluster lists is down, and the cluster may yet fail it over) or the node answered without a
/// usable slot map (the cluster's state is not ok: failing over, or being set up); through
/// Sentinel the primary the Sentinels named refused it (down, and the Sentinels may yet fail it
/// over). `None` for a single server and other failures, and when no address accepts
/// connections (a wrong URL fails at once).
pub(super) async fn not_whole_yet(
    error: &Error,
    config: &Config,
    deadline: Instant,
) -> Option<&'static str> {
    let (why, hosts) = match &config.server {
        ServerConfig::Clustered { hosts, .. } if is_refused(error) => (
            "a cluster node refused the connection (a primary down, not failed over yet?)",
            hosts,
        ),
        ServerConfig::Clustered { hosts, .. }
            if error.details().contains("Invalid or missing cluster state") =>
        {
            (
                "the cluster's state is not ok (failing over, or not set up yet?)",
                hosts,
            )
        }
        ServerConfig::Sentinel { hosts, .. } if is_refused(error) => (
            "the primary the Sentinels name refused the connection (down, not failed over \
             yet?)",
            hosts,
        ),
        _ => return None,
    };
    if deadline.saturating_duration_since(Instant::now()) <= RETRY_AFTER {
        return None;
    }
    for seed in hosts {
        let address = (seed.host.to_string(), seed.port);
        let connect = tokio::net::TcpStream::connect(address);
        if let Ok(Ok(_)) = tokio::time::timeout_at(deadline, connect).await {
            return Some(why);
        }
    }
    None
}

/// Whether the connection was refused (nothing listens at a node's address).
fn is_refused(error: &Error) -> bool {
    crate::tls::connect_hint(error, false).starts_with("nothing accepts connections")
}

/// The error of a first connection to `target` (configured by `config`) that failed with
/// `error`; through Sentinel, the Sentinels are asked what went wrong.
pub(super) async fn connect_error(
    error: Error,
    target: &str,
    config: &Config,
    deployment: Deployment,
    uses_tls: bool,
) -> LockError {
    let mut hint = crate::url::connect_failure_hint(&error, config.database, uses_tls);
    if deployment == Deployment::Cluster && hint.starts_with("nothing accepts connections") {
        // The refusal may come from any primary the cluster lists, not only the seeds.
        hint = CLUSTER_NODE_REFUSED.to_owned();
    }
    if let Some(alone) = sentinel_probe::first_sentinel(config) {
        let said = if error
            .details()
            .contains("Failed to connect to all sentinel nodes")
        {
            sentinel_probe::what_the_first_sentinel_said(alone)
                .await
                .map(|said| format!("{hint}; {said}"))
        } else {
            sentinel_probe::what_the_primary_refused(config, &error)
                .await
                .map(|said| format!("{said}: {hint}"))
        };
        if let Some(said) = said {
            hint = said;
        }
    }
    LockError::backend(format!("could not connect to {target}: {hint}"), error)
}
