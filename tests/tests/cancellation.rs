//! Cancellation of waiters and holders under contention, for the read-write lock, the semaphore
//! and the multi-key lock: callers in two clients (two processes, as far as the locks can tell)
//! contend for one key (three, for `with_locks`), and most of them are cancelled, by
//! `tokio::time::timeout` or `JoinHandle::abort`, at times spread over the first 20 ms, so the
//! cancellation lands before, during and after the acquire round trip, while queued, during a
//! hand-off and in the body.
//!
//! Asserted: exclusion is never broken; once a wave of callers has ended, nothing of theirs is
//! left on the server (no holder, reader, permit or queue place: only the fencing counters and
//! the mutex's grant markers, which are meant to stay) well before a dead waiter's place would
//! end on its own (1 s for the read-write lock, 2 s otherwise), and a `try_*` call of the
//! conflicting kind gets in at once; no local waiter bookkeeping is left and the clients hold no
//! more connections than their shared and subscriber ones (and, replicated, their pools). The
//! storms run on a standalone server and a primary with a replica, and `with_locks`'s in a
//! cluster too. A holder cancelled mid-body lets the next waiter in at once, a waiter cancelled
//! while a release hands it the lock passes it on at once, not after the hand-off lease, and a
//! waiter cancelled while it subscribes to its release channel leaves no subscription behind.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use harness::{Cluster, Replicated, Server, ServerKind, connected_clients, settle_clients};
use sage_lock::{LockClient, LockError, LockOptions, Locks, RwLocks, Semaphores};
use tokio::sync::oneshot;

/// Permits of the semaphore under test.
const PERMITS: u32 = 2;
/// Callers per wave (half in each client) and waves per primitive and server.
const WAVE: usize = 12;
const WAVES: usize = 25;
/// How long a wave's leftovers may take to go (background releases): well below the shortest
/// place a dead waiter keeps (the read-write lock's `WRITER_INTENT`, 1 s), so a place left
/// behind is seen before it could expire.
const SETTLE: Duration = Duration::from_millis(600);
/// The lease of every hold: far longer than the test, so a hold left behind never expires in
/// time to hide.
const LEASE: Duration = Duration::from_secs(20);
/// The multi-key lock's keys.
const MULTI_KEYS: [&str; 3] = ["a", "b", "c"];
/// Every key any test here locks.
const MULTI_KEYS_AND_K: [&str; 4] = ["a", "b", "c", "k"];

type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The primitive under test, one family per client.
#[derive(Clone)]
enum Primitive {
    Semaphore(Semaphores<str>),
    RwLock(RwLocks<str>),
    Multi(Locks<str>),
}

impl Primitive {
    /// The family `name` ("semaphore" of `permits`, "rwlock" or "multi") on `client`.
    fn new(name: &str, client: &LockClient, namespace: &str, permits: u32) -> Primitive {
        let options = LockOptions::new().namespace(namespace).lease(LEASE);
        match name {
            "semaphore" => {
                Primitive::Semaphore(client.semaphore_with(permits, options).expect("opts"))
            }
            "rwlock" => Primitive::RwLock(client.rw_lock_with(options).expect("opts")),
            "multi" => Primitive::Multi(client.lock_with(options).expect("opts")),
            other => panic!("no primitive {other}"),
        }
    }

