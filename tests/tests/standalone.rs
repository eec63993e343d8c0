//! The behaviour suite on standalone Redis and Valkey servers, plus what only a standalone server
//! can show: a server going away, a holder process crashing, and no ROLE/WAIT being sent.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::Target;
use harness::{Server, ServerKind};
use sage_lock::{LockClient, LockError, LockOptions, Locks, TimeoutReason};
use tokio::io::AsyncBufReadExt as _;

common::behaviour_suite!(Target::standalone);
common::primitives::primitive_suite!(Target::standalone);

/// A standalone client never sends ROLE or WAIT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_sends_no_role_or_wait() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks = client.lock::<str>();
        for i in 0..20 {
            locks
                .with_lock(&format!("k{i}"), Duration::from_secs(1), async {})
                .await
                .expect("lock");
        }
        assert_eq!(
            harness::commandstats_calls(server.port(), "role"),
            0,
            "{}",
            kind.name()
        );
        assert_eq!(
            harness::commandstats_calls(server.port(), "wait"),
            0,
            "{}",
            kind.name()
        );
        // Releases are `DELIFEQ` where the server has it (Valkey 9), else scripts.
        assert!(
            harness::commandstats_calls(server.port(), "evalsha")
                + harness::commandstats_calls(server.port(), "delifeq")
                >= 40
        );
    }
}

/// Renewals on a standalone server send no ROLE or WAIT either: a 300 ms lease held for 1.2 s
/// is renewed several times (the client's count and the server's `EVALSHA` count both grow), and
/// the server saw neither command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_renewals_send_no_role_or_wait() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let port = server.port();
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks: Locks<str> = client
            .lock_with(
                LockOptions::new()
                    .namespace("renew-plain")
                    .lease(Duration::from_millis(300)),
            )
            .expect("opts");
        let before = client.stats();
        let scripts_before = harness::commandstats_calls(port, "evalsha");
        let mut scripts_in_body = 0;
        locks
            .with_lock("k", Duration::from_secs(2), async {
                tokio::time::sleep(Duration::from_millis(1200)).await;
                scripts_in_body = harness::commandstats_calls(port, "evalsha");
            })
            .await
            .unwrap_or_else(|e| panic!("{}: held through renewals: {e}", kind.name()));
        let after = client.stats();
        // A renewal is due every third of the lease (100 ms): about 11 in 1.2 s.
        assert!(
            after.renewals >= before.renewals + 3 && after.losses == before.losses,
            "{}: {after:?}",
            kind.name()
        );
        // Beyond the acquisition's script, the renewals' (one lease, one call each).
        assert!(
            scripts_in_body >= scripts_before + 1 + 3,
            "{}: {} scripts during the hold",
            kind.name(),
            scripts_in_body - scripts_before
        );
        assert_eq!(
            harness::commandstats_calls(port, "role"),
            0,
            "{}: ROLE sent",
            kind.name()
        );
        assert_eq!(
            harness::commandstats_calls(port, "wait"),
            0,
            "{}: WAIT sent",
            kind.name()
        );
    }
}

/// The suffixes of the server keys of the lock whose key is `lock_key` (`""` for the lock key).
fn keys_left(port: u16, lock_key: &str) -> Vec<String> {
    let keys = harness::cmd(port, &["KEYS", &format!("{lock_key}*")]).expect("KEYS");
    let mut suffixes: Vec<String> = keys
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|key| Some(key.to_text()?.strip_prefix(lock_key)?.to_owned()))
        .collect();
    suffixes.sort();
    suffixes
}

/// A body that panics: the panic reaches the caller unchanged (here through the spawned task's
/// `JoinError`, whose payload is the body's own message), and the lock is released at once (the
/// unwinding drops the hold, which releases it in the background), not when its 30 s lease runs
/// out: within seconds the lock key is gone (no more is left than after a body that returns),
/// and the next `try_with_lock` gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_body_propagates_and_releases() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let port = server.port();
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let ns = format!("panic-{}-{}", kind.name(), rand::random::<u32>());
        let locks: Locks<str> = client
            .lock_with(
                LockOptions::new()
                    .namespace(ns.as_str())
                    .lease(Duration::from_secs(30)),
            )
            .expect("opts");
        let key = String::from_utf8(LockClient::server_key(&ns, "k")).expect("utf8");
        let exists = move |key: &str| {
            harness::cmd(port, &["EXISTS", key])
                .expect("EXISTS")
                .as_int()
                .expect("an integer")
                == 1
        };
        let calm_key = String::from_utf8(LockClient::server_key(&ns, "calm")).expect("utf8");
        locks
            .with_lock("calm", Duration::from_secs(2), async {})
            .await
            .expect("a body that returns");
        assert!(!keys_left(port, &calm_key).is_empty(), "{}", kind.name());
        let task = {
            let (locks, key) = (locks.clone(), key.clone());
            tokio::spawn(async move {
                locks
                    .with_lock("k", Duration::from_secs(2), async move {
                        assert!(exists(&key), "the lock key exists while the body runs");
                        panic!("the body gave up on {}", "k");
                    })
                    .await
            })
        };
        let error = task.await.expect_err("the panic reaches the caller");
        assert!(error.is_panic(), "{}: {error}", kind.name());
        let payload = error.into_panic();
        let message = harness::panic_message(&*payload);
        assert_eq!(message, Some("the body gave up on k"), "{}", kind.name());
        let panicked = Instant::now();
        while exists(&key) && panicked.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let gone_after = panicked.elapsed();
        assert!(
            !exists(&key),
            "{}: the lock key outlived the panic by {gone_after:?}",
            kind.name()
        );
        // No more is left on the server than after a body that returns: the bookkeeping that
        // outlives every hold (the fencing counter, the last grant's marker), not the lock.
        assert_eq!(
            keys_left(port, &key),
            keys_left(port, &calm_key),
            "{}",
            kind.name()
        );
        let again = locks
            .try_with_lock("k", async { 7 })
            .await
            .unwrap_or_else(|e| panic!("{}: after the panic: {e}", kind.name()));
        assert_eq!(
            again,
            Some(7),
            "{}: still held after the panic",
            kind.name()
        );
        println!(
            "{}: panicking body -> key gone after {gone_after:?} (lease 30 s)",
            kind.name()
        );
    }
}

