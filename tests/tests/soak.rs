//! A long-running service's resources: a service that runs for days and locks unique keys
//! (`order:{uuid}`) must not keep anything per key, per waiter, per channel or per task once it
//! goes idle. Each test starts servers of its own, so connection, channel and key counts are its
//! own; the counts inside a client come from `sage_lock::__private::resident`.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use harness::{Server, ServerKind, connected_clients};
use sage_lock::__private::{Resident, resident};
use sage_lock::{LockClient, LockError, LockOptions, Locks, RwLocks, Semaphores};

/// Rounds of work; the first warms up (opens each client's subscriber connection, starts its
/// renewer), the state after it is the baseline the later ones must come back to.
const ROUNDS: usize = 4;
/// Keys per primitive per round.
const KEYS: usize = 6;
/// Shorter than the bodies below, so every long body is renewed at least once (due a third of
/// the way through the lease).
const LEASE: Duration = Duration::from_millis(600);
const BODY: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_secs(15);
/// How long an idle client may take to drop what it kept: channels linger 2 s and are swept
/// every second, a queue's keys last 4 s after its last attempt; the rest is slack for a busy
/// machine.
const SETTLE: Duration = Duration::from_secs(15);

fn options(ns: &str) -> LockOptions {
    LockOptions::new().namespace(ns).lease(LEASE)
}

/// A unique key, as a service locking orders would use.
fn order_key(round: usize) -> String {
    format!("order:{round}-{:032x}", rand::random::<u128>())
}

/// The lock families one client (one service process) uses.
#[derive(Clone)]
struct Families {
    client: LockClient,
    mutex: Locks<str>,
    reentrant: Locks<str>,
    rw: RwLocks<str>,
    sem: Semaphores<str>,
    multi: Locks<str>,
}

impl Families {
    fn of(client: &LockClient) -> Families {
        Families {
            client: client.clone(),
            mutex: client.lock_with(options("soak")).expect("options"),
            reentrant: client
                .lock_with(options("soak").reentrant(true))
                .expect("options"),
            rw: client.rw_lock_with(options("soak-rw")).expect("options"),
            sem: client
                .semaphore_with(2, options("soak-sem"))
                .expect("options"),
            multi: client.lock_with(options("soak-multi")).expect("options"),
        }
    }
}

#[sage_lock::locked(key = "order:{id}", wait = "15s", lease = "600ms", namespace = "soak-macro", client = client)]
async fn locked_by_macro(client: &LockClient, id: &str) -> Result<(), LockError> {
    tokio::time::sleep(BODY).await;
    Ok(())
}

/// What one call of the burst ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ran,
    Refused,
    TimedOut,
    Cancelled,
}

type Call = Pin<Box<dyn Future<Output = Outcome> + Send>>;

fn ran<T>(what: &'static str, result: Result<T, LockError>) -> Outcome {
    match result {
        Ok(_) => Outcome::Ran,
        Err(error) => panic!("{what}: {error}"),
    }
}

