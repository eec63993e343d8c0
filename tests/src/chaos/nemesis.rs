//! Runs the seeded schedule of [`faults`](super::faults) against a deployment and its workers,
//! recording when each fault started and ended. Every fault heals itself before its thread ends
//! (paused processes are continued, the proxy goes back to normal, slots end up owned by one node).

use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use sage_lock::LockClient;

use super::clock::now_ns;
use super::deploy::{Deployment, LockServers};
use super::faults::{Class, FaultKind, FaultRecord, Planned};
use super::fleet::Fleet;
use super::proxy::Mode;
use super::{HOT_KEYS, NAMESPACE};
use crate::{Reply, SENTINEL_SERVICE, Server, key_slot};

/// How long a topology change (failover, restart) may take before the run fails.
const TOPOLOGY_TIMEOUT: Duration = Duration::from_secs(30);

/// Shared state of one nemesis run.
#[derive(Debug)]
pub struct Nemesis<'a> {
    pub deploy: &'a Deployment,
    pub fleet: &'a Mutex<Fleet>,
    /// Faults planned to start after this are skipped.
    pub until: Instant,
    /// The lock keys whose slots may be migrated.
    keys: Vec<&'static str>,
    records: Mutex<Vec<FaultRecord>>,
    classes: [Mutex<()>; 3],
}

impl<'a> Nemesis<'a> {
    pub fn new(
        deploy: &'a Deployment,
        fleet: &'a Mutex<Fleet>,
        until: Instant,
        keys: Vec<&'static str>,
    ) -> Self {
        Nemesis {
            deploy,
            fleet,
            until,
            keys,
            records: Mutex::new(Vec::new()),
            classes: [Mutex::new(()), Mutex::new(()), Mutex::new(())],
        }
    }