/// A malformed URL and an unreachable server give clear errors, quickly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_url_and_unreachable_server() {
    let bad = LockClient::connect("http://127.0.0.1:1").await;
    let Err(LockError::InvalidArgument {
        argument: "url",
        message,
    }) = bad
    else {
        panic!("http URL accepted: {bad:?}");
    };
    assert!(message.contains("redis://"), "{message}");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let started = Instant::now();
    let down = LockClient::builder()
        .url(&format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await;
    let Err(error @ LockError::Backend { .. }) = down else {
        panic!("connected to nothing: {down:?}")
    };
    assert!(error.to_string().contains("could not connect"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
}

/// A URL for the wrong kind of server names the mismatch and the URL to use, instead of asking
/// whether the server is reachable; a zero connect timeout is blamed on `connect_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrong_kind_of_server_is_named() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let port = server.port();
        for (url, expected) in [
            (
                format!("redis-cluster://127.0.0.1:{port}"),
                "not a cluster node",
            ),
            (
                format!("redis-sentinel://127.0.0.1:{port}?sentinelServiceName=app"),
                "not a Sentinel",
            ),
            (format!("redis://127.0.0.1:{port}/99"), "database 99"),
        ] {
            let result = LockClient::builder()
                .url(&url)
                .connect_timeout(Duration::from_secs(5))
                .connect()
                .await;
            let Err(error) = result else {
                panic!("{}: {url} connected", kind.name());
            };
            let message = error.to_string();
            assert!(
                message.contains(expected)
                    && !message.contains("is the server running")
                    && !message.contains("  "),
                "{}: {url}: {message}",
                kind.name()
            );
        }
    }
    let zero = LockClient::builder()
        .url("redis://127.0.0.1:1")
        .connect_timeout(Duration::ZERO)
        .connect()
        .await;
    assert!(
        matches!(
            zero,
            Err(LockError::InvalidArgument {
                argument: "connect_timeout",
                ..
            })
        ),
        "{zero:?}"
    );
}

/// `command_timeout(Duration::MAX)` ("no timeout") is accepted, and no call adds it to the clock
/// unchecked: the operator tools panicked with "overflow when adding duration to instant".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbounded_command_timeout_panics_nowhere() {
    let server = Server::start(ServerKind::Redis);
    let client = LockClient::builder()
        .url(&server.url())
        .command_timeout(Duration::MAX)
        .connect()
        .await
        .expect("connect");
    let locks: Locks<str> = client
        .lock_with(LockOptions::new().namespace("max-timeout"))
        .expect("opts");
    let inside = locks
        .with_lock("k", Duration::MAX, async {
            locks.is_locked("k").await.expect("is_locked")
        })
        .await
        .expect("lock");
    assert!(inside, "is_locked inside the body");
    assert!(locks.holder("k").await.expect("holder").is_none());
    assert!(locks.scan().await.expect("scan").is_empty());
    assert!(!locks.force_unlock("k").await.expect("force_unlock"));
    drop(
        client
            .dedicated_connection(Duration::MAX)
            .await
            .expect("loan"),
    );
}

/// The server going away mid-wait gives `TimedOut(Unavailable)` within the wait plus cleanup,
/// never a hang; once it is back, locking works again without a new client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_then_back() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("down"))
            .expect("opts");
        locks
            .with_lock("k", Duration::from_secs(1), async {})
            .await
            .expect("before");
        server.kill();
        let started = Instant::now();
        let result = locks
            .with_lock("k", Duration::from_millis(500), async {})
            .await;
        let elapsed = started.elapsed();
        assert!(
            matches!(
                result,
                Err(LockError::TimedOut {
                    reason: TimeoutReason::Unavailable(_),
                    ..
                })
            ),
            "{}: {result:?}",
            kind.name()
        );
        assert!(
            elapsed < Duration::from_millis(500 + 1500),
            "{}: took {elapsed:?}",
            kind.name()
        );
        let tried = locks.try_with_lock("k", async {}).await;
        assert!(
            matches!(tried, Err(LockError::TimedOut { .. })),
            "{tried:?}"
        );
        server.restart();
        let back = locks
            .with_lock("k", Duration::from_secs(10), async { 5 })
            .await;
        assert_eq!(back.expect("after restart"), 5, "{}", kind.name());
    }
}

/// `try_with_lock` on a server that is gone retries for about a second
/// ([`sage_lock::TRY_LOCK_RETRY_WINDOW`]), bounded by the usable lease, then returns
/// `TimedOut(Unavailable)`: never at once, never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_retries_an_unreachable_server_briefly() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let options = LockOptions::new().namespace("try-down");
        let locks: Locks<str> = client.lock_with(options.clone()).expect("opts");
        let short: Locks<str> = client
            .lock_with(options.lease(Duration::from_millis(200)))
            .expect("opts");
        locks
            .try_with_lock("k", async {})
            .await
            .expect("before")
            .expect("free");
        server.kill();
        // At least the window (at most 1 s, less with a shorter usable lease); at most that plus
        // the second a failed attempt's cleanup may take (`RELEASE_TIMEOUT`): about 2 s and
        // 1.2 s here.
        let mut took_with = Vec::new();
        for (locks, lease, at_least, at_most) in [
            (
                &locks,
                "30 s",
                Duration::from_millis(900),
                Duration::from_secs(4),
            ),
            (
                &short,
                "200 ms",
                Duration::from_millis(150),
                Duration::from_millis(1700),
            ),
        ] {
            let started = Instant::now();
            let result = locks.try_with_lock("k", async {}).await;
            let took = started.elapsed();
            println!("{} ({lease} lease): {result:?} after {took:?}", kind.name());
            assert!(
                matches!(
                    result,
                    Err(LockError::TimedOut {
                        reason: TimeoutReason::Unavailable(_),
                        ..
                    })
                ),
                "{} ({lease} lease): {result:?}",
                kind.name()
            );
            assert!(
                took >= at_least,
                "{} ({lease} lease): gave up after {took:?}, without retrying",
                kind.name()
            );
            assert!(
                took < at_most,
                "{} ({lease} lease): took {took:?}",
                kind.name()
            );
            took_with.push(took);
        }
        // The same cleanup after both: the long lease's window is the longer by most of 0.8 s.
        assert!(
            took_with[0] >= took_with[1] + Duration::from_millis(500),
            "{}: {took_with:?}",
            kind.name()
        );
    }
}