/// One round's calls: every primitive on `KEYS` fresh keys each, from two clients, contended
/// (local and remote waiters, hand-offs, release notifications), with bodies longer than a
/// third of the lease (renewals), cancelled waiters and holders, timed-out waits and refused
/// tries.
fn burst(round: usize, a: &Families, b: &Families) -> Vec<Call> {
    let mut calls: Vec<Call> = Vec::new();
    // Timed from the body's start (`tokio::time::sleep` would count from the call).
    let sleep = || async { tokio::time::sleep(BODY).await };
    for _ in 0..KEYS {
        // Mutex: three waiters from two clients, a refused try and a cancelled waiter behind them.
        let key = order_key(round);
        for families in [a, a, b] {
            let (locks, key) = (families.mutex.clone(), key.clone());
            calls.push(Box::pin(async move {
                ran("with_lock", locks.with_lock(&key, WAIT, sleep()).await)
            }));
        }
        let (locks, key_) = (b.mutex.clone(), key.clone());
        calls.push(Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            match locks.try_with_lock(&key_, async {}).await {
                Ok(Some(())) => Outcome::Ran,
                Ok(None) => Outcome::Refused,
                Err(error) => panic!("try_with_lock: {error}"),
            }
        }));
        let (locks, key_) = (a.mutex.clone(), key.clone());
        calls.push(Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let call = locks.with_lock(&key_, WAIT, async {});
            match tokio::time::timeout(Duration::from_millis(200), call).await {
                Err(_) => Outcome::Cancelled,
                Ok(result) => ran("with_lock (cancelled)", result),
            }
        }));
        // A wait that times out behind a long holder, and a holder cancelled mid-body.
        let (locks, key_) = (b.mutex.clone(), key.clone());
        calls.push(Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(60)).await;
            match locks
                .with_lock(&key_, Duration::from_millis(100), async {})
                .await
            {
                Err(LockError::TimedOut { .. }) => Outcome::TimedOut,
                other => ran("with_lock (short wait)", other),
            }
        }));
        let (locks, key) = (a.mutex.clone(), order_key(round));
        calls.push(Box::pin(async move {
            let call = locks.with_lock(&key, WAIT, async {
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
            match tokio::time::timeout(BODY, call).await {
                Err(_) => Outcome::Cancelled,
                Ok(result) => ran("with_lock (cancelled holder)", result),
            }
        }));

        // Reentrant: the nested call runs under the outer hold, contended by the other client.
        let key = order_key(round);
        for families in [a, b] {
            let (locks, key) = (families.reentrant.clone(), key.clone());
            calls.push(Box::pin(async move {
                let inner = locks.clone();
                let inner_key = key.clone();
                let nested = locks
                    .with_lock(&key, WAIT, async move {
                        inner
                            .with_lock(&inner_key, Duration::from_millis(100), sleep())
                            .await
                    })
                    .await;
                ran("reentrant", nested.and_then(|inner| inner))
            }));
        }

        // Read-write lock: readers and a writer from both clients, and a refused try_write.
        let key = order_key(round);
        for (families, write) in [(a, false), (b, true), (a, false), (b, false), (a, true)] {
            let (rw, key) = (families.rw.clone(), key.clone());
            calls.push(Box::pin(async move {
                if write {
                    ran("write", rw.write(&key, WAIT, sleep()).await)
                } else {
                    ran("read", rw.read(&key, WAIT, sleep()).await)
                }
            }));
        }
        let (rw, key_) = (b.rw.clone(), key.clone());
        calls.push(Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            match rw.try_write(&key_, async {}).await {
                Ok(Some(())) => Outcome::Ran,
                Ok(None) => Outcome::Refused,
                Err(error) => panic!("try_write: {error}"),
            }
        }));

        // Semaphore of two permits: five holders from two clients, and a refused try.
        let key = order_key(round);
        for families in [a, b, a, b, a] {
            let (sem, key) = (families.sem.clone(), key.clone());
            calls.push(Box::pin(async move {
                ran("acquire", sem.acquire(&key, WAIT, sleep()).await)
            }));
        }
        let (sem, key_) = (b.sem.clone(), key.clone());
        calls.push(Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            match sem.try_acquire(&key_, async {}).await {
                Ok(Some(())) => Outcome::Ran,
                Ok(None) => Outcome::Refused,
                Err(error) => panic!("try_acquire: {error}"),
            }
        }));

        // #[locked], contended by both clients.
        let key = order_key(round);
        for families in [a, b] {
            let (client, key) = (families.client.clone(), key.clone());
            calls.push(Box::pin(async move {
                ran("#[locked]", locked_by_macro(&client, &key).await)
            }));
        }
    }
    // Several keys: a ring of pairs, each pair wanted by both clients, and each key by a
    // single-key caller too.
    let ring: Vec<String> = (0..KEYS).map(|_| order_key(round)).collect();
    for i in 0..KEYS {
        let pair = [ring[i].clone(), ring[(i + 1) % KEYS].clone()];
        for families in [a, b] {
            let (multi, pair) = (families.multi.clone(), pair.clone());
            calls.push(Box::pin(async move {
                let keys = [pair[0].as_str(), pair[1].as_str()];
                ran("with_locks", multi.with_locks(&keys, WAIT, sleep()).await)
            }));
        }
        let (multi, key) = (b.multi.clone(), ring[i].clone());
        calls.push(Box::pin(async move {
            ran(
                "with_lock (beside with_locks)",
                multi.with_lock(&key, WAIT, sleep()).await,
            )
        }));
    }
    calls
}

