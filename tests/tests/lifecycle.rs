//! A service's lifecycle around its `LockClient`: calls after `quit()`, `quit()` while bodies
//! hold locks or tasks wait, clients dropped outside any runtime, runtimes shut down mid-hold.
//! Each test starts servers of its own, so connection counts are this test's alone.

use std::time::{Duration, Instant};

use harness::{Server, ServerKind, connected_clients, settle_clients};
use sage_lock::fred::error::ErrorKind;
use sage_lock::fred::interfaces::{ClientLike, KeysInterface};
use sage_lock::{LockClient, LockError, LockOptions, Locks};

/// How long a call on a closed client may take: it sends nothing, so this is generous.
const AT_ONCE: Duration = Duration::from_millis(500);

/// The command timeout of the client in `calls_after_quit_fail_at_once_and_open_nothing`.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);

fn options(ns: &str, lease: Duration) -> LockOptions {
    LockOptions::new().namespace(ns).lease(lease)
}

/// The lock key's remaining lease on the server, in ms (-2: no key).
async fn pttl(observer: &LockClient, ns: &str, key: &str) -> i64 {
    let server_key = LockClient::server_key(ns, key);
    observer
        .fred()
        .pttl(sage_lock::fred::types::Key::from(server_key.as_slice()))
        .await
        .expect("PTTL")
}

/// Asserts that `result`, returned after `took`, is the prompt error of a closed client.
fn assert_closed<T: std::fmt::Debug>(what: &str, result: Result<T, LockError>, took: Duration) {
    match result {
        Err(error @ LockError::Backend { .. }) if error.to_string().contains("quit") => {}
        other => panic!("{what} after quit: {other:?} in {took:?} (not an error naming quit)"),
    }
    println!("{what} after quit: failed in {took:?}");
    assert!(took < AT_ONCE, "{what} after quit took {took:?}");
}

/// Every call on a client after `quit()` (and on its clones) fails at once with an error that
/// names quit, and opens no connection. It waited instead for its deadline and failed with a
/// timeout that blamed the server: `with_lock` (3 s wait) 4.0 s with `TimedOut { reason:
/// Unavailable("no reply from the server within the wait") }`, `try_with_lock` 2.0 s,
/// `is_locked`, `force_unlock` and `scan` 5.0 s each with a `Timeout`; and
/// `dedicated_connection` opened a new connection and lent it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_quit_fail_at_once_and_open_nothing() {
    for kind in ServerKind::ALL {
        let name = kind.name();
        let server = Server::start(kind);
        let port = server.port();
        let baseline = connected_clients(port);
        let client = LockClient::builder()
            .url(&server.url())
            .command_timeout(COMMAND_TIMEOUT)
            .connect()
            .await
            .expect("connect");
        let locks: Locks<str> = client
            .lock_with(options("after-quit", Duration::from_secs(5)))
            .expect("opts");
        locks
            .with_lock("k", Duration::from_secs(1), async {})
            .await
            .expect("before quit");
        // Two clones quit at once (as two shutdown paths might).
        let clone = client.clone();
        let quits = Instant::now();
        tokio::join!(client.quit(), clone.quit());
        let quits = quits.elapsed();
        assert!(
            quits < Duration::from_secs(2),
            "{name}: quit took {quits:?}"
        );
        let after_quit = settle_clients(port, baseline, Duration::from_secs(3)).await;
        assert!(
            after_quit <= baseline,
            "{name}: {after_quit} open after quit"
        );

        let start = Instant::now();
        let result = locks.with_lock("k", Duration::from_secs(3), async {}).await;
        assert_closed("with_lock", result, start.elapsed());
        let start = Instant::now();
        let result = locks.try_with_lock("k", async {}).await;
        assert_closed("try_with_lock", result, start.elapsed());
        let start = Instant::now();
        let result = locks.is_locked("k").await;
        assert_closed("is_locked", result, start.elapsed());
        let start = Instant::now();
        let result = locks.holder("k").await;
        assert_closed("holder", result, start.elapsed());
        let start = Instant::now();
        let result = locks.force_unlock("k").await;
        assert_closed("force_unlock", result, start.elapsed());
        let start = Instant::now();
        let result = locks.scan().await;
        assert_closed("scan", result, start.elapsed());
        let start = Instant::now();
        let result = client.dedicated_connection(Duration::from_secs(3)).await;
        assert_closed("dedicated_connection", result, start.elapsed());
        // The fred client behind it is closed too: a command of the caller's own is not sent
        // and fails after the client's command timeout (1 s here), without reconnecting.
        let start = Instant::now();
        let ping =
            tokio::time::timeout(Duration::from_secs(10), client.fred().ping::<String>(None)).await;
        let took = start.elapsed();
        println!("{name}: fred().ping() after quit: {ping:?} in {took:?}");
        assert!(
            matches!(&ping, Ok(Err(error)) if matches!(
                error.kind(),
                ErrorKind::Timeout | ErrorKind::Canceled
            )),
            "{name}: fred().ping() after quit: {ping:?} in {took:?} (expected fred's Timeout)"
        );
        assert!(
            took < COMMAND_TIMEOUT + AT_ONCE,
            "{name}: fred().ping() after quit took {took:?}"
        );
        let start = Instant::now();
        let result = client
            .rw_lock::<str>()
            .read("k", Duration::from_secs(3), async {})
            .await;
        assert_closed("rw_lock read", result, start.elapsed());
        let start = Instant::now();
        let result = client
            .semaphore::<str>(2)
            .acquire("k", Duration::from_secs(3), async {})
            .await;
        assert_closed("semaphore acquire", result, start.elapsed());
        let start = Instant::now();
        let result = clone
            .clone()
            .lock::<str>()
            .with_lock("k", Duration::from_secs(3), async {})
            .await;
        assert_closed("a later clone's with_lock", result, start.elapsed());
        // Quitting again is harmless.
        let again = Instant::now();
        clone.quit().await;
        assert!(
            again.elapsed() < AT_ONCE,
            "{name}: a second quit took {:?}",
            again.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let left = connected_clients(port);
        assert!(
            left <= baseline,
            "{name}: {left} connections after calls on a closed client (baseline {baseline})"
        );
    }
}

