//! The seeded fault-injection suite behind the `chaos` binary (issue 8, section 2).
//!
//! [`run::coordinate`] starts a lock deployment and a separate fencing-aware store, spawns worker
//! processes ([`worker`]) that contend for a few hot and cold keys through sage-lock's public API,
//! injects faults on a seeded schedule ([`nemesis`]), then checks the recorded histories and the
//! store ([`checker`]). Every piece of shared state is a file or a server: workers write one
//! history file each ([`history`]), timestamped with the machine's monotonic clock ([`clock`]).

pub mod checker;
pub mod clock;
pub mod deploy;
pub mod faults;
pub mod fleet;
pub mod history;
pub mod nemesis;
pub mod proxy;
pub mod run;
pub mod store;
pub mod worker;

use std::time::Duration;

/// Namespace of every lock the workers take.
pub const NAMESPACE: &str = "chaos";
/// Keys most acquisitions go for.
pub const HOT_KEYS: [&str; 2] = ["hot-0", "hot-1"];
/// Keys contended now and then.
pub const COLD_KEYS: [&str; 6] = ["cold-0", "cold-1", "cold-2", "cold-3", "cold-4", "cold-5"];
/// Tasks per worker process.
pub const TASKS_PER_WORKER: u32 = 4;

/// Which lock deployment a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    Standalone,
    Replicated,
    Sentinel,
    Cluster,
}

impl Topology {
    pub const ALL: [Topology; 4] = [
        Topology::Standalone,
        Topology::Replicated,
        Topology::Sentinel,
        Topology::Cluster,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Topology::Standalone => "standalone",
            Topology::Replicated => "replicated",
            Topology::Sentinel => "sentinel",
            Topology::Cluster => "cluster",
        }
    }

    /// Parses `standalone|replicated|sentinel|cluster`.
    pub fn parse(text: &str) -> Result<Topology, String> {
        Topology::ALL
            .into_iter()
            .find(|t| t.name() == text)
            .ok_or_else(|| {
                format!(
                    "unknown --topology {text:?}: use standalone, replicated, sentinel or cluster"
                )
            })
    }
}

/// Every key a worker may lock.
pub fn all_keys() -> impl Iterator<Item = &'static str> {
    HOT_KEYS.into_iter().chain(COLD_KEYS)
}

/// Milliseconds as a `Duration`.
pub fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}
