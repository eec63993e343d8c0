//! Test harness of sage-lock: REAL `redis-server` / `valkey-server` processes on free loopback ports.
//!
//! - Every server runs in its own temp dir with no persistence (`save ""`, `appendonly no`), bound to
//!   127.0.0.1 on a random free port (never a fixed one), and is killed when its [`Server`] drops.
//!   A watchdog also kills it (and removes its dir) when the test process ends in any way, so the
//!   `shared*` servers, which live in statics and are never dropped, do not outlive the test binary.
//! - Binaries: `$SAGE_LOCK_REDIS_SERVER` / `$SAGE_LOCK_VALKEY_SERVER`, else `PATH`, else
//!   `<workspace>/.tools/bin/`. A missing binary is a test failure telling to run
//!   `bash scripts/setup.sh`; nothing is ever skipped.
//! - [`cmd`] is a blocking raw-RESP client for admin commands, no async runtime needed.
//!
//! Topologies: [`Server`] (standalone), [`Replicated`] (primary + replicas), [`SentinelSetup`]
//! (+ 3 Sentinels, service `mymaster`), [`Cluster`] (3 primaries + 3 replicas). The `shared*`
//! functions start one of each per kind per test binary, lazily; tests that kill, pause or
//! reconfigure servers must start their own instead.

mod captured;
pub mod chaos;
mod resp;
mod server;
pub mod tls;
mod topology;

use std::any::Any;
use std::sync::OnceLock;

pub use captured::Captured;

pub use resp::{
    DEFAULT_TIMEOUT, RawConn, Reply, cmd, cmd_ok, cmd_timeout, commandstats_calls, info,
    info_field, parse_info_field, read_reply,
};
pub use server::{
    Frozen, POLL, SETUP_HINT, START_TIMEOUT, Server, ServerConfig, ServerKind, workspace_root,
};
pub use topology::{
    CLUSTER_NODE_TIMEOUT_MS, Cluster, ClusterNodeInfo, Replicated, SENTINEL_DOWN_AFTER_MS,
    SENTINEL_FAILOVER_TIMEOUT_MS, SENTINEL_SERVICE, SLOTS, SentinelSetup, cluster_nodes, key_slot,
    launch_all, lone_node_cluster, parse_cluster_nodes, slot_owner, wait_until,
};

const KINDS: usize = ServerKind::ALL.len();

/// A standalone server shared by all tests of this test binary (started on first use).
/// Do not kill, pause or reconfigure it; use unique keys.
pub fn shared(kind: ServerKind) -> &'static Server {
    static SHARED: [OnceLock<Server>; KINDS] = [const { OnceLock::new() }; KINDS];
    SHARED[kind.index()].get_or_init(|| Server::start(kind))
}

/// A primary with 2 replicas shared by all tests of this test binary (started on first use).
pub fn shared_replicated(kind: ServerKind) -> &'static Replicated {
    static SHARED: [OnceLock<Replicated>; KINDS] = [const { OnceLock::new() }; KINDS];
    SHARED[kind.index()].get_or_init(|| Replicated::start(kind, 2))
}

/// A [`SentinelSetup`] shared by all tests of this test binary (started on first use).
/// Do not fail it over; start your own for failover tests.
pub fn shared_sentinel(kind: ServerKind) -> &'static SentinelSetup {
    static SHARED: [OnceLock<SentinelSetup>; KINDS] = [const { OnceLock::new() }; KINDS];
    SHARED[kind.index()].get_or_init(|| SentinelSetup::start(kind))
}

/// A [`Cluster`] shared by all tests of this test binary (started on first use).
pub fn shared_cluster(kind: ServerKind) -> &'static Cluster {
    static SHARED: [OnceLock<Cluster>; KINDS] = [const { OnceLock::new() }; KINDS];
    SHARED[kind.index()].get_or_init(|| Cluster::start(kind))
}

/// The sharded pub/sub channels the server on `port` has subscribers on (`PUBSUB SHARDCHANNELS`).
pub fn shard_channels(port: u16) -> Vec<String> {
    cmd_ok(port, &["PUBSUB", "SHARDCHANNELS"])
        .as_array()
        .expect("PUBSUB SHARDCHANNELS reply")
        .iter()
        .filter_map(Reply::to_text)
        .collect()
}

/// The server's `connected_clients` on `port` (-1 when it does not answer).
pub fn connected_clients(port: u16) -> i64 {
    info_field(port, "clients", "connected_clients")
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

/// Polls until [`connected_clients`] on `port` is at most `expected`, for at most `within`;
/// returns the last value seen.
pub async fn settle_clients(port: u16, expected: i64, within: std::time::Duration) -> i64 {
    let deadline = std::time::Instant::now() + within;
    loop {
        let now = connected_clients(port);
        if now <= expected || std::time::Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A runtime like `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`'s, for tests
/// that build, drop or outlive runtimes themselves.
pub fn multi_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// `waiting` waits on the server for `key` behind `holding` (another client, as another
/// process's would be), which holds it for 100 ms: `waiting`'s client opens its subscriber
/// connection. Returns once both are through.
pub async fn wait_behind(
    waiting: &sage_lock::Locks<str>,
    holding: sage_lock::Locks<str>,
    key: &str,
) {
    let (held, is_held) = tokio::sync::oneshot::channel();
    let holder_key = key.to_owned();
    let hold = tokio::spawn(async move {
        holding
            .with_lock(&holder_key, std::time::Duration::from_secs(2), async {
                let _ = held.send(());
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            })
            .await
    });
    is_held.await.expect("the holder took the lock");
    waiting
        .with_lock(key, std::time::Duration::from_secs(5), async {})
        .await
        .expect("the waiter's turn");
    hold.await.expect("holder task").expect("holder");
}

/// Holds the lock on `key` from a spawned task until the returned sender fires (or is dropped);
/// returns once the lock is held. Join the handle to see the holder finish.
pub async fn hold_by_hand(
    locks: &sage_lock::Locks<String>,
    key: &str,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let locks = locks.clone();
    let key = key.to_owned();
    let holder = tokio::spawn(async move {
        locks
            .with_lock(&key, std::time::Duration::from_secs(5), async move {
                let _ = entered_tx.send(());
                let _ = release_rx.await;
            })
            .await
            .expect("hold the lock by hand");
    });
    entered_rx.await.expect("the hand-held lock was acquired");
    (release_tx, holder)
}

/// The message of a panic payload (`panic!("...")` with or without formatting arguments), e.g.
/// from a joined task's `JoinError::into_panic`.
#[must_use]
pub fn panic_message(payload: &(dyn Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
}