    /// Runs `plan` (offsets from `started`), each fault on its own thread; returns the records
    /// once every fault has ended.
    pub fn run(self, plan: &[Planned], started: Instant) -> Vec<FaultRecord> {
        thread::scope(|scope| {
            for planned in plan {
                let at = started + planned.at;
                if at > self.until {
                    break;
                }
                thread::sleep(at.saturating_duration_since(Instant::now()));
                let this = &self;
                scope.spawn(move || this.execute(planned));
            }
        });
        self.records
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn execute(&self, planned: &Planned) {
        let class = match planned.kind.class() {
            Class::Process => 0,
            Class::Server => 1,
            Class::Network => 2,
        };
        let _class = self.classes[class]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let start = now_ns();
        let outcome = if Instant::now() > self.until {
            Err("the nemesis had ended".to_owned())
        } else {
            self.inject(planned)
        };
        let (target, worker, skipped) = match outcome {
            Ok((target, worker)) => (target, worker, None),
            Err(why) => (String::new(), None, Some(why)),
        };
        let record = FaultRecord {
            kind: planned.kind,
            target,
            worker,
            start,
            end: now_ns(),
            skipped,
        };
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(record);
    }

    fn fleet(&self) -> std::sync::MutexGuard<'_, Fleet> {
        self.fleet
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A worker slot holding a lock (waits up to a second for one).
    fn holder(&self, pick: u64) -> Result<u32, String> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let holders = self.fleet().holders();
            if !holders.is_empty() {
                let i = usize::try_from(pick % holders.len() as u64).unwrap_or(0);
                return Ok(holders[i]);
            }
            if Instant::now() > deadline {
                return Err("no worker held a lock".to_owned());
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Applies one fault and heals it; returns what it hit.
    fn inject(&self, p: &Planned) -> Result<(String, Option<String>), String> {
        let deploy = self.deploy;
        match p.kind {
            FaultKind::KillHolder => {
                let slot = self.holder(p.pick)?;
                let name = self.fleet().kill_and_respawn(slot)?;
                Ok((name.clone(), Some(name)))
            }
            FaultKind::PauseHolder => {
                let slot = self.holder(p.pick)?;
                let name = self.fleet().signal(slot, "STOP")?;
                thread::sleep(p.duration);
                self.fleet().signal(slot, "CONT")?;
                Ok((name.clone(), Some(name)))
            }
            FaultKind::ClientKill => {
                for server in deploy.data_servers() {
                    let _ = server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
                }
                Ok(("all data servers".to_owned(), None))
            }
            FaultKind::ScriptFlush => {
                for server in deploy.primaries() {
                    let _ = server.cmd(&["SCRIPT", "FLUSH"]);
                }
                Ok(("all primaries".to_owned(), None))
            }
            FaultKind::RestartServer => match &deploy.lock {
                LockServers::Standalone(server) => {
                    server.restart();
                    Ok((server.addr(), None))
                }
                LockServers::Replicated(setup) => {
                    setup.primary.restart();
                    setup.wait_synced(TOPOLOGY_TIMEOUT)?;
                    Ok((setup.primary.addr(), None))
                }
                _ => Err("no restart for this topology".to_owned()),
            },
            FaultKind::PauseReplica => {
                let replicas = self.replicas();
                if replicas.is_empty() {
                    return Err("no replica".to_owned());
                }
                let replica =
                    replicas[usize::try_from(p.pick % replicas.len() as u64).unwrap_or(0)];
                replica.pause();
                thread::sleep(p.duration);
                replica.resume();
                Ok((replica.addr(), None))
            }
            FaultKind::SentinelFailover => {
                let LockServers::Sentinel(setup) = &deploy.lock else {
                    return Err("not a sentinel deployment".to_owned());
                };
                let old = setup.current_primary_port();
                setup.sentinels[0]
                    .cmd(&["SENTINEL", "FAILOVER", SENTINEL_SERVICE])?
                    .into_result()?;
                // Accepted by Sentinel, it is a fault even if it does not complete in time.
                match setup.wait_for_failover(old, TOPOLOGY_TIMEOUT) {
                    Ok(new) => Ok((format!("{old} -> {new}"), None)),
                    Err(e) => Ok((format!("{old}, did not complete: {e}"), None)),
                }
            }
            FaultKind::ClusterFailover => self.cluster_failover(p.pick),
            FaultKind::SlotMigration => self.migrate_slot(p.pick),
            FaultKind::Latency | FaultKind::Blackhole | FaultKind::DropConnections => {
                let proxy = deploy
                    .proxy
                    .as_ref()
                    .ok_or_else(|| "no proxy in this topology".to_owned())?;
                match p.kind {
                    FaultKind::DropConnections => proxy.drop_connections(),
                    kind => {
                        proxy.set_mode(if kind == FaultKind::Latency {
                            Mode::Latency(p.latency)
                        } else {
                            Mode::Blackhole
                        });
                        thread::sleep(p.duration);
                        proxy.set_mode(Mode::Normal);
                    }
                }
                Ok((format!("proxy {}", proxy.port()), None))
            }
        }
    }

    /// Data servers that are replicas right now.
    fn replicas(&self) -> Vec<&Server> {
        let primaries: Vec<u16> = self.deploy.primaries().iter().map(|s| s.port()).collect();
        self.deploy
            .data_servers()
            .into_iter()
            .filter(|s| !primaries.contains(&s.port()))
            .collect()
    }

    fn cluster_failover(&self, pick: u64) -> Result<(String, Option<String>), String> {
        let LockServers::Cluster(cluster) = &self.deploy.lock else {
            return Err("not a cluster".to_owned());
        };
        let key = HOT_KEYS[usize::try_from(pick % HOT_KEYS.len() as u64).unwrap_or(0)];
        let slot = key_slot(&LockClient::server_key(NAMESPACE, key));
        let primary = cluster.primary_for_slot(slot).port();
        // Skipped (recorded as such) when the primary has no live replica right now.
        let replica = cluster
            .live_replica_of(primary)
            .map_err(|_| format!("{primary} has no live replica"))?;
        replica.cmd(&["CLUSTER", "FAILOVER"])?.into_result()?;
        // Once sent, the failover is a fault even if it does not complete: a manual failover
        // pauses the primary's writers while the replica catches up.
        match cluster.wait_for_failover(primary, TOPOLOGY_TIMEOUT) {
            Ok(new) => Ok((format!("slot {slot}: {primary} -> {new}"), None)),
            Err(e) => Ok((
                format!("slot {slot}: {primary}, did not complete: {e}"),
                None,
            )),
        }
    }

    /// Moves the slot of a lock key to another primary: IMPORTING/MIGRATING, a pause so that
    /// clients meet ASK redirections, MIGRATE of every key, SETSLOT NODE everywhere.
    fn migrate_slot(&self, pick: u64) -> Result<(String, Option<String>), String> {
        let LockServers::Cluster(cluster) = &self.deploy.lock else {
            return Err("not a cluster".to_owned());
        };
        let keys = &self.keys;
        let key = keys[usize::try_from(pick % keys.len() as u64).unwrap_or(0)];
        let slot = key_slot(&LockClient::server_key(NAMESPACE, key));
        let topology = cluster.topology()?;
        let source = crate::slot_owner(&topology, slot)
            .ok_or_else(|| format!("slot {slot} has no owner"))?
            .clone();
        let others: Vec<_> = topology
            .iter()
            .filter(|n| n.is_primary() && !n.is_failed() && n.port != source.port)
            .collect();
        if others.is_empty() {
            return Err("no other primary".to_owned());
        }
        let target =
            others[usize::try_from((pick >> 8) % others.len() as u64).unwrap_or(0)].clone();
        let s = slot.to_string();
        let ok = |port: u16, args: &[&str]| -> Result<Reply, String> {
            crate::cmd(port, args)?
                .into_result()
                .map_err(|e| format!("`{}` on {port}: {e}", args.join(" ")))
        };
        ok(
            target.port,
            &["CLUSTER", "SETSLOT", &s, "IMPORTING", &source.id],
        )?;
        ok(
            source.port,
            &["CLUSTER", "SETSLOT", &s, "MIGRATING", &target.id],
        )?;
        thread::sleep(Duration::from_millis(200));
        let mut error = None;
        for _ in 0..100 {
            let batch = ok(source.port, &["CLUSTER", "GETKEYSINSLOT", &s, "100"])?;
            let names: Vec<String> = batch
                .as_array()
                .unwrap_or_default()
                .iter()
                .filter_map(Reply::to_text)
                .collect();
            if names.is_empty() {
                break;
            }
            let port = target.port.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(names.iter().map(String::as_str));
            if let Err(e) = ok(source.port, &args) {
                error = Some(e);
                break;
            }
        }
        // Always finish: the target owns the slot (keys not moved are reported, not left behind
        // in a half-migrated slot).
        for node in cluster.nodes.iter().filter(|n| n.is_running()) {
            let _ = node.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &target.id]);
        }
        let what = format!("slot {slot} ({key}): {} -> {}", source.port, target.port);
        match error {
            None => Ok((what, None)),
            Some(e) => Ok((format!("{what}, MIGRATE failed: {e}"), None)),
        }
    }
}