/// Every key on the server, by kind: (fencing counters, grant markers, anything else).
fn server_keys(port: u16) -> (usize, usize, Vec<String>) {
    let (mut fences, mut markers, mut other) = (0, 0, Vec::new());
    let mut cursor = "0".to_owned();
    loop {
        let reply = harness::cmd_ok(port, &["SCAN", &cursor, "COUNT", "1000"]);
        let parts = reply.as_array().expect("SCAN reply");
        cursor = parts[0].to_text().expect("cursor");
        for key in parts[1].as_array().expect("SCAN keys") {
            let key = key.to_text().expect("key");
            if key.ends_with(":fence") {
                fences += 1;
            } else if key.ends_with(":since") {
                markers += 1;
            } else {
                let kind = harness::cmd_ok(port, &["TYPE", &key]).to_plain();
                let pttl = harness::cmd_ok(port, &["PTTL", &key]).to_plain();
                other.push(format!("{key} ({kind}, pttl {pttl} ms)"));
            }
        }
        if cursor == "0" {
            return (fences, markers, other);
        }
    }
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// The fewest tasks alive over half a second: what stays, without a short-lived task (a
/// renewal call, a connection closing) that happened to run at one sample.
async fn lasting_tasks() -> usize {
    let mut fewest = alive_tasks();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        fewest = fewest.min(alive_tasks());
    }
    fewest
}

/// The process's resident set, in KiB (`/proc/self/statm`, 4 KiB pages).
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("statm's resident field");
    pages * 4
}

/// Everything that must come back once the clients are idle.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Idle {
    tasks: usize,
    clients: i64,
    resident: [Resident; 2],
    channels: Vec<String>,
    other_keys: Vec<String>,
    fences: usize,
    markers: usize,
}

impl Idle {
    /// Tasks alive and connections, without the dedicated pool's idle connections (each one
    /// connection and the task that drives it; how many stay depends on how many operations
    /// ran at once).
    fn lasting(&self) -> (usize, i64) {
        let pooled: usize = self.resident.iter().map(|r| r.idle_connections).sum();
        (
            self.tasks.saturating_sub(pooled),
            self.clients - i64::try_from(pooled).expect("a small count"),
        )
    }
}

fn idle_state(port: u16, clients: [&LockClient; 2]) -> Idle {
    let (fences, markers, other_keys) = server_keys(port);
    Idle {
        tasks: alive_tasks(),
        clients: connected_clients(port),
        resident: clients.map(resident),
        channels: harness::shard_channels(port),
        other_keys,
        fences,
        markers,
    }
}