/// `quit()` while one task's body holds a lock and others wait for it: the waiters (the local
/// leader, which asks the server, and a follower behind it) fail at once, naming quit; they
/// waited out their whole wait and reported `TimedOut { reason: Busy }` (4 s wait: 5.0 s). The
/// holder keeps its lock, unrenewed, until its usable lease runs out, then fails with
/// `LockLost` naming quit; it returned 1 s later than that (2.96 s for a 2 s lease: its release
/// waited out `RELEASE_TIMEOUT` on the closed connection) and blamed "no renewal completed in
/// time". Nothing renews the lock after quit: it expires with its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quit_stops_waiters_at_once_and_holders_keep_only_their_lease() {
    let lease = Duration::from_secs(2);
    for kind in ServerKind::ALL {
        let name = kind.name();
        let server = Server::start(kind);
        let port = server.port();
        let observer = LockClient::connect(&server.url()).await.expect("connect");
        let baseline = connected_clients(port);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let ns = "quit-holding";
        let locks: Locks<str> = client.lock_with(options(ns, lease)).expect("opts");
        let (held, is_held) = tokio::sync::oneshot::channel();
        let holder = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let result = locks
                    .with_lock("k", Duration::from_secs(1), async {
                        let _ = held.send(Instant::now());
                        tokio::time::sleep(Duration::from_secs(4)).await;
                    })
                    .await;
                (result, Instant::now())
            })
        };
        let acquired = is_held.await.expect("held");
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let locks = locks.clone();
                tokio::spawn(async move {
                    let result = locks.with_lock("k", Duration::from_secs(4), async {}).await;
                    (result, Instant::now())
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let renewals = client.stats().renewals;
        let quit_at = Instant::now();
        client.quit().await;
        let left = pttl(&observer, ns, "k").await;
        assert!(
            left > 0,
            "{name}: the lock was not left to its lease ({left} ms)"
        );
        for waiter in waiters {
            let (result, ended) = waiter.await.expect("waiter task");
            assert_closed("a waiter", result, ended - quit_at);
        }
        let (result, ended) = holder.await.expect("holder task");
        let held_for = ended - acquired;
        match &result {
            Err(error @ LockError::LockLost { .. }) if error.to_string().contains("quit") => {}
            other => panic!("{name}: the holder got {other:?}"),
        }
        println!("{name}: the holder ({lease:?} lease) returned {held_for:?} after acquiring");
        assert!(
            held_for > lease / 2 && held_for < lease + Duration::from_millis(300),
            "{name}: the holder returned {held_for:?} after acquiring ({lease:?} lease)"
        );
        assert_eq!(
            client.stats().renewals,
            renewals,
            "{name}: renewed after quit"
        );
        // Expires with its lease, renewed by nothing.
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut gone = pttl(&observer, ns, "k").await;
        while gone != -2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            gone = pttl(&observer, ns, "k").await;
        }
        assert_eq!(gone, -2, "{name}: the lock outlived its lease");
        let open = connected_clients(port);
        assert!(
            open <= baseline,
            "{name}: {open} open after quit (baseline {baseline})"
        );
        observer.quit().await;
    }
}

