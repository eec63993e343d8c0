//! A cluster of 3 primaries and 3 replicas, and `CLUSTER NODES` parsing.

use std::time::{Duration, Instant};

use super::{PROBE, describe_all, field, info, launch_all, wait_until};
use crate::resp::{self, Reply, cmd_timeout, parse_info_field};
use crate::server::{START_TIMEOUT, Server, ServerConfig, ServerKind};

/// `cluster-node-timeout` of every [`Cluster`] node.
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 2000;
/// Number of hash slots.
pub const SLOTS: u16 = 16384;

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNodeInfo {
    pub id: String,
    pub port: u16,
    pub flags: Vec<String>,
    /// The primary's id, for a replica.
    pub primary_id: Option<String>,
    pub link_connected: bool,
    /// Slot ranges as listed (`"0-5460"`, `"42"`), migration markers included.
    pub slots: Vec<String>,
}

impl ClusterNodeInfo {
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    pub fn is_primary(&self) -> bool {
        self.has_flag("master")
    }

    pub fn is_failed(&self) -> bool {
        self.has_flag("fail") || self.has_flag("fail?")
    }
}

/// Parses `CLUSTER NODES` output.
pub fn parse_cluster_nodes(text: &str) -> Vec<ClusterNodeInfo> {
    text.lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() < 8 {
                return None;
            }
            // "ip:port@cport[,hostname]"
            let addr = parts[1].split('@').next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            Some(ClusterNodeInfo {
                id: parts[0].to_owned(),
                port,
                flags: parts[2].split(',').map(str::to_owned).collect(),
                primary_id: (parts[3] != "-").then(|| parts[3].to_owned()),
                link_connected: parts[7] == "connected",
                slots: parts[8..].iter().map(|s| (*s).to_owned()).collect(),
            })
        })
        .collect()
}

/// `CLUSTER NODES` as seen by the node on `port`.
pub fn cluster_nodes(port: u16) -> Result<Vec<ClusterNodeInfo>, String> {
    let reply = cmd_timeout(port, &["CLUSTER", "NODES"], PROBE)?.into_result()?;
    let text = reply
        .to_text()
        .ok_or_else(|| format!("CLUSTER NODES on {port}: unexpected reply {reply}"))?;
    Ok(parse_cluster_nodes(&text))
}

/// The live primary that serves `slot` in a `CLUSTER NODES` view.
pub fn slot_owner(view: &[ClusterNodeInfo], slot: u16) -> Option<&ClusterNodeInfo> {
    view.iter().find(|n| {
        n.is_primary()
            && !n.is_failed()
            && n.slots.iter().any(|range| {
                let mut bounds = range.split('-').map(str::parse::<u16>);
                match (bounds.next(), bounds.next()) {
                    (Some(Ok(a)), Some(Ok(b))) => (a..=b).contains(&slot),
                    (Some(Ok(a)), None) => a == slot,
                    _ => false,
                }
            })
    })
}

/// The hash slot of a key (CRC16/XMODEM mod 16384, honouring `{hash tags}`).
pub fn key_slot(key: &[u8]) -> u16 {
    let mut hashed = key;
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        hashed = &key[open + 1..open + 1 + len];
    }
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

/// 3 primaries with one replica each. `nodes[0..3]` are the primaries (slots 0-5460, 5461-10922,
/// 10923-16383) and `nodes[3 + i]` is the replica of `nodes[i]`, as started; after a failover use
/// [`Cluster::primary_for_slot`] / [`Cluster::replica_of`], which ask the cluster.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: Vec<Server>,
    ids: Vec<String>,
}

