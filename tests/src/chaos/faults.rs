//! The faults, which topologies they apply to, and the seeded schedule.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use super::Topology;

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL a worker that holds a lock; a new worker takes its slot.
    KillHolder,
    /// SIGSTOP a worker that holds a lock for longer than the lease, then SIGCONT.
    PauseHolder,
    /// `CLIENT KILL TYPE normal` on every data server.
    ClientKill,
    /// `SCRIPT FLUSH` on every primary (the NOSCRIPT path without losing keys).
    ScriptFlush,
    /// Restart the (primary) lock server: empty dataset and script cache.
    RestartServer,
    /// SIGSTOP a replica, then SIGCONT.
    PauseReplica,
    /// `SENTINEL FAILOVER`.
    SentinelFailover,
    /// `CLUSTER FAILOVER` on the replica of the shard holding a hot key.
    ClusterFailover,
    /// Move the slot of a lock key to another primary under load.
    SlotMigration,
    /// The proxy delays every chunk.
    Latency,
    /// The proxy closes every open connection.
    DropConnections,
    /// The proxy stops forwarding (connections stay open).
    Blackhole,
}

/// Which faults may overlap: at most one fault of each class runs at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Process,
    Server,
    Network,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillHolder => "kill-holder",
            FaultKind::PauseHolder => "pause-holder",
            FaultKind::ClientKill => "client-kill",
            FaultKind::ScriptFlush => "script-flush",
            FaultKind::RestartServer => "restart-server",
            FaultKind::PauseReplica => "pause-replica",
            FaultKind::SentinelFailover => "sentinel-failover",
            FaultKind::ClusterFailover => "cluster-failover",
            FaultKind::SlotMigration => "slot-migration",
            FaultKind::Latency => "latency",
            FaultKind::DropConnections => "drop-connections",
            FaultKind::Blackhole => "blackhole",
        }
    }

    /// Every kind, for parsing.
    pub const ALL: [FaultKind; 12] = [
        FaultKind::KillHolder,
        FaultKind::PauseHolder,
        FaultKind::ClientKill,
        FaultKind::ScriptFlush,
        FaultKind::RestartServer,
        FaultKind::PauseReplica,
        FaultKind::SentinelFailover,
        FaultKind::ClusterFailover,
        FaultKind::SlotMigration,
        FaultKind::Latency,
        FaultKind::DropConnections,
        FaultKind::Blackhole,
    ];

    /// Parses a name as printed by [`FaultKind::name`].
    pub fn parse(text: &str) -> Result<FaultKind, String> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.name() == text)
            .ok_or_else(|| {
                let names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown fault {text:?}: use one of {}", names.join(", "))
            })
    }

    pub fn class(self) -> Class {
        match self {
            FaultKind::KillHolder | FaultKind::PauseHolder => Class::Process,
            FaultKind::Latency | FaultKind::DropConnections | FaultKind::Blackhole => {
                Class::Network
            }
            _ => Class::Server,
        }
    }

    /// Whether lock keys may be lost (or a stale primary may grant) while this fault lasts.
    pub fn loses_data(self) -> bool {
        matches!(
            self,
            FaultKind::RestartServer | FaultKind::SentinelFailover | FaultKind::ClusterFailover
        )
    }

    /// The faults that apply to a topology, with their relative weights.
    pub fn for_topology(topology: Topology) -> Vec<(FaultKind, u32)> {
        use FaultKind::*;
        let mut kinds = vec![
            (KillHolder, 3),
            (PauseHolder, 3),
            (ClientKill, 2),
            (ScriptFlush, 1),
        ];
        match topology {
            Topology::Standalone => kinds.extend([
                (RestartServer, 1),
                (Latency, 2),
                (DropConnections, 2),
                (Blackhole, 2),
            ]),
            Topology::Replicated => kinds.extend([
                (RestartServer, 1),
                (PauseReplica, 2),
                (Latency, 2),
                (DropConnections, 2),
                (Blackhole, 2),
            ]),
            Topology::Sentinel => kinds.extend([(PauseReplica, 2), (SentinelFailover, 2)]),
            Topology::Cluster => {
                kinds.extend([(PauseReplica, 2), (ClusterFailover, 2), (SlotMigration, 2)])
            }
        }
        kinds
    }
}

/// One fault of the schedule.
#[derive(Clone, Debug)]
pub struct Planned {
    /// Offset from the start of the nemesis.
    pub at: Duration,
    pub kind: FaultKind,
    /// How long the fault lasts (pauses, proxy modes); instant faults ignore it.
    pub duration: Duration,
    /// Latency to add, for [`FaultKind::Latency`].
    pub latency: Duration,
    /// Random number for picking targets.
    pub pick: u64,
}

/// What happened, as recorded by the nemesis.
#[derive(Clone, Debug)]
pub struct FaultRecord {
    pub kind: FaultKind,
    /// What it hit (a worker name, a port, ...).
    pub target: String,
    /// The worker process it paused or killed.
    pub worker: Option<String>,
    pub start: u64,
    pub end: u64,
    /// The fault could not be applied (e.g. no holder found); does not count as a fault.
    pub skipped: Option<String>,
}

/// The schedule for `seconds` of nemesis: faults with gaps of 0.2-1.2 s, a quarter of them
/// starting while the previous one still runs (the nemesis runs one fault per [`Class`] at a
/// time, so an overlapping fault of the same class waits for the first).
pub fn plan(
    topology: Topology,
    seed: u64,
    seconds: u64,
    lease: Duration,
    without: &[FaultKind],
) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let kinds: Vec<(FaultKind, u32)> = FaultKind::for_topology(topology)
        .into_iter()
        .filter(|(k, _)| !without.contains(k))
        .collect();
    if kinds.is_empty() {
        return Vec::new();
    }
    let total: u32 = kinds.iter().map(|(_, w)| w).sum();
    let end = Duration::from_secs(seconds);
    let mut at = Duration::from_millis(500);
    let mut plan: Vec<Planned> = Vec::new();
    while at < end {
        let mut roll = rng.random_range(0..total);
        let kind = kinds
            .iter()
            .find(|(_, w)| {
                if roll < *w {
                    true
                } else {
                    roll -= w;
                    false
                }
            })
            .map_or(FaultKind::ClientKill, |(k, _)| *k);
        let duration = match kind {
            FaultKind::PauseHolder => lease.mul_f64(rng.random_range(1.3..2.5)),
            FaultKind::PauseReplica => lease.mul_f64(rng.random_range(0.5..2.0)),
            FaultKind::Latency => Duration::from_millis(rng.random_range(800..2500)),
            FaultKind::Blackhole => lease.mul_f64(rng.random_range(0.3..2.0)),
            _ => Duration::ZERO,
        };
        let latency = lease.mul_f64(rng.random_range(0.02..0.25));
        let pick = rng.random();
        plan.push(Planned {
            at,
            kind,
            duration,
            latency,
            pick,
        });
        // The next fault: usually after this one ends plus a gap, sometimes during it.
        let gap = Duration::from_millis(rng.random_range(200..1200));
        at += if rng.random_bool(0.25) {
            duration.mul_f64(rng.random_range(0.2..0.8))
        } else {
            duration + gap
        };
    }
    plan
}