/// The last handle of a client dropped in plain code (no runtime), while the runtime that
/// connected it still runs: its shared and subscriber connections close (the shared one is
/// aborted, there is no runtime to `QUIT` from).
#[test]
fn a_client_dropped_outside_any_runtime_closes_its_connections() {
    for kind in ServerKind::ALL {
        let name = kind.name();
        let server = Server::start(kind);
        let port = server.port();
        let baseline = connected_clients(port);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let client = runtime.block_on(async {
            let client = LockClient::connect(&server.url()).await.expect("connect");
            let holder = LockClient::connect(&server.url()).await.expect("connect");
            let ns = "plain-drop";
            let waiting: Locks<str> = client
                .lock_with(options(ns, Duration::from_secs(3)))
                .expect("opts");
            let holding: Locks<str> = holder
                .lock_with(options(ns, Duration::from_secs(3)))
                .expect("opts");
            // A waiter behind another client's holder opens the subscriber connection.
            harness::wait_behind(&waiting, holding, "k").await;
            holder.quit().await;
            client
        });
        let open = connected_clients(port);
        assert!(
            open >= baseline + 2,
            "{name}: {open} open: no subscriber connection"
        );
        drop(client);
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut left = connected_clients(port);
        while left > baseline && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            left = connected_clients(port);
        }
        assert!(
            left <= baseline,
            "{name}: {left} open after dropping the client in plain code (baseline {baseline})"
        );
        drop(runtime);
    }
}

/// A runtime shut down while a body holds a lock: the lock is not renewed past that (it
/// expires with its lease, as nothing can release it), and the same client, on a new runtime,
/// takes it once the lease ran out. The same for a client made by `from_fred` (whose shared
/// connection is a fred client rebuilt from the caller's).
#[test]
fn a_lock_held_when_its_runtime_shuts_down_expires_with_its_lease() {
    let lease = Duration::from_secs(1);
    for (kind, from_fred) in ServerKind::ALL
        .into_iter()
        .flat_map(|kind| [(kind, false), (kind, true)])
    {
        let name = format!(
            "{}{}",
            kind.name(),
            if from_fred { " from_fred" } else { "" }
        );
        let server = Server::start(kind);
        let first = harness::multi_thread_runtime();
        let client = if from_fred {
            let config = sage_lock::fred::types::config::Config::from_url(&server.url())
                .expect("a fred config");
            let fred = sage_lock::fred::types::Builder::from_config(config)
                .build()
                .expect("a fred client");
            first.block_on(async { LockClient::from_fred(fred) })
        } else {
            first
                .block_on(LockClient::connect(&server.url()))
                .expect("connect")
        };
        let locks: Locks<str> = client
            .lock_with(options("runtime-shutdown", lease))
            .expect("opts");
        let (held, is_held) = std::sync::mpsc::channel();
        let holder = locks.clone();
        first.spawn(async move {
            let _ = holder
                .with_lock("k", Duration::from_secs(1), async {
                    let _ = held.send(Instant::now());
                    tokio::time::sleep(Duration::from_secs(60)).await;
                })
                .await;
        });
        let acquired = is_held.recv().expect("held");
        first.shutdown_timeout(Duration::from_secs(1));
        // Renewed until then at most (a loaded machine may take half the lease to get here,
        // and the lock is renewed meanwhile), and never after.
        let shut_down = Instant::now();
        harness::multi_thread_runtime().block_on(async {
            let taken = locks
                .with_lock("k", Duration::from_secs(3), async { Instant::now() })
                .await
                .unwrap_or_else(|e| panic!("{name}: the same client on a new runtime: {e}"));
            let after = taken - acquired;
            let after_shutdown = taken - shut_down;
            println!(
                "{name}: taken again {after:?} after the first hold began, {after_shutdown:?} \
                 after its runtime shut down ({lease:?} lease)"
            );
            assert!(
                after_shutdown < lease + Duration::from_millis(500),
                "{name}: the lock was held {after_shutdown:?} after its runtime shut down \
                 ({lease:?} lease)"
            );
            client.quit().await;
        });
    }
}