impl Cluster {
    /// Starts and joins the 6 nodes and waits until every node has `cluster_state:ok`, sees all 6
    /// nodes with the expected roles, and every replica's link is up.
    ///
    /// # Panics
    /// When that does not happen within 20 s.
    pub fn start(kind: ServerKind) -> Cluster {
        let configs = (0..6)
            .map(|_| ServerConfig::new(kind).cluster(CLUSTER_NODE_TIMEOUT_MS))
            .collect();
        let nodes = launch_all(configs);
        let fail = |nodes: &[Server], e: String| -> ! {
            panic!("{kind} cluster did not form: {e}\n{}", describe_all(nodes));
        };
        let ids: Vec<String> = nodes
            .iter()
            .map(|n| {
                match cmd_timeout(n.port(), &["CLUSTER", "MYID"], PROBE)
                    .and_then(Reply::into_result)
                {
                    Ok(reply) => reply.to_text().unwrap_or_default(),
                    Err(e) => fail(&nodes, format!("CLUSTER MYID on {}: {e}", n.port())),
                }
            })
            .collect();
        let ranges = [(0u16, 5460u16), (5461, 10922), (10923, SLOTS - 1)];
        for (i, (start, end)) in ranges.iter().enumerate() {
            let port = nodes[i].port();
            let epoch = (i + 1).to_string();
            for args in [
                vec!["CLUSTER", "SET-CONFIG-EPOCH", epoch.as_str()],
                vec![
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &start.to_string(),
                    &end.to_string(),
                ],
            ] {
                if let Err(e) = resp::cmd(port, &args).and_then(Reply::into_result) {
                    fail(&nodes, format!("`{}` on {port}: {e}", args.join(" ")));
                }
            }
        }
        // Every pair meets directly: waiting for gossip to spread the nodes took 1-2 s more.
        for (i, from) in nodes.iter().enumerate() {
            for to in &nodes[i + 1..] {
                let port = to.port().to_string();
                let args = ["CLUSTER", "MEET", "127.0.0.1", port.as_str()];
                if let Err(e) = resp::cmd(from.port(), &args).and_then(Reply::into_result) {
                    fail(
                        &nodes,
                        format!("`{}` on {}: {e}", args.join(" "), from.port()),
                    );
                }
            }
        }
        let cluster = Cluster { nodes, ids };
        // Everyone knows everyone, then the replicas attach.
        let all_known = wait_until(START_TIMEOUT, || {
            for node in &cluster.nodes {
                let seen = cluster_nodes(node.port())?;
                let known = seen
                    .iter()
                    .filter(|n| cluster.ids.contains(&n.id) && !n.has_flag("handshake"))
                    .count();
                if known != cluster.nodes.len() {
                    return Err(format!("node {} knows {known} of 6 nodes", node.port()));
                }
            }
            Ok(())
        });
        if let Err(e) = all_known {
            fail(&cluster.nodes, e);
        }
        for i in 0..3 {
            let replica = cluster.nodes[3 + i].port();
            let args = ["CLUSTER", "REPLICATE", cluster.ids[i].as_str()];
            let attached = wait_until(START_TIMEOUT, || {
                resp::cmd(replica, &args)
                    .and_then(Reply::into_result)
                    .map(drop)
            });
            if let Err(e) = attached {
                fail(
                    &cluster.nodes,
                    format!("`{}` on {replica}: {e}", args.join(" ")),
                );
            }
        }
        if let Err(e) = cluster.wait_formed(START_TIMEOUT) {
            fail(&cluster.nodes, e);
        }
        cluster
    }

    /// `redis-cluster://127.0.0.1:P1?node=127.0.0.1:P2&...` listing all 6 nodes, as
    /// `fred::types::config::Config::from_url` parses it.
    pub fn url(&self) -> String {
        let mut ports = self.nodes.iter().map(Server::port);
        let first = ports.next().unwrap_or_default();
        let rest: Vec<String> = ports.map(|p| format!("node=127.0.0.1:{p}")).collect();
        format!("redis-cluster://127.0.0.1:{first}?{}", rest.join("&"))
    }

    /// The node id (stable across [`Server::restart`], kept in `nodes.conf`) of `nodes[index]`.
    pub fn node_id(&self, index: usize) -> &str {
        &self.ids[index]
    }

    /// The node listening on `port`.
    pub fn node(&self, port: u16) -> Option<&Server> {
        self.nodes.iter().find(|n| n.port() == port)
    }

