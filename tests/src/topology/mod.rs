//! Multi-process topologies: primary + replicas ([`Replicated`], here), Sentinel
//! ([`SentinelSetup`]) and Cluster ([`Cluster`]), and the waits they share.

mod cluster;
mod sentinel;

use std::panic;
use std::thread;
use std::time::{Duration, Instant};

use crate::resp::{info_timeout, parse_info_field};
use crate::server::{POLL, START_TIMEOUT, Server, ServerConfig, ServerKind};

pub use cluster::{
    CLUSTER_NODE_TIMEOUT_MS, Cluster, ClusterNodeInfo, SLOTS, cluster_nodes, key_slot,
    lone_node_cluster, parse_cluster_nodes, slot_owner,
};
pub use sentinel::{
    SENTINEL_DOWN_AFTER_MS, SENTINEL_FAILOVER_TIMEOUT_MS, SENTINEL_SERVICE, SentinelSetup,
};

/// Timeout of the harness' own probes, so a paused server delays them instead of hanging them.
const PROBE: Duration = Duration::from_secs(1);

/// Polls `check` every 20 ms until it returns `Ok`, or returns its last error after `timeout`.
pub fn wait_until(
    timeout: Duration,
    mut check: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(format!("after {timeout:?}: {e}")),
            Err(_) => thread::sleep(POLL),
        }
    }
}

/// Launches `configs` in parallel threads; re-raises the first panic after all threads end
/// (servers that did start are then dropped, i.e. killed).
pub fn launch_all(configs: Vec<ServerConfig>) -> Vec<Server> {
    let results: Vec<thread::Result<Server>> = thread::scope(|s| {
        let handles: Vec<_> = configs
            .into_iter()
            .map(|c| s.spawn(move || Server::launch(c)))
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut servers = Vec::with_capacity(results.len());
    let mut first_panic = None;
    for result in results {
        match result {
            Ok(server) => servers.push(server),
            Err(payload) => {
                first_panic.get_or_insert(payload);
            }
        }
    }
    if let Some(payload) = first_panic {
        drop(servers);
        panic::resume_unwind(payload);
    }
    servers
}

fn info(port: u16, section: &str) -> Result<String, String> {
    info_timeout(port, section, PROBE)
}

fn field(info: &str, name: &str, port: u16) -> Result<String, String> {
    parse_info_field(info, name).ok_or_else(|| format!("no {name} in INFO of port {port}"))
}

fn describe_all<'a>(servers: impl IntoIterator<Item = &'a Server>) -> String {
    servers
        .into_iter()
        .map(Server::describe)
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// A primary and its replicas (configured with `replicaof` in their config files, so a restarted
/// replica follows the primary again).
#[derive(Debug)]
pub struct Replicated {
    pub primary: Server,
    pub replicas: Vec<Server>,
}

impl Replicated {
    /// Starts a primary and `replicas` replicas and waits until every replica is online.
    ///
    /// # Panics
    /// When a server does not start or replication is not up within 20 s.
    pub fn start(kind: ServerKind, replicas: usize) -> Replicated {
        let primary = Server::start(kind);
        let configs = (0..replicas)
            .map(|_| {
                ServerConfig::new(kind).conf_line(format!("replicaof 127.0.0.1 {}", primary.port()))
            })
            .collect();
        let replicas = launch_all(configs);
        let setup = Replicated { primary, replicas };
        if let Err(e) = setup.wait_synced(START_TIMEOUT) {
            panic!(
                "{kind} replication did not come up: {e}\n{}",
                describe_all(setup.servers())
            );
        }
        setup
    }

    /// `redis://127.0.0.1:PRIMARY_PORT`.
    pub fn primary_url(&self) -> String {
        self.primary.url()
    }

    /// Primary first, then the replicas.
    pub fn servers(&self) -> impl Iterator<Item = &Server> {
        std::iter::once(&self.primary).chain(self.replicas.iter())
    }

    /// The server listening on `port`, if it is part of this setup.
    pub fn server(&self, port: u16) -> Option<&Server> {
        self.servers().find(|s| s.port() == port)
    }

    /// Waits until every replica has `master_link_status:up` to [`Replicated::primary`] and the
    /// primary lists all of them as `state=online`.
    pub fn wait_synced(&self, timeout: Duration) -> Result<(), String> {
        let primary_port = self.primary.port().to_string();
        wait_until(timeout, || {
            for replica in &self.replicas {
                let text = info(replica.port(), "replication")?;
                let link = field(&text, "master_link_status", replica.port())?;
                let master_port = field(&text, "master_port", replica.port())?;
                if link != "up" || master_port != primary_port {
                    return Err(format!(
                        "replica {}: master_port={master_port} master_link_status={link}",
                        replica.port()
                    ));
                }
            }
            let text = info(self.primary.port(), "replication")?;
            let online = (0..self.replicas.len())
                .filter_map(|i| parse_info_field(&text, &format!("slave{i}")))
                .filter(|s| s.contains("state=online"))
                .count();
            if online == self.replicas.len() {
                Ok(())
            } else {
                Err(format!(
                    "primary {} has {online} of {} replicas online",
                    self.primary.port(),
                    self.replicas.len()
                ))
            }
        })
    }
}