/// A holder process killed with SIGKILL keeps the lock only until its lease expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_holder_expires_after_lease() {
    for kind in ServerKind::ALL {
        let target = Target::standalone(kind);
        let ns = target.ns("crash");
        let lease = Duration::from_millis(1500);
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hold_lock"))
            .args([&target.url, &ns, "job", &lease.as_millis().to_string()])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn hold_lock");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("holder acquired in time")
            .expect("read")
            .expect("a line");
        assert!(line.starts_with("acquired"), "{line}");
        let client = target.client().await;
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace(ns.as_str()))
            .expect("opts");
        // Renewing holder: busy well past one lease.
        tokio::time::sleep(lease * 2).await;
        assert_eq!(
            locks.try_with_lock("job", async {}).await.expect("try"),
            None,
            "holder lost its lock"
        );
        child.start_kill().expect("SIGKILL");
        let _ = child.wait().await;
        let killed = Instant::now();
        locks
            .with_lock("job", Duration::from_secs(10), async {})
            .await
            .expect("acquired after expiry");
        let waited = killed.elapsed();
        assert!(
            waited <= lease + Duration::from_millis(700),
            "{}: waited {waited:?}",
            kind.name()
        );
    }
}

/// `with_lock` and `try_with_lock` futures are `Send` when the body is, so they can be spawned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_futures_are_send() {
    fn assert_send<T: Send + 'static>(value: T) -> T {
        value
    }
    let client = Target::standalone(ServerKind::Redis).client().await;
    let locks: Locks<String> = client.lock();
    let key = String::from("send-check");
    let waiting = assert_send(locks.with_lock(key.as_str(), Duration::from_secs(1), async { 1 }));
    assert_eq!(tokio::spawn(waiting).await.expect("join").expect("lock"), 1);
    let trying = assert_send(locks.try_with_lock(key.as_str(), async { 2 }));
    assert_eq!(
        tokio::spawn(trying).await.expect("join").expect("lock"),
        Some(2)
    );
}

/// Many leases held at once are renewed together: far fewer renewal calls than renewals, and none
/// lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_leases_renew_in_batches() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks: Locks<String> = client
            .lock_with(
                LockOptions::new()
                    .namespace("batch")
                    .lease(Duration::from_millis(300)),
            )
            .expect("opts");
        let held = 200;
        let end = tokio::time::Instant::now() + Duration::from_millis(1300);
        let tasks = hold_until(&locks, held, end, Duration::ZERO).await;
        for task in tasks {
            task.await.expect("join").expect("held without loss");
        }
        let stats = client.stats();
        assert_eq!(stats.losses, 0, "{}: {stats:?}", kind.name());
        assert!(stats.renewals >= held * 3, "{}: {stats:?}", kind.name());
        let script_calls = harness::commandstats_calls(server.port(), "evalsha");
        // One acquire per lock, and one release script per lock not released by `DELIFEQ`.
        let plain_releases = harness::commandstats_calls(server.port(), "delifeq");
        let renewal_calls = script_calls - held - (held - plain_releases);
        assert!(
            renewal_calls * 10 <= stats.renewals,
            "{}: {renewal_calls} renewal calls for {} renewals: not batched",
            kind.name(),
            stats.renewals
        );
        println!(
            "{}: {} renewals in {renewal_calls} calls",
            kind.name(),
            stats.renewals
        );
    }
}

/// Spawns `held` tasks, `spacing` apart, each holding its own key `k0`, `k1`, ... of `locks`
/// until `end`.
async fn hold_until(
    locks: &Locks<String>,
    held: u64,
    end: tokio::time::Instant,
    spacing: Duration,
) -> Vec<tokio::task::JoinHandle<Result<(), LockError>>> {
    let mut tasks = Vec::new();
    for i in 0..held {
        let locks = locks.clone();
        tasks.push(tokio::spawn(async move {
            locks
                .with_lock(
                    &format!("k{i}"),
                    Duration::from_secs(5),
                    tokio::time::sleep_until(end),
                )
                .await
        }));
        tokio::time::sleep(spacing).await;
    }
    tasks
}

/// Holds `held` locks of `lease` in namespace `ns` for `hold`, on a client of `server` with
/// `renewal_batch_limit(limit)`; returns `(renewal calls, renewals)`: the server's `EVALSHA`
/// calls that were neither an acquire nor a release, and the client's count.
async fn renewals_with_limit(
    server: &Server,
    limit: usize,
    ns: &str,
    held: u64,
    lease: Duration,
    hold: Duration,
) -> (u64, u64) {
    let client = LockClient::builder()
        .url(&server.url())
        .renewal_batch_limit(limit)
        .connect()
        .await
        .expect("connect");
    let port = server.port();
    let before = harness::commandstats_calls(port, "evalsha");
    let releases_before = harness::commandstats_calls(port, "delifeq");
    let locks: Locks<String> = client
        .lock_with(LockOptions::new().namespace(ns).lease(lease))
        .expect("opts");
    let end = tokio::time::Instant::now() + hold;
    let tasks = hold_until(&locks, held, end, Duration::ZERO).await;
    for task in tasks {
        task.await.expect("join").expect("held without loss");
    }
    let scripts = harness::commandstats_calls(port, "evalsha") - before;
    let plain_releases = harness::commandstats_calls(port, "delifeq") - releases_before;
    let renewals = client.stats().renewals;
    client.quit().await;
    let calls = scripts - held - (held - plain_releases);
    println!("limit {limit}: {renewals} renewals of {held} locks in {calls} calls");
    (calls, renewals)
}