    /// `op` on this family (key `k`, or [`MULTI_KEYS`] by index), waiting up to `wait`, or
    /// with `None` not waiting (`Ok(None)`: busy).
    fn run<T: Send + 'static>(
        &self,
        op: &Op,
        wait: Option<Duration>,
        body: impl Future<Output = T> + Send + 'static,
    ) -> Boxed<Result<Option<T>, LockError>> {
        fn waited<T>(
            call: impl Future<Output = Result<T, LockError>> + Send + 'static,
        ) -> Boxed<Result<Option<T>, LockError>> {
            Box::pin(async move { call.await.map(Some) })
        }
        let names = |keys: &[usize]| -> Vec<&str> { keys.iter().map(|&k| MULTI_KEYS[k]).collect() };
        match (self, op, wait) {
            (Primitive::Semaphore(sem), Op::Permit, Some(wait)) => {
                waited(sem.acquire("k", wait, body))
            }
            (Primitive::Semaphore(sem), Op::Permit, None) => Box::pin(sem.try_acquire("k", body)),
            (Primitive::RwLock(rw), Op::Write, Some(wait)) => waited(rw.write("k", wait, body)),
            (Primitive::RwLock(rw), Op::Write, None) => Box::pin(rw.try_write("k", body)),
            (Primitive::RwLock(rw), Op::Read, Some(wait)) => waited(rw.read("k", wait, body)),
            (Primitive::RwLock(rw), Op::Read, None) => Box::pin(rw.try_read("k", body)),
            (Primitive::Multi(locks), Op::Keys(keys), Some(wait)) if keys.len() == 1 => {
                waited(locks.with_lock(MULTI_KEYS[keys[0]], wait, body))
            }
            (Primitive::Multi(locks), Op::Keys(keys), None) if keys.len() == 1 => {
                Box::pin(locks.try_with_lock(MULTI_KEYS[keys[0]], body))
            }
            (Primitive::Multi(locks), Op::Keys(keys), Some(wait)) => {
                waited(locks.with_locks(&names(keys), wait, body))
            }
            (Primitive::Multi(locks), Op::Keys(keys), None) => {
                Box::pin(locks.try_with_locks(&names(keys), body))
            }
            (_, op, _) => panic!("{op:?} is not a call of this primitive"),
        }
    }

    /// Storm caller `i`'s call: a permit; a write (every third caller) or a read; two or three
    /// of the keys, or one of them alone (`with_lock`, every fifth caller), waiting up to
    /// `wait` (or with `None`, not waiting). The body holds the call's [`Exclusion`] for
    /// `hold`. A `TimedOut` is an outcome; any other error fails the test.
    fn call(
        &self,
        i: usize,
        wait: Option<Duration>,
        hold: Duration,
        ex: &Arc<Exclusion>,
    ) -> Boxed<Outcome> {
        let op = self.op(i);
        let body = {
            let ex = Arc::clone(ex);
            let op = op.clone();
            async move {
                let _inside = ex.enter(op);
                tokio::time::sleep(hold).await;
            }
        };
        let call = self.run(&op, wait, body);
        Box::pin(async move {
            match call.await {
                Ok(Some(())) => Outcome::Ran,
                Ok(None) => Outcome::Refused,
                Err(LockError::TimedOut { .. }) => Outcome::TimedOut,
                Err(e) => panic!("caller {i}: {e}"),
            }
        })
    }

    fn op(&self, i: usize) -> Op {
        match self {
            Primitive::Semaphore(_) => Op::Permit,
            Primitive::RwLock(_) if i.is_multiple_of(3) => Op::Write,
            Primitive::RwLock(_) => Op::Read,
            Primitive::Multi(_) => Op::Keys(match i % 5 {
                0 => vec![1],
                1 => vec![0, 1],
                2 => vec![1, 2],
                3 => vec![2, 0],
                _ => vec![0, 1, 2],
            }),
        }
    }

    /// Whether a caller that does not wait gets in at once, in the most demanding kind: every
    /// permit, the write lock, all keys. Refused while any hold or live queue place is left.
    async fn enters_at_once(&self) -> bool {
        match self {
            Primitive::Semaphore(sem) => {
                let sem = sem.clone();
                let nested = sem.clone();
                sem.try_acquire("k", async move {
                    nested.try_acquire("k", async {}).await.expect("try")
                })
                .await
                .expect("try")
                .is_some_and(|inner| inner.is_some())
            }
            Primitive::RwLock(rw) => rw.try_write("k", async {}).await.expect("try").is_some(),
            Primitive::Multi(locks) => locks
                .try_with_locks(&MULTI_KEYS, async {})
                .await
                .expect("try")
                .is_some(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Op {
    Permit,
    Read,
    Write,
    Keys(Vec<usize>),
}

/// Who is inside a body: permits, readers and writers, holders of each key. Every entry that
/// breaks exclusion is counted.
#[derive(Default)]
struct Exclusion {
    permits: AtomicUsize,
    readers: AtomicUsize,
    writers: AtomicUsize,
    keys: [AtomicUsize; 3],
    violations: AtomicUsize,
    entered: AtomicUsize,
}

/// Inside a body until dropped (the body finished or was cancelled).
struct Inside {
    ex: Arc<Exclusion>,
    op: Op,
}

impl Exclusion {
    fn enter(self: &Arc<Self>, op: Op) -> Inside {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let broken = match &op {
            Op::Permit => self.permits.fetch_add(1, Ordering::SeqCst) >= PERMITS as usize,
            Op::Read => {
                self.readers.fetch_add(1, Ordering::SeqCst);
                self.writers.load(Ordering::SeqCst) > 0
            }
            Op::Write => {
                let writers = self.writers.fetch_add(1, Ordering::SeqCst);
                writers > 0 || self.readers.load(Ordering::SeqCst) > 0
            }
            Op::Keys(keys) => keys
                .iter()
                .map(|&k| self.keys[k].fetch_add(1, Ordering::SeqCst))
                .any(|before| before > 0),
        };
        if broken {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        Inside {
            ex: Arc::clone(self),
            op,
        }
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let ex = &self.ex;
        match &self.op {
            Op::Permit => drop(ex.permits.fetch_sub(1, Ordering::SeqCst)),
            Op::Read => drop(ex.readers.fetch_sub(1, Ordering::SeqCst)),
            Op::Write => drop(ex.writers.fetch_sub(1, Ordering::SeqCst)),
            Op::Keys(keys) => {
                for &k in keys {
                    ex.keys[k].fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
    }
}

/// How caller `i` ends. Two in ten run to the end (waiting up to 5 s, so the others contend
/// with live holders); four in ten are cut by `timeout` and two in ten aborted, after 0–20 ms;
/// one in ten waits only 1–20 ms itself, and is cut 0–2 ms after that (so before, during or
/// after its own timeout's clean-up); one in ten does not wait (a `try_*`), cut after 0–20 ms.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Runs,
    TimeoutAfter(Duration),
    AbortAfter(Duration),
    ShortWait(Duration),
    Try(Duration),
}

fn ending(i: usize) -> Ending {
    let cut = Duration::from_micros((i as u64 * 7919) % 20_000);
    match i % 10 {
        0 | 5 => Ending::Runs,
        3 | 8 => Ending::AbortAfter(cut),
        4 => Ending::ShortWait(cut.max(Duration::from_millis(1))),
        7 => Ending::Try(cut),
        _ => Ending::TimeoutAfter(cut),
    }
}

/// How a storm caller ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ran,
    /// A `try_*` found it busy.
    Refused,
    /// Its own wait ran out.
    TimedOut,
    Cancelled,
}

/// What the callers of a storm did.
#[derive(Debug, Default)]
struct Tally {
    completed: usize,
    refused: usize,
    timed_out: usize,
    cancelled: usize,
    /// The longest a wave's leftovers took to go.
    slowest_settle: Duration,
    /// Keys seen right after a wave ended, before its background releases were through.
    seen_before_settle: usize,
}

/// Server keys of `namespace` on the primaries `ports` other than the ones meant to stay
/// (fencing counters, the mutex's grant markers), each with its type, TTL and content.
fn leftovers(ports: &[u16], namespace: &str) -> Vec<String> {
    let pattern = format!("{{{namespace}:*");
    let mut left = Vec::new();
    for &port in ports {
        let mut cursor = "0".to_owned();
        loop {
            let reply =
                harness::cmd_ok(port, &["SCAN", &cursor, "MATCH", &pattern, "COUNT", "1000"]);
            let parts = reply.as_array().expect("SCAN reply");
            cursor = parts[0].to_text().expect("cursor");
            for key in parts[1].as_array().expect("SCAN keys") {
                let key = key.to_text().expect("key");
                if key.ends_with(":fence") || key.ends_with(":since") {
                    continue;
                }
                let kind = harness::cmd_ok(port, &["TYPE", &key]).to_plain();
                let content = match kind.as_str() {
                    "zset" => harness::cmd_ok(port, &["ZRANGE", &key, "0", "-1", "WITHSCORES"]),
                    "list" => harness::cmd_ok(port, &["LRANGE", &key, "0", "-1"]),
                    _ => harness::cmd_ok(port, &["GET", &key]),
                }
                .to_plain();
                let pttl = harness::cmd_ok(port, &["PTTL", &key]).to_plain();
                left.push(format!("{key} ({kind}, pttl {pttl} ms): {content}"));
            }
            if cursor == "0" {
                break;
            }
        }
    }
    left
}

/// Where the tests run: a standalone server, a primary with a replica, or a cluster.
#[derive(Clone)]
struct Deployment {
    label: String,
    url: String,
    replicated: bool,
    /// Every primary (each scanned for leftovers).
    primaries: Vec<u16>,
    /// The primary serving a server key.
    owner: Arc<dyn Fn(&str) -> u16 + Send + Sync>,
    /// The primary whose connections are counted, and how many above its baseline two
    /// clients may keep open there (none counted in a cluster).
    connections: Option<(u16, i64)>,
}

impl Deployment {
    fn standalone(server: &Server, kind: ServerKind) -> Deployment {
        let port = server.port();
        Deployment {
            label: format!("standalone {}", kind.name()),
            url: server.url(),
            replicated: false,
            primaries: vec![port],
            owner: Arc::new(move |_| port),
            // Each client: its shared connection and its subscriber connection.
            connections: Some((port, 4)),
        }
    }

    fn replicated(setup: &Replicated, kind: ServerKind) -> Deployment {
        let port = setup.primary.port();
        Deployment {
            label: format!("replicated {}", kind.name()),
            url: setup.primary_url(),
            replicated: true,
            primaries: vec![port],
            owner: Arc::new(move |_| port),
            // Each client: shared, subscriber, and at most its pool of dedicated connections
            // (16 by default), in flight or idle.
            connections: Some((port, 2 * (2 + 16))),
        }
    }

    fn cluster(cluster: &'static Cluster, kind: ServerKind) -> Deployment {
        let owners = std::sync::Mutex::new(std::collections::HashMap::<String, u16>::new());
        Deployment {
            label: format!("cluster {}", kind.name()),
            url: cluster.url(),
            replicated: false,
            primaries: [0, 5461, 10923]
                .map(|slot| cluster.primary_for_slot(slot).port())
                .to_vec(),
            // Asked once per key (the topology does not change here).
            owner: Arc::new(move |key: &str| {
                let mut known = owners.lock().expect("owners");
                *known
                    .entry(key.to_owned())
                    .or_insert_with(|| cluster.primary_for_key(key).port())
            }),
            connections: None,
        }
    }

    async fn client(&self) -> LockClient {
        LockClient::builder()
            .url(&self.url)
            .replicated(self.replicated)
            .connect()
            .await
            .expect("connect")
    }
}

/// The suffixes of the waiter queues: the semaphore's, the read-write lock's writers' and
/// readers', the mutex's (which `with_locks` joins).
const QUEUES: [&str; 4] = [":sem-queue", ":wq", ":rq", ":queue"];

/// The distinct tokens queued in any waiter queue of `namespace`'s key `key`.
fn queued(
    owner: &(dyn Fn(&str) -> u16 + Send + Sync),
    namespace: &str,
    keys: &[&str],
) -> std::collections::BTreeSet<String> {
    let mut tokens = std::collections::BTreeSet::new();
    for key in keys {
        let port = owner(&format!("{{{namespace}:{key}}}"));
        for suffix in QUEUES {
            let queue = format!("{{{namespace}:{key}}}{suffix}");
            let range = if suffix == ":queue" {
                "LRANGE"
            } else {
                "ZRANGE"
            };
            // A server gone (a failed test's teardown) has nobody queued.
            let members = harness::cmd(port, &[range, &queue, "0", "-1"]);
            let members = members.as_ref().ok().and_then(harness::Reply::as_array);
            for member in members.unwrap_or_default() {
                tokens.extend(member.to_text());
            }
        }
    }
    tokens
}

/// Polls until at least `n` tokens are queued on `keys` of `namespace` (at most 5 s).
async fn until_queued(dep: &Deployment, namespace: &str, keys: &[&str], n: usize, who: &str) {
    let start = Instant::now();
    while queued(&*dep.owner, namespace, keys).len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{who}: never {n} queued"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Watches `namespace` from a thread while a storm runs: the most tokens ever queued at once,
/// so the storm can tell that its waiters queued on the server. Stops when dropped.
struct Sampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Sampler {
    fn start(dep: &Deployment, namespace: &str, keys: &'static [&'static str]) -> Sampler {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let namespace = namespace.to_owned();
        let owner = Arc::clone(&dep.owner);
        let thread = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let mut most = 0;
                while !stop.load(Ordering::Relaxed) {
                    most = most.max(queued(&*owner, &namespace, keys).len());
                    std::thread::sleep(Duration::from_millis(1));
                }
                most
            }
        });
        Sampler {
            stop,
            thread: Some(thread),
        }
    }

    /// The most tokens queued at once.
    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map_or(0, |thread| thread.join().expect("sampler"))
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Runs caller `i` of `family`, ending as [`ending`] says.
async fn caller(family: Primitive, i: usize, hold: Duration, ex: Arc<Exclusion>) -> Outcome {
    let end = ending(i);
    let wait = match end {
        Ending::Runs | Ending::TimeoutAfter(_) | Ending::AbortAfter(_) => {
            Some(Duration::from_secs(5))
        }
        Ending::ShortWait(wait) => Some(wait),
        Ending::Try(_) => None,
    };
    let call = family.call(i, wait, hold, &ex);
    let cut = |after: Duration, call: Boxed<Outcome>| async move {
        tokio::time::timeout(after, call)
            .await
            .unwrap_or(Outcome::Cancelled)
    };
    match end {
        Ending::Runs => call.await,
        Ending::TimeoutAfter(after) | Ending::Try(after) => cut(after, call).await,
        Ending::ShortWait(wait) => {
            cut(wait + Duration::from_micros((i as u64 * 613) % 2_000), call).await
        }
        Ending::AbortAfter(after) => {
            let task = tokio::spawn(call);
            tokio::time::sleep(after).await;
            task.abort();
            match task.await {
                Ok(outcome) => outcome,
                Err(e) if e.is_cancelled() => Outcome::Cancelled,
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
    }
}

/// [`WAVES`] waves of [`WAVE`] callers of `primitive` on `dep`, alternating between two
/// clients, most of them cancelled; after each wave, the server is clean within [`SETTLE`] and
/// a caller that does not wait gets in.
async fn storm(primitive: &str, dep: &Deployment) {
    let name = format!("{primitive} on {}", dep.label);
    let ports = dep.primaries.clone();
    let baseline = dep.connections.map(|(port, _)| connected_clients(port));
    let namespace = format!("cancel-{primitive}-{}", rand::random::<u32>());
    let clients = [dep.client().await, dep.client().await];
    let families = clients
        .each_ref()
        .map(|client| Primitive::new(primitive, client, &namespace, PERMITS));
    let ex = Arc::new(Exclusion::default());
    // The detector sees a hold.
    let seen = families[0]
        .run(&families[0].op(1), Some(Duration::from_secs(2)), {
            let (ports, namespace) = (ports.clone(), namespace.clone());
            async move { leftovers(&ports, &namespace) }
        })
        .await
        .expect("a first hold")
        .unwrap_or_default();
    assert!(
        !seen.is_empty(),
        "{name}: a hold left no trace on the server"
    );
    let sampler = Sampler::start(dep, &namespace, &MULTI_KEYS_AND_K);
    let mut tally = Tally::default();
    for wave in 0..WAVES {
        let mut tasks = Vec::new();
        for j in 0..WAVE {
            let i = wave * WAVE + j;
            let hold = Duration::from_micros((i as u64 * 4243) % 10_000);
            let family = families[j % 2].clone();
            tasks.push(tokio::spawn(caller(family, i, hold, Arc::clone(&ex))));
            if j % 3 == 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        for task in tasks {
            match task.await.expect("caller") {
                Outcome::Ran => tally.completed += 1,
                Outcome::Refused => tally.refused += 1,
                Outcome::TimedOut => tally.timed_out += 1,
                Outcome::Cancelled => tally.cancelled += 1,
            }
        }
        let ended = Instant::now();
        let mut left = leftovers(&ports, &namespace);
        tally.seen_before_settle += left.len();
        while !left.is_empty() && ended.elapsed() < SETTLE {
            tokio::time::sleep(Duration::from_millis(5)).await;
            left = leftovers(&ports, &namespace);
        }
        tally.slowest_settle = tally.slowest_settle.max(ended.elapsed());
        assert!(
            left.is_empty(),
            "{name}, wave {wave}: {} after the callers ended, left on the server:\n{}",
            humanize(ended.elapsed()),
            left.join("\n")
        );
        for (c, client) in clients.iter().enumerate() {
            assert_eq!(
                sage_lock::__private::waiter_keys(client),
                0,
                "{name}, wave {wave}: client {c} still has local waiters"
            );
        }
        assert!(
            families[wave % 2].enters_at_once().await,
            "{name}, wave {wave}: a caller that does not wait was refused on a clean server"
        );
    }
    let most_queued = sampler.finish();
    // The sampler opened a connection per command: the server may count some it has not yet
    // seen closed (a busy machine). Wait for those, up to 2 s; the clients' own stay counted.
    let open = match (dep.connections, baseline) {
        (Some((port, allowed)), Some(baseline)) => {
            Some(settle_clients(port, baseline + allowed, Duration::from_secs(2)).await)
        }
        _ => None,
    };
    let stats = clients.each_ref().map(LockClient::stats);
    let (busy, handoffs) = (
        stats[0].busy_retries + stats[1].busy_retries,
        stats[0].handoffs + stats[1].handoffs,
    );
    println!(
        "{name}: {} callers, {} cancelled, {} ran to the end, {} tries refused, {} timed out, \
         {} bodies entered; \
         {busy} busy attempts, {handoffs} hand-offs, at most {most_queued} queued at once; \
         {} keys seen as waves ended, all gone within {:?} at most; \
         connections {open:?} (baseline {baseline:?})",
        WAVE * WAVES,
        tally.cancelled,
        tally.completed,
        tally.refused,
        tally.timed_out,
        ex.entered.load(Ordering::SeqCst),
        tally.seen_before_settle,
        tally.slowest_settle,
    );
    // A replica-acknowledged waiter (replicated, cluster) confirms its hand-offs with an
    // attempt of its own, which counts as a grant, not a hand-off.
    let confirms = clients[0].deployment().is_replicated();
    assert!(
        most_queued >= 2 && (handoffs > 0 || confirms),
        "{name}: the waiters of both clients never queued on the server together \
         ({most_queued} at most) or were never handed the lock ({handoffs})"
    );
    assert_eq!(
        ex.violations.load(Ordering::SeqCst),
        0,
        "{name}: exclusion broken"
    );
    assert!(
        tally.cancelled >= WAVE * WAVES / 3,
        "{name}: only {} callers were cancelled",
        tally.cancelled
    );
    drop(families);
    drop(clients);
    if let (Some((port, allowed)), Some(baseline), Some(open)) = (dep.connections, baseline, open) {
        assert!(
            open <= baseline + allowed,
            "{name}: {open} connections open, baseline {baseline} + {allowed} for two clients:\n{}",
            harness::cmd(port, &["CLIENT", "LIST"])
                .ok()
                .and_then(|list| list.to_text())
                .unwrap_or_default()
        );
        let left = settle_clients(port, baseline, Duration::from_secs(5)).await;
        assert!(
            left <= baseline,
            "{name}: {left} connections after dropping the clients (baseline {baseline})"
        );
    }
}

/// [`storm`] on a standalone server of each kind.
async fn storm_standalone(primitive: &str) {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        storm(primitive, &Deployment::standalone(&server, kind)).await;
    }
}

fn humanize(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_semaphore_callers_leave_nothing_behind() {
    storm_standalone("semaphore").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_read_write_callers_leave_nothing_behind() {
    storm_standalone("rwlock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_multi_key_callers_leave_nothing_behind() {
    storm_standalone("multi").await;
}

/// The storms on a primary with a replica: every attempt runs on a dedicated connection with
/// `WAIT`, a cancelled one cleans up on it, and a hand-off is confirmed by an attempt of the
/// waiter's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_callers_leave_nothing_behind_on_a_replicated_deployment() {
    for kind in ServerKind::ALL {
        let setup = Replicated::start(kind, 1);
        for primitive in ["semaphore", "rwlock", "multi"] {
            storm(primitive, &Deployment::replicated(&setup, kind)).await;
        }
    }
}

/// The multi-key storm in a cluster, where the keys' slots are taken one after the other and
/// a waiting caller holds the earlier slots' keys while it waits for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_multi_key_callers_leave_nothing_behind_in_a_cluster() {
    for kind in ServerKind::ALL {
        let cluster = harness::shared_cluster(kind);
        storm("multi", &Deployment::cluster(cluster, kind)).await;
    }
}

/// A call in a task whose body reports when it entered, then holds until it is cancelled.
struct Running {
    entered: oneshot::Receiver<Instant>,
    cancel: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Starts `op` on `family`, waiting up to 10 s.
    fn start(family: &Primitive, op: &Op) -> Running {
        let (entered_tx, entered) = oneshot::channel();
        let (cancel, cancelled) = oneshot::channel::<()>();
        let call = family.run(op, Some(Duration::from_secs(10)), async move {
            let _ = entered_tx.send(Instant::now());
            std::future::pending::<()>().await;
        });
        let task = tokio::spawn(async move {
            tokio::select! {
                result = call => panic!("the body never ends: {:?}", result.map(|_| ())),
                _ = cancelled => {}
            }
        });
        Running {
            entered,
            cancel,
            task,
        }
    }

    /// Cancels the call now: `JoinHandle::abort`, or its future dropped inside the task (as
    /// `tokio::time::timeout` drops it). Returns when.
    async fn cancel(self, by_abort: bool) -> Instant {
        let at = Instant::now();
        if by_abort {
            self.task.abort();
        } else {
            let _ = self.cancel.send(());
        }
        match self.task.await {
            Ok(()) => {}
            Err(e) if e.is_cancelled() => {}
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
        at
    }
}

/// When `running`'s body entered (at most 5 s from now).
async fn entered(running: &mut Running, who: &str) -> Instant {
    tokio::time::timeout(Duration::from_secs(5), &mut running.entered)
        .await
        .unwrap_or_else(|_| panic!("{who} did not enter within 5 s"))
        .expect("entered")
}

/// One case: which primitive, what the holder, the first waiter and the waiter behind it call.
struct Case {
    primitive: &'static str,
    holder: Op,
    first: Op,
    behind: Op,
}

fn cases() -> Vec<Case> {
    let case = |primitive, holder, first, behind| Case {
        primitive,
        holder,
        first,
        behind,
    };
    let keys = |k: &[usize]| Op::Keys(k.to_vec());
    vec![
        case("semaphore", Op::Permit, Op::Permit, Op::Permit),
        case("rwlock", Op::Write, Op::Write, Op::Write),
        case("rwlock", Op::Write, Op::Read, Op::Write),
        case("rwlock", Op::Write, Op::Write, Op::Read),
        case("rwlock", Op::Read, Op::Write, Op::Write),
        case("multi", keys(&[0, 1]), keys(&[0, 1]), keys(&[0])),
        case("multi", keys(&[0, 1]), keys(&[0]), keys(&[0, 1])),
        case("multi", keys(&[0, 1]), keys(&[1, 2]), keys(&[1])),
    ]
}

impl Case {
    fn name(&self, kind: ServerKind) -> String {
        format!(
            "{} on {}: {:?} held, {:?} waits, {:?} behind",
            self.primitive,
            kind.name(),
            self.holder,
            self.first,
            self.behind
        )
    }
}

/// Three clients of one server, each with a one-permit family of `primitive` in `namespace`.
async fn three(dep: &Deployment, primitive: &str, namespace: &str) -> [Primitive; 3] {
    let mut families = Vec::new();
    for _ in 0..3 {
        let client = dep.client().await;
        families.push(Primitive::new(primitive, &client, namespace, 1));
    }
    families.try_into().unwrap_or_else(|_| unreachable!())
}

/// The median and the longest of `gaps`.
fn spread(gaps: &mut [Duration]) -> (Duration, Duration) {
    gaps.sort();
    (gaps[gaps.len() / 2], gaps[gaps.len() - 1])
}

/// How soon after a cancellation the next caller must enter: a release round trip and a
/// hand-off take about a millisecond here; a waiter left to its poll would take up to 500 ms,
/// one behind a hold left to expire (or a hand-off to a dead waiter) the hand-off lease, 2 s.
const PROMPT: Duration = Duration::from_millis(300);

/// A holder cancelled mid-body (aborted, or its future dropped) lets the waiter of another
/// client in at once, long before its 20 s lease would end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cancelled_mid_body_lets_the_next_waiter_in_at_once() {
    const ROUNDS: usize = 6;
    for kind in ServerKind::ALL {
        let dep = Deployment::standalone(harness::shared(kind), kind);
        for case in cases() {
            let name = case.name(kind);
            let namespace = format!("cancel-holder-{}", rand::random::<u32>());
            let families = three(&dep, case.primitive, &namespace).await;
            let mut gaps = Vec::new();
            for round in 0..ROUNDS {
                let mut holder = Running::start(&families[0], &case.holder);
                entered(&mut holder, &name).await;
                let mut waiter = Running::start(&families[1], &case.first);
                until_queued(&dep, &namespace, &MULTI_KEYS_AND_K, 1, &name).await;
                let cancelled = holder.cancel(round % 2 == 0).await;
                let entry = entered(&mut waiter, &name).await;
                gaps.push(entry.saturating_duration_since(cancelled));
                waiter.cancel(true).await;
            }
            let (median, longest) = spread(&mut gaps);
            println!(
                "{name}: the waiter entered {median:?} (median), {longest:?} (longest) after the holder was cancelled"
            );
            assert!(
                longest < PROMPT,
                "{name}: a waiter entered {longest:?} after its holder was cancelled: {gaps:?}"
            );
            settled(&dep.primaries, &namespace, &name).await;
        }
    }
}

/// A waiter cancelled around the moment a release hands it the lock (0–4 ms after the
/// release, in 200 µs steps, so before, during and after the hand-off arrives) passes it on
/// to the waiter behind it at once, not after the hand-off lease. The waiter behind is in a
/// third client, or in the releasing one (whose release reply names it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cancelled_during_its_hand_off_passes_it_on_at_once() {
    const ROUNDS: u64 = 20;
    for kind in ServerKind::ALL {
        let dep = Deployment::standalone(harness::shared(kind), kind);
        for case in cases() {
            let name = case.name(kind);
            let namespace = format!("cancel-handoff-{}", rand::random::<u32>());
            let families = three(&dep, case.primitive, &namespace).await;
            let mut gaps = Vec::new();
            let mut first_entered = 0;
            for round in 0..ROUNDS {
                let mut holder = Running::start(&families[0], &case.holder);
                entered(&mut holder, &name).await;
                let mut first = Running::start(&families[1], &case.first);
                until_queued(&dep, &namespace, &MULTI_KEYS_AND_K, 1, &name).await;
                let mut behind = Running::start(&families[2 * (round as usize % 2)], &case.behind);
                until_queued(&dep, &namespace, &MULTI_KEYS_AND_K, 2, &name).await;
                let delay = Duration::from_micros(round * 200);
                let released = holder.cancel(round % 3 == 0).await;
                while released.elapsed() < delay {
                    tokio::task::yield_now().await;
                }
                if first.entered.try_recv().is_ok() {
                    first_entered += 1;
                }
                let cancelled = first.cancel(round % 2 == 1).await;
                let entry = entered(&mut behind, &name).await;
                gaps.push(entry.saturating_duration_since(cancelled));
                behind.cancel(true).await;
            }
            let (median, longest) = spread(&mut gaps);
            println!(
                "{name}: the caller behind entered {median:?} (median), {longest:?} (longest) \
                 after the first waiter was cancelled; {first_entered} of {ROUNDS} first \
                 waiters had entered"
            );
            assert!(
                longest < PROMPT,
                "{name}: the caller behind a cancelled waiter entered {longest:?} after it: {gaps:?}"
            );
            settled(&dep.primaries, &namespace, &name).await;
        }
    }
}

/// Nothing of `namespace` is left on the server within [`SETTLE`].
async fn settled(ports: &[u16], namespace: &str, name: &str) {
    let start = Instant::now();
    let mut left = leftovers(ports, namespace);
    while !left.is_empty() && start.elapsed() < SETTLE {
        tokio::time::sleep(Duration::from_millis(5)).await;
        left = leftovers(ports, namespace);
    }
    assert!(
        left.is_empty(),
        "{name}: left on the server:\n{}",
        left.join("\n")
    );
}

/// Waiters cancelled while they subscribe to their release channel (each on a key of its own,
/// so each subscribes afresh; cut 0–3 ms in, spread over the subscription's round trip) leave
/// no subscription behind once the channels' linger is over. A waiter cancelled before its
/// `SSUBSCRIBE` was confirmed used to drop the channel from the client's books while the server
/// kept the subscription, for the life of the subscriber connection (1–20 of 180 channels).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_cancelled_while_subscribing_leave_no_subscription() {
    const KEYS: u64 = 60;
    let mut leaks = Vec::new();
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let dep = Deployment::standalone(server, kind);
        let prefix = format!("cancel-sub-{}", rand::random::<u32>());
        let (holding, waiting) = (dep.client().await, dep.client().await);
        let mut cancelled = 0;
        // The mutex (`with_lock`, a multi-key family's call of one key) shares the notifier.
        for (label, primitive, op) in [
            ("semaphore", "semaphore", Op::Permit),
            ("rwlock", "rwlock", Op::Write),
            ("multi", "multi", Op::Keys(vec![0, 1])),
            ("mutex", "multi", Op::Keys(vec![0])),
        ] {
            for i in 0..KEYS {
                let namespace = format!("{prefix}-{label}-{i}");
                let holder_family = Primitive::new(primitive, &holding, &namespace, 1);
                let waiter_family = Primitive::new(primitive, &waiting, &namespace, 1);
                let mut holder = Running::start(&holder_family, &op);
                entered(&mut holder, label).await;
                let cut = Duration::from_micros(i * 50);
                let wait = waiter_family.run(&op, Some(Duration::from_secs(5)), async {});
                if tokio::time::timeout(cut, wait).await.is_err() {
                    cancelled += 1;
                }
                holder.cancel(true).await;
            }
        }
        let channels = || {
            let pattern = format!("{{{prefix}-*");
            let reply = harness::cmd_ok(server.port(), &["PUBSUB", "SHARDCHANNELS", &pattern]);
            let names = reply.as_array().unwrap_or_default();
            names
                .iter()
                .filter_map(harness::Reply::to_text)
                .collect::<Vec<_>>()
        };
        let subscribed = channels().len();
        // Idle channels are dropped LINGER (2 s) after their last waiter, by a sweep every 1 s.
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let left = channels();
        println!(
            "{}: {cancelled} of {} waiters cancelled; {subscribed} channels subscribed right \
             after, {} after the linger: {left:?}",
            kind.name(),
            4 * KEYS,
            left.len()
        );
        assert!(
            subscribed > 0,
            "{}: no waiter subscribed before it was cancelled",
            kind.name()
        );
        if !left.is_empty() {
            leaks.push(format!("{}: {}", kind.name(), left.len()));
        }
        waiting.quit().await;
        holding.quit().await;
    }
    assert!(
        leaks.is_empty(),
        "subscriptions left behind by cancelled waiters: {leaks:?}"
    );
}
