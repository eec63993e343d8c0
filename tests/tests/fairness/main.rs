//! Fair hand-off: waiters queue on the server in arrival order, a release notifies the next one,
//! dead waiters and lost notifications cost bounded time, and no process starves another.

use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use harness::{SentinelSetup, Server, ServerKind};
use sage_lock::{LockClient, LockOptions, Locks};
use tokio::io::{AsyncBufReadExt, BufReader};

mod faults;
mod handoff;
mod queued_primitives;
mod several_keys;
mod starvation;

/// How long a dead waiter can hold up the queue (the engine's waiter TTL), plus slack.
const DEAD_WAITER_BOUND: Duration = Duration::from_secs(4);

async fn connect(url: &str) -> LockClient {
    LockClient::connect(url).await.expect("connect")
}

fn locks(client: &LockClient, ns: &str) -> Locks<str> {
    client
        .lock_with(
            LockOptions::new()
                .namespace(ns)
                .lease(Duration::from_secs(5)),
        )
        .expect("options")
}

fn ns(test: &str, kind: ServerKind) -> String {
    format!("{test}-{}-{}", kind.name(), rand::random::<u32>())
}

/// Median PING round trip on `client`'s connection.
async fn ping_rtt(client: &LockClient) -> Duration {
    use sage_lock::fred::interfaces::ClientLike;
    let mut samples = Vec::new();
    for _ in 0..21 {
        let sent = Instant::now();
        let _: String = client.fred().ping(None).await.expect("PING");
        samples.push(sent.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

/// Holds the mutex `key` until the returned sender fires; resolves once held. The task resolves
/// to the instant the body ended.
async fn hold(
    locks: &Locks<str>,
    key: &str,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Instant>,
) {
    hold_queued(&Queued::Mutex(locks.clone()), key).await
}

/// Starts a waiter for `key` on its own client; resolves to the instant its body began.
fn wait_for(locks: &Locks<str>, key: &str, wait: Duration) -> tokio::task::JoinHandle<Instant> {
    let (locks, key) = (locks.clone(), key.to_owned());
    tokio::spawn(async move {
        locks
            .with_lock(&key, wait, async { Instant::now() })
            .await
            .expect("waiter gets the lock")
    })
}

fn queue_len(port: u16, ns: &str, key: &str) -> i64 {
    let queue = format!("{{{ns}:{key}}}:queue");
    harness::cmd(port, &["LLEN", &queue])
        .ok()
        .and_then(|r| r.as_int())
        .unwrap_or(-1)
}

async fn until_queued(port: u16, ns: &str, key: &str, len: i64) {
    let start = Instant::now();
    while queue_len(port, ns, key) < len {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "queue of {key} never reached {len}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waiting callers of a semaphore with one permit, on the client `client`, in `ns`.
fn semaphore(client: &LockClient, ns: &str) -> sage_lock::Semaphores<str> {
    client
        .semaphore_with(
            1,
            LockOptions::new()
                .namespace(ns)
                .lease(Duration::from_secs(5)),
        )
        .expect("options")
}

/// A read-write lock family in `ns` with a 5 s lease.
fn rw_locks(client: &LockClient, ns: &str) -> sage_lock::RwLocks<str> {
    client
        .rw_lock_with(
            LockOptions::new()
                .namespace(ns)
                .lease(Duration::from_secs(5)),
        )
        .expect("options")
}

/// How many waiters the semaphore `key` has queued (its queue's cardinality).
fn sem_queue_len(port: u16, ns: &str, key: &str) -> i64 {
    zcard(port, &format!("{{{ns}:{key}}}:sem-queue"))
}

/// Writes a waiter `ghost` at the front of the waiter queue `queue` (places in `dues`), its place
/// ending `place_ms` after the server's clock now: a live waiter that never retries.
fn queue_ghost(port: u16, queue: &str, dues: &str, place_ms: i64) {
    queue_ghosts(port, queue, dues, place_ms, &["ghost"]);
}

/// As [`queue_ghost`] for several waiters, queued in the order given.
fn queue_ghosts(port: u16, queue: &str, dues: &str, place_ms: i64, ghosts: &[&str]) {
    let time = harness::cmd_ok(port, &["TIME"]);
    let field = |i: usize| {
        time.as_array()
            .and_then(|t| t.get(i))
            .and_then(|s| s.as_str())
            .and_then(|s| s.parse::<i64>().ok())
            .expect("TIME")
    };
    let due = (field(0) * 1000 + field(1) / 1000 + place_ms).to_string();
    for (place, ghost) in ghosts.iter().enumerate() {
        harness::cmd_ok(port, &["ZADD", queue, &place.to_string(), ghost]);
        harness::cmd_ok(port, &["ZADD", dues, &due, ghost]);
    }
}

/// The cardinality of the sorted set `key` (-1 when the server does not answer).
fn zcard(port: u16, key: &str) -> i64 {
    harness::cmd(port, &["ZCARD", key])
        .ok()
        .and_then(|r| r.as_int())
        .unwrap_or(-1)
}

/// What a queue test waits on: a mutex, a one-permit semaphore or the read-write lock's writer.
#[derive(Clone)]
enum Queued {
    Mutex(Locks<str>),
    Permit(sage_lock::Semaphores<str>),
    Write(sage_lock::RwLocks<str>),
}

impl Queued {
    /// `primitive` (`"semaphore"` or `"write"`) on `client`, in `ns`.
    fn new(primitive: &str, client: &LockClient, ns: &str) -> Self {
        match primitive {
            "semaphore" => Queued::Permit(semaphore(client, ns)),
            _ => Queued::Write(rw_locks(client, ns)),
        }
    }

    async fn hold<F: Future>(
        &self,
        key: &str,
        wait: Duration,
        body: F,
    ) -> Result<F::Output, sage_lock::LockError> {
        match self {
            Queued::Mutex(locks) => locks.with_lock(key, wait, body).await,
            Queued::Permit(sem) => sem.acquire(key, wait, body).await,
            Queued::Write(rw) => rw.write(key, wait, body).await,
        }
    }

    async fn try_hold(&self, key: &str) -> Option<()> {
        match self {
            Queued::Mutex(locks) => locks.try_with_lock(key, async {}).await,
            Queued::Permit(sem) => sem.try_acquire(key, async {}).await,
            Queued::Write(rw) => rw.try_write(key, async {}).await,
        }
        .expect("try")
    }

    /// The suffixes of the queue and of its places (the mutex's queue is a list).
    fn queue_keys(&self) -> [&'static str; 2] {
        match self {
            Queued::Mutex(_) => ["queue", "waiters"],
            Queued::Permit(_) => ["sem-queue", "sem-due"],
            Queued::Write(_) => ["wq", "wd"],
        }
    }
}

/// Holds `key` through `holder` until the returned sender fires; resolves once held. The task
/// resolves to the instant the body ended.
async fn hold_queued(
    holder: &Queued,
    key: &str,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Instant>,
) {
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let (holder, key) = (holder.clone(), key.to_owned());
    let task = tokio::spawn(async move {
        holder
            .hold(&key, Duration::from_secs(10), async move {
                let _ = held_tx.send(());
                let _ = release_rx.await;
                Instant::now()
            })
            .await
            .expect("hold")
    });
    held_rx.await.expect("held");
    (release_tx, task)
}