/// `renewal_batch_limit` sets how many leases one renewal call renews: a low limit splits the
/// same leases into more calls, a high one renews more than the default 256 per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_batch_limit_sets_leases_per_call() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let short = Duration::from_millis(600);
        let (calls, renewals) = renewals_with_limit(
            &server,
            16,
            "batch-16",
            96,
            short,
            Duration::from_millis(1300),
        )
        .await;
        assert!(renewals >= 96 * 3, "{}: {renewals} renewals", kind.name());
        assert!(
            calls * 16 >= renewals,
            "{}: {renewals} renewals in {calls} calls: more than 16 per call",
            kind.name()
        );
        // Leases due within a twentieth of a lease (300 ms) share a call: a long lease keeps the
        // acquisitions' spread (slow on a busy machine) within few calls.
        let long = Duration::from_secs(6);
        let (calls, renewals) = renewals_with_limit(
            &server,
            10_000,
            "batch-large",
            1000,
            long,
            Duration::from_millis(6500),
        )
        .await;
        assert!(renewals >= 1000 * 2, "{}: {renewals} renewals", kind.name());
        assert!(
            calls * 256 < renewals,
            "{}: {renewals} renewals in {calls} calls: no call renewed more than 256",
            kind.name()
        );
    }
}

/// Leases acquired spread over more than a renewal tick (a third of the lease) come to share
/// one renewal call per tick: a call takes the leases due within a sixth of a lease, so groups
/// due closer than that merge at once, and the others at their next renewal. With a twentieth,
/// a spread-out acquisition kept its groups apart for as long as the locks were held (audit 47:
/// 4.1–4.6 calls per node and 1 s tick at 10,000 locks on a cluster, 2.1 standalone, with a
/// batch limit above the lock count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_acquired_over_a_tick_share_one_renewal_call() {
    for kind in ServerKind::ALL {
        // A server of its own: the other tests' scripts would count as renewal calls.
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let lease = Duration::from_millis(600);
        let tick = lease / 3;
        let locks: Locks<String> = client
            .lock_with(LockOptions::new().namespace("batch-spread").lease(lease))
            .expect("opts");
        let held: u64 = 60;
        let port = server.port();
        let start = tokio::time::Instant::now();
        // Acquired one every 5 ms (300 ms: one and a half ticks), all released together.
        let end = start + Duration::from_millis(3300);
        let tasks = hold_until(&locks, held, end, Duration::from_millis(5)).await;
        // Counted from the last acquisition on: by then every lease is renewed.
        tokio::time::sleep(tick).await;
        let renewals_before = client.stats().renewals;
        let scripts_before = harness::commandstats_calls(port, "evalsha");
        let measured_from = tokio::time::Instant::now();
        tokio::time::sleep_until(end - Duration::from_millis(50)).await;
        let calls = harness::commandstats_calls(port, "evalsha") - scripts_before;
        let renewals = client.stats().renewals - renewals_before;
        let ticks = measured_from.elapsed().as_secs_f64() / tick.as_secs_f64();
        for task in tasks {
            task.await.expect("join").expect("held without loss");
        }
        let per_tick = calls as f64 / ticks;
        println!(
            "{kind}: {renewals} renewals in {calls} calls over {ticks:.1} ticks ({per_tick:.2} per tick)"
        );
        assert!(renewals >= held * 10, "{kind}: {renewals} renewals");
        assert!(
            per_tick <= 2.0,
            "{kind}: {calls} renewal calls in {ticks:.1} ticks for {held} locks: not merged"
        );
        client.quit().await;
    }
}

/// A renewal batch limit of 0 is refused with the setting's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_renewal_batch_limit_is_refused() {
    let refused = LockClient::builder()
        .url("redis://127.0.0.1:1")
        .renewal_batch_limit(0)
        .connect()
        .await;
    let Err(LockError::InvalidArgument {
        argument: "renewal_batch_limit",
        message,
    }) = refused
    else {
        panic!("a limit of 0 was accepted: {refused:?}");
    };
    assert!(message.contains("at least 1"), "{message}");
}

/// A command or connect timeout under a millisecond (fred counts whole milliseconds) is refused
/// with the setting's name, not accepted and then reported as an unreachable server on every
/// connect (an audit: `command_timeout(1ns)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_millisecond_timeouts_are_refused() {
    for (argument, builder) in [
        (
            "command_timeout",
            LockClient::builder().command_timeout(Duration::from_nanos(1)),
        ),
        (
            "connect_timeout",
            LockClient::builder().connect_timeout(Duration::from_micros(999)),
        ),
    ] {
        let refused = builder.url("redis://127.0.0.1:1").connect().await;
        let Err(LockError::InvalidArgument {
            argument: named,
            message,
        }) = &refused
        else {
            panic!("{argument}: accepted: {refused:?}");
        };
        assert_eq!(*named, argument, "{message}");
        assert!(message.contains("at least 1ms"), "{argument}: {message}");
    }
}

/// Runs `primitive_worker` processes (`(mode, rounds)` each) against `url` in `namespace`;
/// returns each one's `(holds, violations)`.
async fn run_workers(url: &str, namespace: &str, workers: &[(&str, &str)]) -> Vec<(u64, u64)> {
    let children: Vec<_> = workers
        .iter()
        .map(|(mode, rounds)| {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_primitive_worker"))
                .args([url, namespace, mode, rounds])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn primitive_worker")
        })
        .collect();
    let mut results = Vec::new();
    for ((mode, _), child) in workers.iter().zip(children) {
        let out = child.wait_with_output().await.expect("worker output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{mode} worker failed: {out:?}");
        let words: Vec<&str> = stdout.split_whitespace().collect();
        let [_, holds, _, violations, ..] = words.as_slice() else {
            panic!("{mode} worker said {stdout:?}");
        };
        results.push((
            holds.parse().expect("holds"),
            violations.parse().expect("violations"),
        ));
    }
    results
}