/// `quit()` while this client's tasks wait in the server's queue behind another process's
/// holder: they leave the queue before the connections close, so the holder's release goes to
/// the next live waiter (another process's). Before, their places stayed: the release handed
/// the lock to a dead waiter, and the live one waited out that hand-off lease (helper 31).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quit_leaves_the_server_queues_before_closing() {
    let lease = Duration::from_secs(6);
    for kind in ServerKind::ALL {
        let name = kind.name();
        let server = Server::start(kind);
        let ns = "quit-queued";
        let [holder, quitting, live] =
            [(); 3].map(|()| LockClient::builder().url(&server.url()).connect());
        let (holder, quitting, live) = (
            holder.await.expect("connect"),
            quitting.await.expect("connect"),
            live.await.expect("connect"),
        );
        let family = |client: &LockClient| -> Locks<str> {
            client.lock_with(options(ns, lease)).expect("opts")
        };
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        let (entered, is_held) = tokio::sync::oneshot::channel();
        let holding = {
            let locks = family(&holder);
            tokio::spawn(async move {
                locks
                    .with_lock("k", Duration::from_secs(1), async {
                        let _ = entered.send(());
                        let _ = held.await;
                        Instant::now()
                    })
                    .await
                    .expect("the holder")
            })
        };
        is_held.await.expect("held");
        let spawn_waiter = |locks: Locks<str>| {
            tokio::spawn(async move {
                let result = locks
                    .with_lock("k", Duration::from_secs(10), async { Instant::now() })
                    .await;
                (result, Instant::now())
            })
        };
        let dead = spawn_waiter(family(&quitting));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let next = spawn_waiter(family(&live));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let quit_at = Instant::now();
        quitting.quit().await;
        let (result, ended) = dead.await.expect("waiter task");
        assert_closed("a queued waiter", result, ended - quit_at);
        let _ = release.send(());
        let released = holding.await.expect("holder task");
        let (result, _) = next.await.expect("waiter task");
        let acquired = result.expect("the live waiter acquires");
        let after = acquired.saturating_duration_since(released);
        println!("{name}: the live waiter acquired {after:?} after the release");
        assert!(
            after < Duration::from_millis(800),
            "{name}: the live waiter acquired {after:?} after the release (a dead place kept it?)"
        );
        holder.quit().await;
        live.quit().await;
    }
}

/// A shutdown that cancels the tasks holding locks and then quits at once (a SIGTERM handler:
/// abort the workers, `quit()`): the releases the cancellations started in the background
/// complete before the connections close, so the locks are free at once, not left to their
/// lease. All 20 of 20 were left (4.99 s of their 5 s lease): `quit` closed the shared
/// connection before the background releases ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_of_cancelled_holders_finish_before_quit_closes() {
    const HOLDERS: usize = 20;
    for kind in ServerKind::ALL {
        let name = kind.name();
        let server = Server::start(kind);
        let observer = LockClient::connect(&server.url()).await.expect("connect");
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let ns = "cancel-then-quit";
        let locks: Locks<str> = client
            .lock_with(options(ns, Duration::from_secs(5)))
            .expect("opts");
        let mut tasks = Vec::new();
        for i in 0..HOLDERS {
            let (held, is_held) = tokio::sync::oneshot::channel();
            let locks = locks.clone();
            tasks.push(tokio::spawn(async move {
                let key = format!("k{i}");
                let _ = locks
                    .with_lock(key.as_str(), Duration::from_secs(2), async {
                        let _ = held.send(());
                        std::future::pending::<()>().await;
                    })
                    .await;
            }));
            is_held.await.expect("held");
        }
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        let quit = Instant::now();
        client.quit().await;
        let quit = quit.elapsed();
        println!("{name}: quit after cancelling {HOLDERS} holders took {quit:?}");
        assert!(quit < Duration::from_secs(2), "{name}: quit took {quit:?}");
        let mut left = Vec::new();
        for i in 0..HOLDERS {
            let key = format!("k{i}");
            let ttl = pttl(&observer, ns, &key).await;
            if ttl != -2 {
                left.push((key, ttl));
            }
        }
        assert!(
            left.is_empty(),
            "{name}: {} of {HOLDERS} locks left to their lease after cancel-then-quit: {left:?}",
            left.len()
        );
        observer.quit().await;
    }
}

