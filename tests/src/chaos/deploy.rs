//! The servers of one run: the lock deployment (under faults), the store (never faulted) and,
//! for standalone and replicated deployments, the [`Proxy`] the workers connect through.

use std::time::Duration;

use super::Topology;
use super::proxy::Proxy;
use crate::{Cluster, Replicated, SentinelSetup, Server, ServerKind};

/// The lock servers, by topology.
#[derive(Debug)]
pub enum LockServers {
    Standalone(Server),
    Replicated(Replicated),
    Sentinel(SentinelSetup),
    Cluster(Cluster),
}

/// Everything a run started.
#[derive(Debug)]
pub struct Deployment {
    pub topology: Topology,
    pub kind: ServerKind,
    pub lock: LockServers,
    pub store: Server,
    pub proxy: Option<Proxy>,
}

impl Deployment {
    pub fn start(topology: Topology, kind: ServerKind) -> Result<Deployment, String> {
        let store = Server::start(kind);
        let lock = match topology {
            Topology::Standalone => LockServers::Standalone(Server::start(kind)),
            Topology::Replicated => LockServers::Replicated(Replicated::start(kind, 2)),
            Topology::Sentinel => LockServers::Sentinel(SentinelSetup::start(kind)),
            Topology::Cluster => LockServers::Cluster(Cluster::start(kind)),
        };
        let proxy = match &lock {
            LockServers::Standalone(server) => Some(Proxy::start(server.port())?),
            LockServers::Replicated(setup) => Some(Proxy::start(setup.primary.port())?),
            LockServers::Sentinel(_) | LockServers::Cluster(_) => None,
        };
        Ok(Deployment {
            topology,
            kind,
            lock,
            store,
            proxy,
        })
    }

    /// The URL workers connect to, and whether to declare it replicated.
    pub fn client_url(&self) -> (String, bool) {
        match (&self.lock, &self.proxy) {
            (LockServers::Standalone(_), Some(proxy)) => {
                (format!("redis://127.0.0.1:{}", proxy.port()), false)
            }
            (LockServers::Replicated(_), Some(proxy)) => {
                (format!("redis://127.0.0.1:{}", proxy.port()), true)
            }
            (LockServers::Standalone(server), None) => (server.url(), false),
            (LockServers::Replicated(setup), None) => (setup.primary_url(), true),
            (LockServers::Sentinel(setup), _) => (setup.url(), false),
            (LockServers::Cluster(cluster), _) => (cluster.url(), false),
        }
    }

    /// Every data server (primaries and replicas), not the Sentinels.
    pub fn data_servers(&self) -> Vec<&Server> {
        match &self.lock {
            LockServers::Standalone(server) => vec![server],
            LockServers::Replicated(setup) => setup.servers().collect(),
            LockServers::Sentinel(setup) => setup.data.servers().collect(),
            LockServers::Cluster(cluster) => cluster.nodes.iter().collect(),
        }
    }

    /// Every server the workers may hold connections to (data servers and Sentinels).
    pub fn client_facing(&self) -> Vec<&Server> {
        let mut all = self.data_servers();
        if let LockServers::Sentinel(setup) = &self.lock {
            all.extend(setup.sentinels.iter());
        }
        all
    }

    /// Copies every server's log (data servers and Sentinels) into `dir` as `server-<port>.log`,
    /// with `clock.txt` relating the logs' wall-clock times to the histories' monotonic ones.
    pub fn copy_logs(&self, dir: &std::path::Path) {
        let mut servers = self.client_facing();
        servers.push(&self.store);
        for server in servers {
            let _ = std::fs::copy(
                server.log_path(),
                dir.join(format!("server-{}.log", server.port())),
            );
        }
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let _ = std::fs::write(
            dir.join("clock.txt"),
            format!("monotonic_ns {} unix_ns {wall}\n", super::clock::now_ns()),
        );
    }