/// Invariants across 4 processes: never a writer with a reader or another writer, and a writer
/// behind a stream of readers gets in within its wait; never more than `permits` holders;
/// multi-key callers in opposite orders never deadlock nor overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primitive_invariants_hold_across_processes() {
    for kind in ServerKind::ALL {
        let url = harness::shared(kind).url();
        let ns = |name: &str| format!("procs-{name}-{}-{}", kind.name(), rand::random::<u32>());
        let (rw_ns, sem_ns, multi_ns) = (ns("rw"), ns("sem"), ns("multi"));
        let rw = run_workers(
            &url,
            &rw_ns,
            &[
                ("read-stream", "1500"),
                ("read-stream", "1500"),
                ("read-stream", "1500"),
                ("write", "5"),
            ],
        );
        let sem = run_workers(&url, &sem_ns, &[("sem:2", "12"); 4]);
        let multi = run_workers(
            &url,
            &multi_ns,
            &[
                ("multi-ab", "10"),
                ("multi-ba", "10"),
                ("multi-ab", "10"),
                ("multi-ba", "10"),
            ],
        );
        let (rw, sem, multi) = tokio::join!(rw, sem, multi);
        let name = kind.name();
        assert!(
            rw.iter().all(|(_, v)| *v == 0),
            "{name}: a writer overlapped: {rw:?}"
        );
        assert!(rw[..3].iter().all(|(h, _)| *h > 0), "{name}: {rw:?}");
        assert_eq!(rw[3].0, 5, "{name}: the writer was starved: {rw:?}");
        assert!(
            sem.iter().all(|&(h, v)| h == 12 && v == 0),
            "{name}: more than 2 permit holders: {sem:?}"
        );
        assert!(
            multi.iter().all(|&(h, v)| h == 10 && v == 0),
            "{name}: multi-key holders overlapped or stalled: {multi:?}"
        );
    }
}

/// The read-write lock and the semaphore announce a release on the key's channel to the waiter
/// it lets in (a reader behind a writer, a writer behind a reader, a permit behind a permit): a
/// waiter in another client (another process) retries at once instead of at its next poll
/// (a backoff from 2 ms doubling to 200 ms, which stays the fallback). Seven rounds each, with
/// the waiter's backoff grown to 100-200 ms before the release: by polling alone, about one
/// entry in eight comes within 20 ms of the release; here the median must.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_clients_are_told_of_a_read_write_or_semaphore_release() {
    for kind in ServerKind::ALL {
        let url = harness::shared(kind).url();
        let (holder, waiter) = (
            LockClient::connect(&url).await.expect("connect"),
            LockClient::connect(&url).await.expect("connect"),
        );
        let options = LockOptions::new().namespace("announced-release");
        for primitive in ["write then read", "read then write", "permit"] {
            let mut delays = Vec::new();
            for _ in 0..7 {
                delays.push(release_to_entry(&holder, &waiter, &options, primitive).await);
            }
            delays.sort();
            println!(
                "{} {primitive}: the other client entered {delays:?} after the release",
                kind.name()
            );
            assert!(
                delays[3] < Duration::from_millis(20),
                "{} {primitive}: median {:?} from the release to the other client's entry: \
                 {delays:?}",
                kind.name(),
                delays[3]
            );
        }
    }
}

/// `holder` holds `primitive` on its key for 400 ms while `waiter` waits for it; how long after
/// the holder's body ended the waiter's body started.
async fn release_to_entry(
    holder: &LockClient,
    waiter: &LockClient,
    options: &LockOptions,
    primitive: &str,
) -> Duration {
    let released = std::sync::Mutex::new(None::<Instant>);
    let hold = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        *released.lock().expect("lock") = Some(Instant::now());
    };
    let wait = Duration::from_secs(3);
    let entered = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let entered = async { Instant::now() };
        if primitive == "permit" {
            let permits = waiter
                .semaphore_with::<str>(1, options.clone())
                .expect("opts");
            permits.acquire("s", wait, entered).await
        } else {
            let rw = waiter.rw_lock_with::<str>(options.clone()).expect("opts");
            if primitive == "read then write" {
                rw.write("rw", wait, entered).await
            } else {
                rw.read("rw", wait, entered).await
            }
        }
    };
    let holding = async {
        if primitive == "permit" {
            let permits = holder
                .semaphore_with::<str>(1, options.clone())
                .expect("opts");
            permits.acquire("s", wait, hold).await
        } else {
            let rw = holder.rw_lock_with::<str>(options.clone()).expect("opts");
            if primitive == "read then write" {
                rw.read("rw", wait, hold).await
            } else {
                rw.write("rw", wait, hold).await
            }
        }
    };
    let (held, entered) = tokio::join!(holding, entered);
    held.unwrap_or_else(|e| panic!("{primitive}: holder: {e:?}"));
    let entered = entered.unwrap_or_else(|e| panic!("{primitive}: waiter: {e:?}"));
    let released = released
        .lock()
        .expect("lock")
        .expect("the holder's body ended");
    entered.saturating_duration_since(released)
}

/// Uncontended holds of the read-write lock and the semaphore publish nothing: a release
/// announces itself only while a waiting caller has marked the key (one that was refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_releases_announce_nothing() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let options = LockOptions::new().namespace("quiet");
        let rw = client.rw_lock_with::<str>(options.clone()).expect("opts");
        let permits = client.semaphore_with::<str>(2, options).expect("opts");
        let wait = Duration::from_secs(1);
        for _ in 0..10 {
            rw.read("k", wait, async {}).await.expect("read");
            rw.write("k", wait, async {}).await.expect("write");
            permits.acquire("k", wait, async {}).await.expect("permit");
        }
        let published = harness::commandstats_calls(server.port(), "spublish");
        assert_eq!(
            published,
            0,
            "{}: uncontended releases published",
            kind.name()
        );
        // A waiting reader behind a writer: the writer's release is announced.
        let writing = rw.write("k", wait, tokio::time::sleep(Duration::from_millis(200)));
        let reading = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            rw.read("k", wait, async {}).await
        };
        let (written, read) = tokio::join!(writing, reading);
        written.expect("write");
        read.expect("read");
        assert!(
            harness::commandstats_calls(server.port(), "spublish") >= 1,
            "{}: a release with a waiter was not announced",
            kind.name()
        );
    }
}