/// Asks Sentinel for a failover away from the current primary and waits for it (retried while
/// Sentinel is not ready for another one). Returns the new primary's port.
fn sentinel_failover(setup: &harness::SentinelSetup) -> u16 {
    let old = setup.current_primary_port();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match setup.sentinels[0].cmd(&["SENTINEL", "FAILOVER", harness::SENTINEL_SERVICE]) {
            Ok(harness::Reply::Error(e)) if Instant::now() < deadline => {
                println!("SENTINEL FAILOVER refused ({e}); again");
                std::thread::sleep(Duration::from_millis(500));
            }
            Ok(harness::Reply::Error(e)) | Err(e) => panic!("SENTINEL FAILOVER: {e}"),
            Ok(_) => break,
        }
    }
    setup
        .wait_for_failover(old, Duration::from_secs(20))
        .expect("the failover completes")
}

/// Whether `client`'s shared connection is on the server at `port`.
fn shared_on(client: &LockClient, port: u16) -> bool {
    client
        .fred()
        .active_connections()
        .iter()
        .any(|server| server.port == port)
}

/// A runtime shut down while the shared connection was being moved to a new primary (a release
/// found the old one demoted; the reconnection waits on Sentinels that do not answer): on the
/// next runtime, the next failover still moves the shared connection within seconds. The flag
/// that marks a reconnection under way was cleared at the end of the reconnection task only,
/// which a runtime shutdown drops mid-way: every later reconnection was skipped, and the shared
/// connection stayed on a demoted primary until fred noticed by itself.
#[test]
fn a_runtime_shut_down_mid_reconnection_leaves_later_failovers_handled() {
    for kind in ServerKind::ALL {
        let name = kind.name();
        let setup = harness::SentinelSetup::start(kind);
        let first = harness::multi_thread_runtime();
        let (client, locks) = first.block_on(async {
            let client = LockClient::connect(&setup.url()).await.expect("connect");
            let locks: Locks<str> = client
                .lock_with(options("mid-reconnect", Duration::from_secs(2)))
                .expect("opts");
            locks
                .with_lock("warm", Duration::from_secs(2), async {})
                .await
                .expect("warm");
            (client, locks)
        });
        let promoted = sentinel_failover(&setup);
        first.block_on(async {
            // The acquisition reaches the new primary on a dedicated connection. The release,
            // on the shared connection still on the demoted one, starts the shared connection's
            // reconnection, which asks the Sentinels: stopped, they leave it pending.
            locks
                .with_lock("after", Duration::from_secs(10), async {
                    for sentinel in &setup.sentinels {
                        sentinel.pause();
                    }
                })
                .await
                .unwrap_or_else(|e| panic!("{name}: with_lock after the failover: {e}"));
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
        let moved_before_shutdown = shared_on(&client, promoted);
        // Drops the reconnection task mid-way.
        first.shutdown_timeout(Duration::from_millis(100));
        for sentinel in &setup.sentinels {
            sentinel.resume();
        }
        assert!(
            !moved_before_shutdown,
            "{name}: the reconnection completed before the runtime shut down: nothing tested"
        );
        let second = harness::multi_thread_runtime();
        second.block_on(async {
            // The shared connection starts again on this runtime, through Sentinel.
            locks
                .with_lock("again", Duration::from_secs(10), async {})
                .await
                .unwrap_or_else(|e| panic!("{name}: on the next runtime: {e}"));
        });
        let promoted_again = sentinel_failover(&setup);
        second.block_on(async {
            locks
                .with_lock("after-second", Duration::from_secs(10), async {})
                .await
                .unwrap_or_else(|e| panic!("{name}: with_lock after the second failover: {e}"));
            let released = Instant::now();
            let mut moved = None;
            while released.elapsed() < Duration::from_secs(15) {
                if shared_on(&client, promoted_again) {
                    moved = Some(released.elapsed());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            println!(
                "{name}: after the second failover, shared connection on the new primary after {moved:?}"
            );
            assert!(
                moved.is_some_and(|t| t < Duration::from_secs(5)),
                "{name}: the shared connection moved after {moved:?}: no reconnection"
            );
            client.quit().await;
        });
    }
}

/// Runs `call` to completion on another executor (`futures`' `block_on`, no Tokio runtime on
/// this thread) and asserts that it returned sage-lock's error naming the missing Tokio runtime,
/// not that it panicked.
fn fails_outside_tokio<T: std::fmt::Debug>(
    name: &str,
    what: &str,
    call: impl std::future::Future<Output = Result<T, LockError>>,
) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        futures::executor::block_on(call)
    }));
    match outcome {
        Ok(Err(error @ LockError::Backend { .. }))
            if error.to_string().contains("Tokio runtime") =>
        {
            println!("{name}: {what} outside a runtime: {error}");
        }
        Ok(other) => panic!("{name}: {what} outside a Tokio runtime returned {other:?}"),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(ToString::to_string)
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            panic!("{name}: {what} outside a Tokio runtime panicked: {message}");
        }
    }
}