/// Polls until the clients hold nothing per use, the server has no channel and no key but the
/// documented leftovers, and the task and connection counts are `expected`'s (when given), or
/// until [`SETTLE`]; returns the last state and how long it took.
async fn settle(port: u16, clients: [&LockClient; 2], expected: Option<&Idle>) -> (Idle, Duration) {
    let start = Instant::now();
    loop {
        let state = idle_state(port, clients);
        let quiet = state
            .resident
            .iter()
            .all(|r| r.per_use() == Resident::default())
            && state.channels.is_empty()
            && state.other_keys.is_empty()
            && expected.is_none_or(|e| state.lasting() == e.lasting());
        if quiet && expected.is_none() {
            let tasks = lasting_tasks().await;
            return (Idle { tasks, ..state }, start.elapsed());
        }
        if quiet || start.elapsed() > SETTLE {
            return (state, start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Rounds of bursts through every primitive, on fresh keys, by two clients: after each, once
/// idle, no task, connection, channel, server key (but the fencing counters and grant markers,
/// one each per key ever locked) or per-key record inside a client is left beyond what the
/// first round left, and nothing grows from round to round.
///
/// `replicated`: on a primary with a replica, every acquisition and renewal acknowledged
/// (`WAIT` on the dedicated pool's connections, whose idle ones stay, at most
/// `max_connections` per client; cancelled acquisitions clean up on theirs in the background).
async fn bursts_leave_nothing_behind(kind: ServerKind, replicated: bool) {
    let name = format!(
        "{} {}",
        kind.name(),
        if replicated {
            "replicated"
        } else {
            "standalone"
        }
    );
    let (standalone, primary_and_replica);
    let (port, url) = if replicated {
        primary_and_replica = harness::Replicated::start(kind, 1);
        (
            primary_and_replica.primary.port(),
            primary_and_replica.primary_url(),
        )
    } else {
        standalone = Server::start(kind);
        (standalone.port(), standalone.url())
    };
    let connect = || async {
        LockClient::builder()
            .url(&url)
            .replicated(replicated)
            .connect()
            .await
            .expect("connect")
    };
    let (tasks_before, clients_before) = (alive_tasks(), connected_clients(port));
    let a = connect().await;
    let b = connect().await;
    let (fa, fb) = (Families::of(&a), Families::of(&b));
    let mut baseline: Option<Idle> = None;
    let mut rss = Vec::new();
    for round in 0..ROUNDS {
        let before = [a.stats(), b.stats()];
        let started = Instant::now();
        let calls: Vec<_> = burst(round, &fa, &fb)
            .into_iter()
            .map(tokio::spawn)
            .collect();
        let mut outcomes = Vec::new();
        let mut busiest = [Resident::default(); 2];
        for call in calls {
            outcomes.push(call.await.expect("call task"));
            for (most, client) in busiest.iter_mut().zip([&a, &b]) {
                let now = resident(client);
                most.waiter_keys = most.waiter_keys.max(now.waiter_keys);
                most.channels = most.channels.max(now.channels);
                most.renewals = most.renewals.max(now.renewals);
            }
        }
        let burst_took = started.elapsed();
        let count = |o: Outcome| outcomes.iter().filter(|&&x| x == o).count();
        let after = [a.stats(), b.stats()];
        let delta = |f: fn(&sage_lock::LockStats) -> u64| {
            (0..2).map(|i| f(&after[i]) - f(&before[i])).sum::<u64>()
        };
        let (renewals, handoffs, busy) = (
            delta(|s| s.renewals),
            delta(|s| s.handoffs),
            delta(|s| s.busy_retries),
        );
        let (state, settled_in) = settle(port, [&a, &b], baseline.as_ref()).await;
        rss.push(rss_kib());
        println!(
            "{name} round {round}: {} calls in {burst_took:?} ({} ran, {} refused, {} timed out, \
             {} cancelled); {renewals} renewals, {handoffs} hand-offs, {busy} busy attempts; \
             busiest {busiest:?}; idle after {settled_in:?}: {state:?}; rss {} KiB",
            outcomes.len(),
            count(Outcome::Ran),
            count(Outcome::Refused),
            count(Outcome::TimedOut),
            count(Outcome::Cancelled),
            rss[round],
        );
        // The round did what it is meant to: contention, renewals, cancellations.
        assert!(renewals > 0, "{name} round {round}: no lease was renewed");
        // (A replica-acknowledged waiter confirms a hand-off with an attempt of its own.)
        assert!(
            replicated || handoffs > 0,
            "{name} round {round}: no release handed over"
        );
        assert!(busy > 0, "{name} round {round}: nobody waited");
        assert!(
            count(Outcome::Cancelled) > 0 && count(Outcome::TimedOut) > 0,
            "{name} round {round}: no call was cancelled or timed out"
        );
        assert!(
            busiest.iter().any(|r| r.waiter_keys > 0 && r.channels > 0),
            "{name} round {round}: no local waiter or watched channel was seen: {busiest:?}"
        );
        // Idle again: nothing per use inside either client, nothing on the server.
        for (c, r) in state.resident.iter().enumerate() {
            assert_eq!(
                r.per_use(),
                Resident::default(),
                "{name} round {round}: client {c} still keeps records {settled_in:?} after the \
                 burst"
            );
            assert!(
                r.idle_connections <= sage_lock::DEFAULT_MAX_CONNECTIONS,
                "{name} round {round}: client {c} keeps {} idle dedicated connections",
                r.idle_connections
            );
            assert!(
                r.fenced_keys <= 4096,
                "{name} round {round}: client {c} remembers {} fencing tokens",
                r.fenced_keys
            );
        }
        assert!(
            state.channels.is_empty(),
            "{name} round {round}: channels still subscribed {settled_in:?} after the burst: {:?}",
            state.channels
        );
        assert!(
            state.other_keys.is_empty(),
            "{name} round {round}: keys left on the server {settled_in:?} after the burst:\n{}",
            state.other_keys.join("\n")
        );
        match &baseline {
            None => baseline = Some(state),
            Some(first) => {
                assert_eq!(
                    state.lasting(),
                    first.lasting(),
                    "{name} round {round}: (tasks alive, connections) besides the idle \
                     dedicated ones, against the first round's"
                );
                // One counter and one marker per key ever locked, the same number each round.
                let per_round = first.fences;
                assert_eq!(
                    state.fences,
                    per_round * (round + 1),
                    "{name} round {round}: fencing counters"
                );
                assert_eq!(
                    state.markers,
                    first.markers * (round + 1),
                    "{name} round {round}: grant markers"
                );
            }
        }
    }
    let first = baseline.expect("a first round");
    // What the first round left is bounded and explained: per client, its renewer and its
    // subscriber connection (and the connection's listener); the shared connections.
    println!(
        "{name}: tasks {tasks_before} before the clients, {} once idle; connections \
         {clients_before} before, {} once idle; rss {rss:?} KiB",
        first.tasks, first.clients
    );
    // Coarse: after the second round, the process's memory grows by less than 16 MiB over the
    // later rounds (the allocator keeps freed memory; a leak of a few KiB per call would not
    // hide behind that over hundreds of calls, but the exact counts above are the real check).
    let grown = rss[ROUNDS - 1].saturating_sub(rss[1]);
    assert!(
        grown < 16 * 1024,
        "{name}: the process grew by {grown} KiB over the later rounds: {rss:?}"
    );
    // Closed by quit() and kept (as a client in a `static` would be): nothing of either is left.
    a.quit().await;
    b.quit().await;
    let (after_quit, took) = settle_to(port, tasks_before, clients_before).await;
    assert_eq!(
        after_quit,
        (tasks_before, clients_before),
        "{name}: tasks and connections {took:?} after quit(), against before the clients"
    );
    drop((fa, fb, a, b));
}

/// Contended holds renewed at least once (so the client has started its renewer, subscriber
/// connection and listener), on fresh keys.
async fn contended_work(client: &LockClient, other: &LockClient) {
    let key = order_key(0);
    let mut calls = Vec::new();
    for c in [client, other, client] {
        let locks: Locks<str> = c.lock_with(options("soak-end")).expect("options");
        let key = key.clone();
        calls.push(tokio::spawn(async move {
            locks
                .with_lock(&key, WAIT, async { tokio::time::sleep(BODY).await })
                .await
                .expect("with_lock");
        }));
    }
    for call in calls {
        call.await.expect("call task");
    }
    assert!(client.stats().renewals > 0, "no lease was renewed");
}

/// Polls until the runtime's alive tasks and the server's connections are down to `tasks` and
/// `clients`, at most [`SETTLE`]; returns the last counts and how long it took.
async fn settle_to(port: u16, tasks: usize, clients: i64) -> ((usize, i64), Duration) {
    let start = Instant::now();
    loop {
        let now = (alive_tasks(), connected_clients(port));
        if now == (tasks, clients) || start.elapsed() > SETTLE {
            return (now, start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client closed by `quit()` (and kept, as a client in a `static` would be) and a client
/// dropped without `quit()` leave no task running and no connection open, after contended,
/// renewed holds (renewer, subscriber connection and its listener started).
async fn quit_or_dropped_clients_leave_no_task_behind(kind: ServerKind) {
    let name = kind.name();
    let server = Server::start(kind);
    let port = server.port();
    let (tasks_before, clients_before) = (alive_tasks(), connected_clients(port));
    let helper = LockClient::connect(&server.url()).await.expect("connect");
    // Started: the helper's renewer and subscriber (the first hold waits behind it).
    contended_work(&helper, &helper).await;
    let with_helper = (lasting_tasks().await, connected_clients(port));
    let with_helper_tasks = with_helper.0;

    let dropped = LockClient::connect(&server.url()).await.expect("connect");
    contended_work(&dropped, &helper).await;
    let busy = (alive_tasks(), connected_clients(port));
    drop(dropped);
    let (after_drop, drop_took) = settle_to(port, with_helper_tasks, with_helper.1).await;
    println!(
        "{name}: drop: tasks and connections {with_helper:?} before the client, {busy:?} \
         after its work, {after_drop:?} {drop_took:?} after the drop"
    );

    let quitting = LockClient::connect(&server.url()).await.expect("connect");
    contended_work(&quitting, &helper).await;
    let busy = (alive_tasks(), connected_clients(port));
    quitting.quit().await;
    let (after_quit, took) = settle_to(port, with_helper_tasks, with_helper.1).await;
    println!(
        "{name}: quit: tasks and connections {busy:?} after its work, {after_quit:?} \
         {took:?} after quit()"
    );
    assert_eq!(
        [after_quit, after_drop],
        [(with_helper_tasks, with_helper.1); 2],
        "{name}: tasks and connections {took:?} after quit() and {drop_took:?} after the \
         drop, against before the client"
    );
    drop((quitting, helper));
    let (at_end, took) = settle_to(port, tasks_before, clients_before).await;
    assert_eq!(
        at_end,
        (tasks_before, clients_before),
        "{name}: tasks and connections {took:?} after every client is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_bursts_leave_nothing_behind() {
    bursts_leave_nothing_behind(ServerKind::Redis, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_bursts_leave_nothing_behind() {
    bursts_leave_nothing_behind(ServerKind::Valkey, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replicated_bursts_leave_nothing_behind() {
    bursts_leave_nothing_behind(ServerKind::Redis, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_replicated_bursts_leave_nothing_behind() {
    bursts_leave_nothing_behind(ServerKind::Valkey, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_quit_or_dropped_clients_leave_no_task_behind() {
    quit_or_dropped_clients_leave_no_task_behind(ServerKind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_quit_or_dropped_clients_leave_no_task_behind() {
    quit_or_dropped_clients_leave_no_task_behind(ServerKind::Valkey).await;
}