/// A wait that runs out while the server stops answering (SIGSTOP) ends at its deadline: the
/// release that undoes its last, unanswered attempt (which the server may still grant) goes on
/// in the background instead of holding the caller up to `RELEASE_TIMEOUT` past its wait; and
/// once the server answers again, that release frees the key. Both `with_lock` (800 ms wait)
/// and `try_with_lock` (its 1 s window for transient failures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_a_stalled_server_ends_at_its_deadline() {
    /// What the caller may wait past its deadline: fred's timer, the scheduler.
    const LATE: Duration = Duration::from_millis(300);
    for kind in ServerKind::ALL {
        let name = kind.name();
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("stalled-wait"))
            .expect("opts");
        locks
            .with_lock("warm", Duration::from_secs(1), async {})
            .await
            .expect("warm");
        let wait = Duration::from_millis(800);
        for (what, key, limit) in [
            ("with_lock", "waited", wait),
            ("try_with_lock", "tried", sage_lock::TRY_LOCK_RETRY_WINDOW),
        ] {
            server.pause();
            let started = Instant::now();
            let result = if what == "with_lock" {
                locks.with_lock(key, wait, async {}).await.map(Some)
            } else {
                locks.try_with_lock(key, async {}).await
            };
            let took = started.elapsed();
            server.resume();
            println!("{name}: {what} on a stalled server -> {result:?} after {took:?}");
            assert!(
                matches!(
                    result,
                    Err(LockError::TimedOut {
                        reason: TimeoutReason::Unavailable(_),
                        ..
                    })
                ),
                "{name}: {what}: {result:?}"
            );
            assert!(
                took < limit + LATE,
                "{name}: {what} returned {took:?} after the call ({limit:?} to wait)"
            );
            // The attempt the server took late is undone by the release sent after it.
            let freed = Instant::now() + Duration::from_secs(3);
            while locks.is_locked(key).await.expect("is_locked") {
                assert!(
                    Instant::now() < freed,
                    "{name}: {what}: the key stayed held after the server answered again"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        client.quit().await;
    }
}

/// README, Semantics: "Release: compare-and-delete, bounded to 1 s." A server that stops
/// answering as the body ends (SIGSTOP) does not hold `with_lock` up for the command timeout
/// (5 s by default): the body's value comes back about a second later, and the lease expires on
/// the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_to_a_stalled_server_is_bounded_to_a_second() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks: Locks<str> = client
            .lock_with(
                LockOptions::new()
                    .namespace("release-bound")
                    .lease(Duration::from_secs(10)),
            )
            .expect("opts");
        let mut body_ended = None;
        let result = locks
            .with_lock("k", Duration::from_secs(2), async {
                server.pause();
                body_ended = Some(Instant::now());
                7
            })
            .await;
        let returned = Instant::now();
        server.resume();
        let took = returned - body_ended.expect("the body ran");
        println!(
            "{}: release to a stalled server -> {result:?} after {took:?}",
            kind.name()
        );
        assert_eq!(result.expect("the body's value"), 7, "{}", kind.name());
        assert!(
            took < Duration::from_millis(1700),
            "{}: with_lock returned {took:?} after the body ended (release bounded to 1 s)",
            kind.name()
        );
    }
}

/// `LockClient::from_fred` called outside any Tokio runtime (a plain `fn main` before
/// `block_on`, a `LazyLock` initializer) starts its connection on first use inside a runtime:
/// whichever call comes first (an operator call, a lock, a command on `LockClient::fred`), it
/// answers at once instead of timing out. A fred client the caller connected themselves is left
/// untouched (the lock client opens its own connection) and keeps working after `quit`.
#[test]
fn from_fred_outside_a_runtime_connects_on_first_use() {
    use sage_lock::fred::interfaces::ClientLike as _;
    use sage_lock::fred::types::Builder;
    use sage_lock::fred::types::config::Config;

    /// Every call below answers in well under this on a healthy local server.
    const QUICK: Duration = Duration::from_secs(2);

    fn fred_for(url: &str) -> sage_lock::fred::clients::Client {
        let config = Config::from_url(url).expect("url");
        Builder::from_config(config)
            .build()
            .expect("build a fred client")
    }
    /// `call` within [`QUICK`] (bounded at 3× that so a hang fails instead of stalling).
    async fn quick<T>(what: &str, call: impl std::future::Future<Output = T>) -> T {
        let started = Instant::now();
        let outcome = tokio::time::timeout(3 * QUICK, call).await;
        let took = started.elapsed();
        let value = outcome.unwrap_or_else(|_| panic!("{what}: no answer after {took:?}"));
        println!("{what}: {took:?}");
        assert!(took < QUICK, "{what}: took {took:?}");
        value
    }

    for kind in ServerKind::ALL {
        let name = kind.name();
        let url = harness::shared(kind).url();
        let ns = format!("from-fred-no-rt-{name}-{}", rand::random::<u32>());
        let options = || LockOptions::new().namespace(&ns);

        // 1. An operator call first, then locks, operator tools and a dedicated connection.
        let client = LockClient::from_fred(fred_for(&url));
        harness::multi_thread_runtime().block_on(async {
            let locks: Locks<str> = client.lock_with(options()).expect("opts");
            let free = quick("is_locked first", locks.is_locked("k")).await;
            assert!(!free.unwrap_or_else(|e| panic!("{name}: is_locked: {e}")));
            let inside = quick(
                "with_lock",
                locks.with_lock("k", QUICK, async {
                    let held = locks.is_locked("k").await.expect("is_locked while held");
                    let holder = locks.holder("k").await.expect("holder while held");
                    (held, holder.is_some())
                }),
            )
            .await;
            let inside = inside.unwrap_or_else(|e| panic!("{name}: with_lock: {e}"));
            assert_eq!(inside, (true, true), "{name}: is_locked/holder inside");
            let held = quick("scan", locks.scan()).await.expect("scan");
            assert!(held.is_empty(), "{name}: released, yet scan found {held:?}");
            let removed = quick("force_unlock", locks.force_unlock("k")).await;
            assert!(!removed.expect("force_unlock"), "{name}: nothing to remove");
            let dedicated = quick("dedicated", client.dedicated_connection(QUICK)).await;
            let pong: String = dedicated
                .expect("dedicated")
                .ping(None)
                .await
                .expect("ping");
            assert_eq!(pong, "PONG");
            client.quit().await;
        });

        // 2. A lock first.
        let client = LockClient::from_fred(fred_for(&url));
        harness::multi_thread_runtime().block_on(async {
            let locks: Locks<str> = client.lock_with(options()).expect("opts");
            let value = quick("with_lock first", locks.with_lock("k2", QUICK, async { 7 })).await;
            assert_eq!(
                value.unwrap_or_else(|e| panic!("{name}: with_lock: {e}")),
                7
            );
            client.quit().await;
        });

        // 3. A fred client the caller connected themselves (in the runtime used below), wrapped
        //    outside it; a command of one's own on `LockClient::fred` first.
        let own = fred_for(&url);
        let runtime = harness::multi_thread_runtime();
        runtime
            .block_on(async { own.init().await.map(drop) })
            .expect("connect the caller's client");
        let client = LockClient::from_fred(own.clone());
        runtime.block_on(async {
            let pong: Result<String, _> = quick("fred() first", client.fred().ping(None)).await;
            assert_eq!(pong.unwrap_or_else(|e| panic!("{name}: ping: {e}")), "PONG");
            let locks: Locks<str> = client.lock_with(options()).expect("opts");
            let value = quick("with_lock", locks.with_lock("k3", QUICK, async { 8 })).await;
            assert_eq!(
                value.unwrap_or_else(|e| panic!("{name}: with_lock: {e}")),
                8
            );
            client.quit().await;
            let pong: Result<String, _> = quick("the caller's client", own.ping(None)).await;
            assert_eq!(
                pong.unwrap_or_else(|e| panic!("{name}: the caller's client after quit: {e}")),
                "PONG"
            );
            let _ = own.quit().await;
        });
        println!("{name}: from_fred outside a runtime: every first call answered in time");
    }
}