#[sage_lock::locked(key = "macro:{id}", wait = "1s", namespace = "no-runtime", client = client)]
async fn locked_outside(client: &LockClient, id: u32) -> Result<u32, LockError> {
    Ok(id)
}

/// Every call made outside a Tokio runtime (another executor's `block_on`, a plain thread) is a
/// `Backend` error saying that sage-lock runs on Tokio and how to call it, instead of Tokio's
/// panic ("there is no reactor running, must be called from the context of a Tokio 1.x
/// runtime"): connecting, each primitive's waiting and trying calls, several keys at once, a
/// `#[locked]` fn, the operator tools and a dedicated connection. The client keeps working in
/// its runtime afterwards; `quit()` outside a runtime closes its connections, and later calls
/// fail naming quit.
#[test]
fn calls_outside_a_tokio_runtime_are_errors_not_panics() {
    for kind in ServerKind::ALL {
        let name = kind.name();
        let server = Server::start(kind);
        let baseline = connected_clients(server.port());
        let runtime = harness::multi_thread_runtime();
        let client = runtime
            .block_on(LockClient::connect(&server.url()))
            .expect("connect");
        let ns = "no-runtime";
        let locks: Locks<str> = client
            .lock_with(options(ns, Duration::from_secs(5)))
            .expect("opts");
        let rw = client
            .rw_lock_with::<str>(options(ns, Duration::from_secs(5)))
            .expect("opts");
        let slots = client
            .semaphore_with::<str>(2, options(ns, Duration::from_secs(5)))
            .expect("opts");
        let wait = Duration::from_secs(1);
        fails_outside_tokio(name, "connect", LockClient::connect(&server.url()));
        fails_outside_tokio(name, "with_lock", locks.with_lock("k", wait, async {}));
        fails_outside_tokio(name, "try_with_lock", locks.try_with_lock("k", async {}));
        fails_outside_tokio(
            name,
            "with_locks",
            locks.with_locks(&["a", "b"], wait, async {}),
        );
        fails_outside_tokio(
            name,
            "try_with_locks",
            locks.try_with_locks(&["a", "b"], async {}),
        );
        fails_outside_tokio(name, "read", rw.read("k", wait, async {}));
        fails_outside_tokio(name, "try_write", rw.try_write("k", async {}));
        fails_outside_tokio(
            name,
            "semaphore acquire",
            slots.acquire("k", wait, async {}),
        );
        fails_outside_tokio(name, "try_acquire", slots.try_acquire("k", async {}));
        fails_outside_tokio(name, "#[locked]", locked_outside(&client, 7));
        fails_outside_tokio(name, "is_locked", locks.is_locked("k"));
        fails_outside_tokio(name, "holder", locks.holder("k"));
        fails_outside_tokio(name, "force_unlock", locks.force_unlock("k"));
        fails_outside_tokio(name, "scan", locks.scan());
        fails_outside_tokio(
            name,
            "dedicated_connection",
            client.dedicated_connection(wait),
        );
        runtime.block_on(async {
            let ran = locks
                .with_lock("k", Duration::from_secs(3), async { true })
                .await
                .unwrap_or_else(|e| panic!("{name}: inside the runtime afterwards: {e}"));
            assert!(ran, "{name}: the body did not run");
        });
        let quit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            futures::executor::block_on(client.quit());
        }));
        assert!(
            quit.is_ok(),
            "{name}: quit() outside a Tokio runtime panicked"
        );
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut left = connected_clients(server.port());
        while left > baseline && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            left = connected_clients(server.port());
        }
        assert!(
            left <= baseline,
            "{name}: {left} connections open after quit() outside a runtime (baseline {baseline})"
        );
        runtime.block_on(async {
            let started = Instant::now();
            let after = locks.with_lock("k", Duration::from_secs(3), async {}).await;
            assert_closed(
                "with_lock after quit() outside a runtime",
                after,
                started.elapsed(),
            );
        });
    }
}

