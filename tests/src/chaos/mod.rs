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
/// Keys of the read-write lock (`--primitives rwlock`): writers do the fenced read-modify-write,
/// readers only hold.
pub const RW_KEYS: [&str; 2] = ["rw-0", "rw-1"];
/// Keys of the semaphore (`--primitives semaphore`), each with [`PERMITS`] permits.
pub const SEM_KEYS: [&str; 2] = ["sem-0", "sem-1"];
/// Permits of every semaphore key.
pub const PERMITS: u32 = 2;
/// Tasks per worker process.
pub const TASKS_PER_WORKER: u32 = 4;

/// A primitive the workers exercise (`--primitives`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Primitive {
    /// `Locks::with_lock` / `try_with_lock` on the hot and cold keys.
    Mutex,
    /// `Locks::with_locks` / `try_with_locks` on two of the mutex's keys at once.
    Multi,
    /// `RwLocks::read` / `write` (and their `try_` forms) on [`RW_KEYS`].
    RwLock,
    /// `Semaphores::acquire` / `try_acquire` with [`PERMITS`] permits on [`SEM_KEYS`].
    Semaphore,
}

impl Primitive {
    pub const ALL: [Primitive; 4] = [
        Primitive::Mutex,
        Primitive::Multi,
        Primitive::RwLock,
        Primitive::Semaphore,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Primitive::Mutex => "mutex",
            Primitive::Multi => "multi",
            Primitive::RwLock => "rwlock",
            Primitive::Semaphore => "semaphore",
        }
    }

    /// Parses a comma-separated list of `mutex|multi|rwlock|semaphore`, or `all`.
    pub fn parse_list(text: &str) -> Result<Vec<Primitive>, String> {
        if text == "all" {
            return Ok(Primitive::ALL.to_vec());
        }
        let mut list = Vec::new();
        for name in text.split(',').map(str::trim) {
            let primitive = Primitive::ALL
                .into_iter()
                .find(|p| p.name() == name)
                .ok_or_else(|| {
                    format!(
                        "unknown primitive {name:?} in --primitives: use a comma-separated list \
                         of mutex, multi, rwlock and semaphore, or all"
                    )
                })?;
            if !list.contains(&primitive) {
                list.push(primitive);
            }
        }
        Ok(list)
    }

    /// The list as `--primitives` takes it.
    pub fn list_text(list: &[Primitive]) -> String {
        list.iter().map(|p| p.name()).collect::<Vec<_>>().join(",")
    }
}

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

/// Every key of the mutex (also the keys `with_locks` takes).
pub fn all_keys() -> impl Iterator<Item = &'static str> {
    HOT_KEYS.into_iter().chain(COLD_KEYS)
}

/// Every key whose critical sections write to the store: the mutex's and the read-write lock's.
pub fn store_keys() -> impl Iterator<Item = &'static str> {
    all_keys().chain(RW_KEYS)
}

/// Every key a run with these primitives locks (the nemesis migrates their slots).
pub fn locked_keys(primitives: &[Primitive]) -> Vec<&'static str> {
    let mut keys: Vec<&'static str> = all_keys().collect();
    if primitives.contains(&Primitive::RwLock) {
        keys.extend(RW_KEYS);
    }
    if primitives.contains(&Primitive::Semaphore) {
        keys.extend(SEM_KEYS);
    }
    keys
}

/// Milliseconds as a `Duration`.
pub fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}