    /// The data servers that currently say `role:master`.
    pub fn primaries(&self) -> Vec<&Server> {
        self.data_servers()
            .into_iter()
            .filter(|s| {
                crate::info_field(s.port(), "replication", "role").as_deref() == Some("master")
            })
            .collect()
    }

    /// Waits until the deployment is whole again after the nemesis: every server answers,
    /// replication is up, Sentinels or the cluster agree.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<(), String> {
        match &self.lock {
            LockServers::Standalone(server) => crate::wait_until(timeout, || {
                server
                    .cmd(&["PING"])
                    .and_then(crate::Reply::into_result)
                    .map(drop)
            }),
            LockServers::Replicated(setup) => setup.wait_synced(timeout),
            LockServers::Sentinel(setup) => {
                setup.wait_settled(timeout)?;
                let primary = setup.current_primary_port();
                crate::wait_until(timeout, || {
                    for replica in setup.data.servers().filter(|s| s.port() != primary) {
                        let link =
                            crate::info_field(replica.port(), "replication", "master_link_status");
                        if link.as_deref() != Some("up") {
                            return Err(format!("replica {} link {link:?}", replica.port()));
                        }
                    }
                    Ok(())
                })
            }
            LockServers::Cluster(cluster) => cluster.wait_state_ok(timeout),
        }
    }

    /// Client connections that can only be the workers': every connection in `CLIENT LIST` of
    /// the [`Deployment::client_facing`] servers except named ones (Sentinels name theirs),
    /// replication links (flags `M`/`S`), `MIGRATE` links between cluster nodes and the one
    /// asking. Counted by port.
    pub fn worker_connections(&self) -> Result<std::collections::HashMap<u16, i64>, String> {
        let mut counts = std::collections::HashMap::new();
        for server in self.client_facing() {
            let list = server.cmd(&["CLIENT", "LIST"])?.into_result()?.to_plain();
            let count = list
                .lines()
                .filter(|line| is_worker_connection(line))
                .count();
            counts.insert(server.port(), i64::try_from(count).unwrap_or(i64::MAX));
        }
        Ok(counts)
    }

    /// Lock keys (not fencing counters or grant times) left on the primaries.
    pub fn lock_keys(&self) -> Result<Vec<String>, String> {
        let mut keys = Vec::new();
        for server in self.primaries() {
            let mut cursor = "0".to_owned();
            loop {
                let reply = server
                    .cmd(&[
                        "SCAN",
                        &cursor,
                        "MATCH",
                        &format!("{{{}:*", super::NAMESPACE),
                        "COUNT",
                        "1000",
                    ])?
                    .into_result()?;
                let parts = reply.as_array().unwrap_or_default();
                let (Some(next), Some(batch)) = (parts.first(), parts.get(1)) else {
                    return Err(format!(
                        "SCAN on {}: unexpected reply {reply}",
                        server.port()
                    ));
                };
                keys.extend(
                    batch
                        .as_array()
                        .unwrap_or_default()
                        .iter()
                        .filter_map(crate::Reply::to_text)
                        // Kept on purpose, without a TTL: the fencing counter and the
                        // last grant's time (`Locks::holder`).
                        .filter(|k| !k.ends_with(":fence") && !k.ends_with(":since")),
                );
                cursor = next.to_text().unwrap_or_else(|| "0".to_owned());
                if cursor == "0" {
                    break;
                }
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

/// Whether one `CLIENT LIST` line is a plain, unnamed client connection other than the caller's
/// and other than a cluster node's `MIGRATE` connection (cached by the source node for 10 s,
/// last command `RESTORE-ASKING`).
fn is_worker_connection(line: &str) -> bool {
    let field = |name: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or("")
    };
    !line.trim().is_empty()
        && field("name").is_empty()
        && !field("flags").contains(['M', 'S'])
        && !matches!(field("cmd"), "client|list" | "restore-asking" | "restore")
}