    /// `CLUSTER NODES` from the first running node that answers.
    pub fn topology(&self) -> Result<Vec<ClusterNodeInfo>, String> {
        let mut errors = Vec::new();
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            match cluster_nodes(node.port()) {
                Ok(nodes) => return Ok(nodes),
                Err(e) => errors.push(e),
            }
        }
        Err(format!("no cluster node answers: {errors:?}"))
    }

    /// Starts moving `slot` from `source` to `target` (both primaries): `SETSLOT IMPORTING` on
    /// the target, `MIGRATING` on the source. Keys still on the source then get ASK.
    ///
    /// # Panics
    /// When a node refuses.
    pub fn mark_slot_migrating(&self, slot: u16, source: &Server, target: &Server) {
        let slot = slot.to_string();
        let (src_id, dst_id) = (node_id_of(source), node_id_of(target));
        target.cmd_ok(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src_id]);
        source.cmd_ok(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst_id]);
    }

    /// `MIGRATE`s every key of `slot` from `source` to `target` (keys keep their TTLs), after
    /// [`Cluster::mark_slot_migrating`].
    ///
    /// # Panics
    /// When a node refuses.
    pub fn move_slot_keys(&self, slot: u16, source: &Server, target: &Server) {
        let slot = slot.to_string();
        let port = target.port().to_string();
        loop {
            let keys = source.cmd_ok(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
            let keys: Vec<String> = keys
                .as_array()
                .unwrap_or_default()
                .iter()
                .filter_map(|k| k.to_text())
                .collect();
            if keys.is_empty() {
                return;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            source.cmd_ok(&args);
        }
    }

    /// Ends a slot move: `SETSLOT NODE target` on the target, then the source, then every
    /// other node (the order the docs recommend; a node that refuses is skipped).
    ///
    /// # Panics
    /// When the target or the source refuses.
    pub fn assign_slot(&self, slot: u16, source: &Server, target: &Server) {
        let (slot, dst_id) = (slot.to_string(), node_id_of(target));
        target.cmd_ok(&["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]);
        source.cmd_ok(&["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]);
        for node in &self.nodes {
            let _ = node.cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]);
        }
    }

    /// The node currently serving `slot` (per `CLUSTER NODES` of the first node that answers).
    ///
    /// # Panics
    /// When no node answers or the slot is unassigned.
    pub fn primary_for_slot(&self, slot: u16) -> &Server {
        let topology = self.topology().unwrap_or_else(|e| panic!("{e}"));
        let Some(owner) = slot_owner(&topology, slot) else {
            panic!("slot {slot} has no live primary in {topology:#?}");
        };
        self.node(owner.port)
            .unwrap_or_else(|| panic!("slot {slot} is served by unknown port {}", owner.port))
    }

    /// Call right after killing or pausing the primary on `old_primary_port`: waits until every
    /// running node agrees that another (live) primary serves its first slot, and the cluster state
    /// is `ok` everywhere. Returns the new primary's port.
    pub fn wait_for_failover(
        &self,
        old_primary_port: u16,
        timeout: Duration,
    ) -> Result<u16, String> {
        let topology = self.topology()?;
        let slot = topology
            .iter()
            .find(|n| n.port == old_primary_port)
            .and_then(|n| {
                n.slots
                    .iter()
                    .find_map(|r| r.split('-').next()?.parse::<u16>().ok())
            })
            .ok_or_else(|| format!("port {old_primary_port} serves no slots: {topology:#?}"))?;
        let deadline = Instant::now() + timeout;
        let mut new_port = 0;
        wait_until(timeout, || {
            let mut owners = Vec::new();
            for node in self.nodes.iter().filter(|n| n.is_running()) {
                let view = cluster_nodes(node.port())?;
                owners.push(slot_owner(&view, slot).map(|n| n.port));
            }
            match owners.first() {
                Some(&Some(port))
                    if port != old_primary_port && owners.iter().all(|&o| o == Some(port)) =>
                {
                    new_port = port;
                    Ok(())
                }
                _ => Err(format!(
                    "owners of slot {slot} per running nodes: {owners:?}"
                )),
            }
        })?;
        self.wait_state_ok(deadline.saturating_duration_since(Instant::now()))?;
        Ok(new_port)
    }

    /// The node currently serving `key`.
    pub fn primary_for_key(&self, key: &str) -> &Server {
        self.primary_for_slot(key_slot(key.as_bytes()))
    }

    /// A (non-failed) replica of the primary on `primary_port`, per the cluster's current view.
    ///
    /// # Panics
    /// When no node answers or that primary has no live replica.
    pub fn replica_of(&self, primary_port: u16) -> &Server {
        self.live_replica_of(primary_port)
            .unwrap_or_else(|problem| panic!("{problem}"))
    }

    /// A live replica of the primary on `primary_port`, or why there is none (right after a
    /// failover, or while its only replica is paused and flagged failed).
    pub fn live_replica_of(&self, primary_port: u16) -> Result<&Server, String> {
        let topology = self.topology()?;
        let replica = topology
            .iter()
            .find(|n| n.port == primary_port)
            .and_then(|primary| {
                topology.iter().find(|n| {
                    n.primary_id.as_deref() == Some(primary.id.as_str())
                        && n.has_flag("slave")
                        && !n.is_failed()
                })
            });
        let Some(replica) = replica else {
            return Err(format!(
                "port {primary_port} has no live replica in {topology:#?}"
            ));
        };
        self.node(replica.port)
            .ok_or_else(|| format!("unknown replica port {}", replica.port))
    }

    /// Waits until every running node reports `cluster_state:ok` and all 16384 slots `ok`
    /// (e.g. after a failover).
    pub fn wait_state_ok(&self, timeout: Duration) -> Result<(), String> {
        wait_until(timeout, || {
            for node in self.nodes.iter().filter(|n| n.is_running()) {
                let reply = cmd_timeout(node.port(), &["CLUSTER", "INFO"], PROBE)?.into_result()?;
                let text = reply.to_text().unwrap_or_default();
                let state = parse_info_field(&text, "cluster_state").unwrap_or_default();
                let ok = parse_info_field(&text, "cluster_slots_ok").unwrap_or_default();
                if state != "ok" || ok != SLOTS.to_string() {
                    return Err(format!(
                        "node {}: cluster_state={state} cluster_slots_ok={ok}",
                        node.port()
                    ));
                }
            }
            Ok(())
        })
    }

    /// The initial layout is in place on every node: state ok, 3 primaries owning all slots,
    /// `nodes[3 + i]` a replica of `nodes[i]` with its link up, no node flagged as failing.
    fn wait_formed(&self, timeout: Duration) -> Result<(), String> {
        wait_until(timeout, || {
            for node in &self.nodes {
                let port = node.port();
                let seen = cluster_nodes(port)?;
                for (i, id) in self.ids.iter().enumerate() {
                    let Some(n) = seen.iter().find(|n| &n.id == id) else {
                        return Err(format!("node {port} does not know {id}"));
                    };
                    let expected_primary = (i >= 3).then(|| self.ids[i - 3].clone());
                    if n.is_failed()
                        || n.has_flag("handshake")
                        || n.primary_id != expected_primary
                        || (i < 3) != n.is_primary()
                    {
                        return Err(format!("node {port} sees {n:?}"));
                    }
                }
            }
            for replica in &self.nodes[3..] {
                let text = info(replica.port(), "replication")?;
                let link = field(&text, "master_link_status", replica.port())?;
                if link != "up" {
                    return Err(format!(
                        "replica {}: master_link_status={link}",
                        replica.port()
                    ));
                }
            }
            Ok(())
        })?;
        self.wait_state_ok(timeout)
    }
}

/// The cluster node id of `node` (`CLUSTER MYID`).
///
/// # Panics
/// When the node does not answer.
fn node_id_of(node: &Server) -> String {
    node.cmd_ok(&["CLUSTER", "MYID"])
        .to_text()
        .expect("CLUSTER MYID")
}

/// A one-node cluster holding every slot (no replicas), ready for clients: the smallest
/// cluster, where nothing is acknowledged by default.
pub fn lone_node_cluster(kind: ServerKind) -> Server {
    // Alone, a node knows no address of its own: it would name its slots' owner "".
    let node = Server::launch(
        ServerConfig::new(kind)
            .cluster(2_000)
            .conf_line("cluster-announce-ip 127.0.0.1"),
    );
    node.cmd_ok(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
    let start = Instant::now();
    let ok = |node: &Server| {
        node.cmd(&["CLUSTER", "INFO"])
            .ok()
            .and_then(|reply| reply.to_text())
            .is_some_and(|info| info.contains("cluster_state:ok"))
    };
    while !ok(&node) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{kind}: the one-node cluster never came up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    node
}