/// A `Lease` that outlives its hold (cloned into a spawned task, sent out of the body) reports
/// the hold's end: after a release, a cancellation, a loss, and for `with_locks`, `is_valid()`
/// is false and `remaining()` zero. It went on counting down the lease as if still held. And
/// `LockLost::held` is how long the lock was held, not that plus the failed release that
/// follows the loss (a lock lost on a stalled server reported about a second more than its
/// lease), and `LockLost` reaches the caller at the loss, not up to `RELEASE_TIMEOUT` later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_outlives_its_hold_reports_it_ended() {
    fn escaped(what: &str, lease: Option<sage_lock::Lease>) {
        let lease = lease.unwrap_or_else(|| panic!("{what}: the body never sent its lease"));
        println!(
            "{what}: escaped lease valid {} remaining {:?}",
            lease.is_valid(),
            lease.remaining()
        );
        assert!(
            !lease.is_valid() && lease.remaining().is_zero(),
            "{what}: {lease:?} still valid after its hold ended"
        );
    }
    for kind in ServerKind::ALL {
        let name = kind.name();
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let lease = Duration::from_secs(1);
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("lease-end").lease(lease))
            .expect("opts");
        let wait = Duration::from_secs(2);

        let released = locks
            .with_lock("released", wait, async { sage_lock::current_lease() })
            .await
            .expect("lock");
        escaped(&format!("{name}: released"), released);

        let mut sent = None;
        let cancelled = tokio::time::timeout(
            Duration::from_millis(200),
            locks.with_lock("cancelled", wait, async {
                sent = sage_lock::current_lease();
                std::future::pending::<()>().await;
            }),
        )
        .await;
        assert!(cancelled.is_err(), "{name}: the body was not cancelled");
        escaped(&format!("{name}: cancelled"), sent.take());

        let several = locks
            .with_locks(&["several:a", "several:b"], wait, async {
                sage_lock::current_lease()
            })
            .await
            .expect("with_locks");
        escaped(&format!("{name}: with_locks"), several);

        // Lost: the server stops answering 100 ms into the body, so renewal fails until the
        // usable lease runs out; the release that follows the loss waits up to a second.
        let mut sent = None;
        let started = Instant::now();
        let result = locks
            .with_lock("lost", wait, async {
                sent = sage_lock::current_lease();
                tokio::time::sleep(Duration::from_millis(100)).await;
                server.pause();
                std::future::pending::<()>().await;
            })
            .await;
        let took = started.elapsed();
        server.resume();
        println!("{name}: lost -> {result:?} after {took:?}");
        let Err(LockError::LockLost { held, .. }) = result else {
            panic!("{name}: a stalled server's lock was not lost: {result:?}");
        };
        assert!(
            held <= lease + Duration::from_millis(100),
            "{name}: LockLost says the lock was held {held:?}, a {lease:?} lease (call took {took:?})"
        );
        // And the caller learns of the loss then, not after the release that follows it (it
        // waited up to RELEASE_TIMEOUT for the stalled server).
        assert!(
            took <= lease + Duration::from_millis(300),
            "{name}: LockLost came back {took:?} after the call, a {lease:?} lease"
        );
        let freed = Instant::now() + Duration::from_secs(3);
        while locks.is_locked("lost").await.expect("is_locked") {
            assert!(
                Instant::now() < freed,
                "{name}: the lost key stayed held after the server answered again"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        escaped(&format!("{name}: lost"), sent.take());
        client.quit().await;
    }
}

/// `max_connections(usize::MAX)` (a natural way to write "no limit") connects and locks; it
/// panicked in tokio's semaphore ("a semaphore may not have more than MAX_PERMITS permits")
/// after the connection was open. So does `renewal_batch_limit(usize::MAX)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbounded_pool_and_batch_settings_connect() {
    let server = Server::start(ServerKind::Redis);
    let connecting = tokio::spawn(
        LockClient::builder()
            .url(&server.url())
            .max_connections(usize::MAX)
            .renewal_batch_limit(usize::MAX)
            .connect(),
    );
    let client = connecting
        .await
        .expect("connect must not panic")
        .expect("connect");
    let locks = client.lock_with::<str>(
        LockOptions::new()
            .namespace("unbounded")
            .lease(Duration::from_millis(300)),
    );
    let locks = locks.expect("opts");
    let renewed = locks
        .with_lock("k", Duration::from_secs(1), async {
            tokio::time::sleep(Duration::from_millis(700)).await;
            sage_lock::current_lease().map(|lease| lease.is_valid())
        })
        .await
        .expect("lock");
    assert_eq!(renewed, Some(true), "the lease was not renewed");
    client.quit().await;
}