/// A client connected on a runtime of its own (which then runs its connection and renewal
/// tasks), with one call made there, and a lock family with `lease`.
fn connected_on_a_first_runtime(
    server: &Server,
    lease: Duration,
) -> (tokio::runtime::Runtime, LockClient, Locks<str>) {
    let first = harness::multi_thread_runtime();
    let client = first
        .block_on(LockClient::connect(&server.url()))
        .expect("connect");
    let locks: Locks<str> = client
        .lock_with(options("two-runtimes", lease))
        .expect("opts");
    // The first runtime starts the renewal task.
    first
        .block_on(locks.with_lock("first", Duration::from_secs(1), async {}))
        .expect("a call on the first runtime");
    (first, client, locks)
}

/// One client used from two runtimes at once (a `static` or global client under parallel
/// `#[tokio::test]`s): the runtime that connected it, and so ran its connection and renewal
/// tasks, shuts down while the other runtime holds a lock (and makes no other call). The hold
/// is renewed on (its 300 ms lease is shorter than the body): the renewal task moves to a
/// runtime that is still running.
#[test]
fn a_hold_outlives_the_runtime_that_connected_its_client() {
    let lease = Duration::from_millis(300);
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let (first, client, locks) = connected_on_a_first_runtime(&server, lease);
        let second = harness::multi_thread_runtime();
        let holding = second.spawn({
            let locks = locks.clone();
            async move {
                locks
                    .with_lock("held", Duration::from_secs(2), async {
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                    })
                    .await
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        first.shutdown_timeout(Duration::from_secs(1));
        second.block_on(async {
            let held = holding.await.expect("the holding task");
            println!("{kind}: the hold across the first runtime's shutdown: {held:?}");
            assert!(
                held.is_ok(),
                "{kind}: a hold on the second runtime was lost when the first runtime shut \
                 down: {held:?}"
            );
            client.quit().await;
        });
    }
}

/// The same, with calls on the second runtime instead: a command cut by the first runtime's
/// shutdown (fred's "channel closed", "Failed to send command to router") is retried within
/// the call's wait on a connection started again, not returned as a `Backend` error.
#[test]
fn calls_outlive_the_runtime_that_connected_their_client() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let (first, client, locks) = connected_on_a_first_runtime(&server, Duration::from_secs(5));
        let second = harness::multi_thread_runtime();
        let calling: Vec<_> = (0..8)
            .map(|task| {
                let locks = locks.clone();
                second.spawn(async move {
                    let start = Instant::now();
                    let mut calls = 0;
                    while start.elapsed() < Duration::from_millis(1000) {
                        locks
                            .with_lock(&format!("short-{task}"), Duration::from_secs(2), async {})
                            .await?;
                        calls += 1;
                    }
                    Ok::<_, LockError>(calls)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        first.shutdown_timeout(Duration::from_secs(1));
        second.block_on(async {
            let mut made = Vec::new();
            for (task, calls) in calling.into_iter().enumerate() {
                let calls = calls.await.expect("a calling task");
                assert!(
                    calls.is_ok(),
                    "{kind}: task {task}'s calls on the second runtime failed when the first \
                     runtime shut down: {calls:?}"
                );
                made.extend(calls.ok());
            }
            println!("{kind}: calls per task across the first runtime's shutdown: {made:?}");
            client.quit().await;
        });
    }
}