/// The server killed during a hold whose renewal gets no answer before the lease runs out: the
/// loss names why the client is not connected (the refused reconnections), not only "no
/// renewal completed in time" (an audit: the cause was hidden, while `TimedOut` named it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_lost_to_a_killed_server_names_the_cause() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks: Locks<str> = client
            .lock_with(
                LockOptions::new()
                    .namespace("killed-server")
                    .lease(Duration::from_secs(2)),
            )
            .expect("opts");
        let result = locks
            .with_lock("k", Duration::from_secs(1), async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                server.kill();
                tokio::time::sleep(Duration::from_secs(10)).await;
            })
            .await;
        let Err(error @ LockError::LockLost { .. }) = result else {
            panic!("{kind}: expected LockLost, got {result:?}");
        };
        let text = error.to_string();
        println!("{kind}: {text}");
        assert!(
            text.contains("refused") || text.contains("not connected"),
            "{kind}: the loss does not name the cause: {text}"
        );
        client.quit().await;
    }
}

/// A server out of memory (`maxmemory` reached, `noeviction`) refuses acquisitions with an
/// error naming the limit and the fix, not only the server's "OOM command not allowed", and
/// grants again once memory is available (audit 51: the OOM error named no fix, unlike the
/// ACL and credential errors).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_refused_out_of_memory_names_the_fix() {
    for kind in ServerKind::ALL {
        let server = harness::Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("oom"))
            .expect("opts");
        locks
            .with_lock("warm", Duration::from_secs(2), async {})
            .await
            .expect("warm");
        server.cmd_ok(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        server.cmd_ok(&["CONFIG", "SET", "maxmemory", "1"]);
        let refused = locks.with_lock("k", Duration::from_secs(2), async {}).await;
        println!("{kind}: {refused:?}");
        let Err(error @ LockError::Backend { .. }) = &refused else {
            panic!("{kind}: expected a Backend error, got {refused:?}");
        };
        let text = error.to_string();
        assert!(
            text.contains("OOM") && text.contains("raise maxmemory"),
            "{kind}: {text}"
        );
        server.cmd_ok(&["CONFIG", "SET", "maxmemory", "0"]);
        locks
            .with_lock("k", Duration::from_secs(2), async {})
            .await
            .unwrap_or_else(|error| panic!("{kind}: after raising maxmemory: {error}"));
        client.quit().await;
    }
}

/// A release the server refuses for its whole bound (`BUSY`: another client's script runs past
/// `busy-reply-threshold`) counts as a release failure whose warning quotes the refusal, not
/// "no reply before the deadline" (audit 51: the server had answered `BUSY` to every attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_busy_quotes_the_refusal() {
    use tracing::instrument::WithSubscriber as _;
    for kind in ServerKind::ALL {
        let server = harness::Server::start(kind);
        server.cmd_ok(&["CONFIG", "SET", "busy-reply-threshold", "100"]);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks: Locks<str> = client
            .lock_with(
                LockOptions::new()
                    .namespace("busy-release")
                    .lease(Duration::from_secs(20)),
            )
            .expect("opts");
        let captured = harness::Captured::default();
        let port = server.port();
        let before = client.stats();
        locks
            .with_lock("k", Duration::from_secs(2), async {
                // Another client's script keeps the server busy for 2.5 s.
                std::thread::spawn(move || {
                    let script = "local t = tonumber(redis.call('TIME')[1]) \
                                  while tonumber(redis.call('TIME')[1]) - t < 3 do end return 1";
                    let _ =
                        harness::cmd_timeout(port, &["EVAL", script, "0"], Duration::from_secs(10));
                });
                tokio::time::sleep(Duration::from_millis(300)).await;
            })
            .with_subscriber(captured.warn_subscriber())
            .await
            .expect("with_lock");
        let after = client.stats();
        let text = captured.text();
        println!("{kind}: {text}");
        assert_eq!(
            after.release_failures - before.release_failures,
            1,
            "{kind}: {after:?}"
        );
        assert!(text.contains("BUSY"), "{kind}: {text}");
        // The script ends within 3 s.
        tokio::time::sleep(Duration::from_secs(3)).await;
        client.quit().await;
    }
}

/// A lease only a few round trips long is warned about once, at the grant that shows it: at
/// 300 ms round trips a 1 s lease holds for one renewal at best (audit 52: with 600 ms round
/// trips every hold was lost 977 ms in, and nothing said why). A lease of many round trips is
/// not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_a_few_round_trips_is_warned_about() {
    use harness::chaos::proxy::{Mode, Proxy};
    use tracing::instrument::WithSubscriber as _;
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let proxy = Proxy::start(server.port()).expect("proxy");
        let client = LockClient::connect(&format!("redis://127.0.0.1:{}", proxy.port()))
            .await
            .expect("connect");
        let options = |lease| LockOptions::new().namespace("few-round-trips").lease(lease);
        let long: Locks<str> = client
            .lock_with(options(Duration::from_secs(1)))
            .expect("opts");
        let captured = harness::Captured::default();
        // Near: a 1 s lease is hundreds of round trips.
        long.with_lock("near", Duration::from_secs(5), async {})
            .with_subscriber(captured.warn_subscriber())
            .await
            .expect("near");
        assert!(captured.text().is_empty(), "{kind}: {}", captured.text());
        proxy.set_mode(Mode::Latency(Duration::from_millis(150)));
        // Far: the same lease is about three round trips. Warned once, not per acquisition.
        for _ in 0..2 {
            let _ = long
                .with_lock("far", Duration::from_secs(5), async {})
                .with_subscriber(captured.warn_subscriber())
                .await;
        }
        let text = captured.text();
        println!("{kind}: {text}");
        assert_eq!(
            text.matches("round trip").count(),
            1,
            "{kind}: one warning naming the round trip: {text}"
        );
        assert!(text.contains("lease"), "{kind}: {text}");
        proxy.set_mode(Mode::Normal);
        client.quit().await;
    }
}
