//! A primary with two replicas behind three Sentinels: the behaviour suite through a
//! `redis-sentinel://` URL, and a failover while a lock is held.

mod common;

use std::time::{Duration, Instant};

use common::Target;
use harness::{SentinelSetup, ServerKind};
use sage_lock::{Deployment, LockClient, LockError, LockOptions, Locks};

fn target(kind: ServerKind) -> Target {
    Target {
        kind,
        url: harness::shared_sentinel(kind).url(),
        replicated: false,
        label: "sentinel",
        resp3: false,
    }
}

common::behaviour_suite!(target);
common::primitives::primitive_suite!(target);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_url_is_a_replicated_deployment() {
    let client = target(ServerKind::Redis).client().await;
    assert_eq!(client.deployment(), Deployment::Replicated);
}

/// `SENTINEL FAILOVER` while a lock is held: the holder gets `LockLost` and its body is cancelled;
/// new acquisitions succeed on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_loses_held_lock_then_new_primary_serves() {
    for kind in ServerKind::ALL {
        let setup = SentinelSetup::start(kind);
        let old_primary = setup.current_primary_port();
        let client = LockClient::connect(&setup.url())
            .await
            .expect("connect through sentinel");
        let lease = Duration::from_secs(1);
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("failover").lease(lease))
            .expect("opts");
        let mut failover_at = None;
        let result = locks
            .with_lock("k", Duration::from_secs(5), async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                setup.sentinels[0].cmd_ok(&["SENTINEL", "FAILOVER", harness::SENTINEL_SERVICE]);
                failover_at = Some(Instant::now());
                tokio::time::sleep(Duration::from_secs(30)).await;
                "body finished"
            })
            .await;
        let detected = failover_at.map(|t| t.elapsed()).unwrap_or_default();
        let Err(LockError::LockLost { ref reason, .. }) = result else {
            panic!(
                "{}: expected LockLost after failover, got {result:?}",
                kind.name()
            );
        };
        println!(
            "{}: sentinel failover -> LockLost after {detected:?}: {reason}",
            kind.name()
        );
        assert!(
            detected < Duration::from_secs(10),
            "{}: detection took {detected:?}",
            kind.name()
        );
        let new_primary = setup
            .wait_for_failover(old_primary, Duration::from_secs(20))
            .expect("failover completes");
        assert_ne!(new_primary, old_primary);
        let started = Instant::now();
        let value = locks
            .with_lock("k", Duration::from_secs(20), async { 9 })
            .await;
        assert_eq!(
            value.expect("acquire on the new primary"),
            9,
            "{}",
            kind.name()
        );
        println!(
            "{}: first acquisition after failover took {:?}",
            kind.name(),
            started.elapsed()
        );
        // Idle dedicated connections to the old primary are dropped on the failed renewal, so the
        // new primary serves at once (it took 5 s, a command timeout, before that).
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{}: {:?}",
            kind.name(),
            started.elapsed()
        );
        assert!(
            harness::commandstats_calls(new_primary, "evalsha")
                + harness::commandstats_calls(new_primary, "eval")
                > 0
        );
    }
}

/// After a `SENTINEL FAILOVER`, hand-offs come by release notification again within a few
/// rounds: the subscriber connection follows the primary. Before, it stayed on the demoted
/// primary, where the new primary's releases are not published, for about 10 s (an audit), and
/// every hand-off meanwhile took the 500 ms poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notifications_follow_a_failover() {
    for kind in ServerKind::ALL {
        let setup = SentinelSetup::start(kind);
        let old_primary = setup.current_primary_port();
        let options = || LockOptions::new().namespace("failover-notify");
        let a = LockClient::connect(&setup.url()).await.expect("connect");
        let b = LockClient::connect(&setup.url()).await.expect("connect");
        let (la, lb): (Locks<str>, Locks<str>) = (
            a.lock_with(options()).expect("opts"),
            b.lock_with(options()).expect("opts"),
        );
        let before = common::handoff_gap(&la, &lb, "k0").await;
        setup.sentinels[0].cmd_ok(&["SENTINEL", "FAILOVER", harness::SENTINEL_SERVICE]);
        setup
            .wait_for_failover(old_primary, Duration::from_secs(20))
            .expect("failover completes");
        let mut after = Vec::new();
        for i in 1..=8 {
            after.push(common::handoff_gap(&la, &lb, &format!("k{i}")).await);
        }
        println!("{kind}: hand-off {before:?} before the failover, then {after:?}");
        let slow = after[4..]
            .iter()
            .filter(|gap| **gap > Duration::from_millis(150))
            .count();
        assert!(
            slow <= 1,
            "{kind}: hand-offs after the failover took the poll: {after:?}"
        );
        a.quit().await;
        b.quit().await;
    }
}

/// A Sentinel's address behind a plain `redis://` URL is refused at connect, with the URL to
/// use. Before, `connect` succeeded and every call failed with "unknown command 'EVALSHA'"
/// (an audit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_behind_a_plain_url_is_refused() {
    for kind in ServerKind::ALL {
        let setup = harness::shared_sentinel(kind);
        let port = setup.sentinels[0].port();
        let result = LockClient::connect(&format!("redis://127.0.0.1:{port}")).await;
        let Err(LockError::InvalidArgument {
            argument: "url",
            message,
        }) = result
        else {
            panic!("{kind}: a Sentinel's URL was not refused: {result:?}");
        };
        println!("{kind}: {message}");
        assert!(
            message.contains("is a Sentinel") && message.contains("redis-sentinel://"),
            "{kind}: {message}"
        );
    }
}

/// With the old primary frozen (`SIGSTOP`) after Sentinel promoted a replica: a call's release
/// does not wait out its 1 s bound on the frozen node (where the client's shared connection
/// still is) and leave the key on the new primary until its lease ends: it is released there,
/// so the next caller gets in at once. Before, every call took 1.0 s to return, logged "release
/// not answered", and left its key held by nobody for its whole lease (helper 34).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_reach_the_new_primary_while_the_old_one_is_frozen() {
    for kind in ServerKind::ALL {
        let setup = SentinelSetup::start(kind);
        let old = setup.current_primary();
        let old_port = old.port();
        let client = LockClient::connect(&setup.url())
            .await
            .expect("connect through sentinel");
        let locks: Locks<str> = client
            .lock_with(
                LockOptions::new()
                    .namespace("frozen")
                    .lease(Duration::from_secs(10)),
            )
            .expect("opts");
        locks
            .with_lock("warm", Duration::from_secs(5), async {})
            .await
            .expect("before the freeze");
        old.pause();
        let new_primary = setup.wait_for_failover(old_port, Duration::from_secs(30));
        let outcome = async {
            let new_primary = new_primary.expect("failover completes");
            // The first calls after the promotion may still meet the frozen node.
            let mut last = None;
            for round in 0..6 {
                let key = format!("k{round}");
                let started = Instant::now();
                let result = locks
                    .with_lock(key.as_str(), Duration::from_secs(5), async {})
                    .await;
                let took = started.elapsed();
                let server_key = LockClient::server_key("frozen", key.as_str());
                let left = harness::cmd(
                    new_primary,
                    &["EXISTS", &String::from_utf8_lossy(&server_key)],
                )
                .ok()
                .and_then(|reply| reply.as_int());
                println!("{kind}: round {round}: {result:?} in {took:?}; key left: {left:?}");
                last = Some((result.is_ok(), took, left));
            }
            last
        }
        .await;
        old.resume();
        let (ok, took, left) = outcome.expect("rounds ran");
        assert!(ok, "{kind}: the last call failed");
        assert!(
            took < Duration::from_millis(900),
            "{kind}: a call took {took:?}: its release waited on the frozen node"
        );
        assert_eq!(
            left,
            Some(0),
            "{kind}: the released key is still on the new primary"
        );
        client.quit().await;
    }
}

/// Every kind of lock call once, each with a 3 s wait: `Ok` with how long the slowest took, or
/// the first failure.
async fn lock_calls(client: &LockClient, round: &str) -> Result<Duration, String> {
    let wait = Duration::from_secs(3);
    let options = || LockOptions::new().namespace("frozen-sentinel");
    let locks: Locks<str> = client.lock_with(options()).map_err(|e| e.to_string())?;
    let rw: sage_lock::RwLocks<str> = client.rw_lock_with(options()).map_err(|e| e.to_string())?;
    let slots: sage_lock::Semaphores<str> = client
        .semaphore_with(2, options())
        .map_err(|e| e.to_string())?;
    let (a, b) = (format!("{round}:a"), format!("{round}:b"));
    let mut slowest = Duration::ZERO;
    for call in ["with_lock", "write", "acquire", "with_locks"] {
        let started = Instant::now();
        let result = match call {
            "with_lock" => locks.with_lock(a.as_str(), wait, async {}).await,
            "write" => rw.write(a.as_str(), wait, async {}).await,
            "acquire" => slots.acquire(a.as_str(), wait, async {}).await,
            _ => {
                locks
                    .with_locks(&[a.as_str(), b.as_str()], wait, async {})
                    .await
            }
        };
        let took = started.elapsed();
        if let Err(error) = result {
            return Err(format!("{call} failed after {took:?}: {error}"));
        }
        slowest = slowest.max(took);
    }
    Ok(slowest)
}

/// Calls [`lock_calls`] until they all succeed, for at most `limit`: how long that took.
async fn recovery(client: &LockClient, round: &str, limit: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        match lock_calls(client, &format!("{round}{attempt}")).await {
            Ok(_) => return Ok(started.elapsed()),
            Err(error) if started.elapsed() >= limit => {
                return Err(format!(
                    "still failing after {:?} ({attempt} attempts): {error}",
                    started.elapsed()
                ));
            }
            Err(_) => {}
        }
    }
}

/// The Sentinel that fred asks first (the URL's first `node=`) frozen (`SIGSTOP`: it accepts
/// connections and never answers), the two others and the primary healthy: a new client
/// connects at once, and it, a client connected before the freeze but not used yet ("cold")
/// and one already used ("warm") succeed in every kind of lock call; after a `SENTINEL FAILOVER`
/// (through another Sentinel) they all take locks on the new primary again within a few
/// seconds. Before (audit 41), the new client's connect failed after the command timeout (fred
/// asks the Sentinels in order and, when the first accepts the connection but does not answer,
/// tries no other), and every replica-acknowledged call of the cold client timed out: each new
/// dedicated connection asked the frozen Sentinel first and was cut at the call's deadline. After
/// a failover, the warm client, whose idle connections were then closed, failed the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_sentinel_does_not_stop_lock_calls() {
    for kind in ServerKind::ALL {
        let setup = SentinelSetup::start(kind);
        let old_primary = setup.current_primary_port();
        let warm = LockClient::connect(&setup.url()).await.expect("connect");
        lock_calls(&warm, "warm")
            .await
            .unwrap_or_else(|e| panic!("{kind}: before the freeze: {e}"));
        let cold = LockClient::connect(&setup.url()).await.expect("connect");
        // fred asks the URL's `node=` Sentinels first, in order, and its host last.
        let first = fred::types::config::Config::from_url(&setup.url())
            .expect("url")
            .server
            .hosts()
            .first()
            .map(|host| host.port)
            .expect("a Sentinel");
        let (asked_first, others): (Vec<_>, Vec<_>) =
            setup.sentinels.iter().partition(|s| s.port() == first);
        let frozen = asked_first.first().expect("the first Sentinel").frozen();

        let mut failures = Vec::new();
        let started = Instant::now();
        let fresh =
            tokio::time::timeout(Duration::from_secs(20), LockClient::connect(&setup.url())).await;
        let connect_took = started.elapsed();
        println!("{kind}: connect with the first Sentinel frozen: {connect_took:?}");
        let fresh = match fresh {
            Ok(Ok(client)) => Some(client),
            Ok(Err(e)) => {
                failures.push(format!("connect failed after {connect_took:?}: {e}"));
                None
            }
            Err(_) => {
                failures.push(format!("connect hung for {connect_took:?}"));
                None
            }
        };
        if connect_took >= Duration::from_secs(3) {
            failures.push(format!("connect took {connect_took:?}"));
        }
        let mut clients = vec![("cold", &cold), ("warm", &warm)];
        if let Some(fresh) = &fresh {
            clients.insert(0, ("new", fresh));
        }
        for &(name, client) in &clients {
            for round in 0..3 {
                match lock_calls(client, &format!("{name}{round}")).await {
                    Ok(took) => {
                        println!("{kind}: {name} client, round {round}: slowest call {took:?}");
                        if took >= Duration::from_secs(2) {
                            failures.push(format!("{name} client: a lock call took {took:?}"));
                        }
                    }
                    Err(e) => {
                        println!("{kind}: {name} client, round {round}: {e}");
                        failures.push(format!("{name} client, round {round}: {e}"));
                        break;
                    }
                }
            }
        }

        others[0].cmd_ok(&["SENTINEL", "FAILOVER", harness::SENTINEL_SERVICE]);
        let new_primary = setup
            .wait_for_failover(old_primary, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{kind}: failover: {e}"));
        for &(name, client) in &clients {
            match recovery(client, &format!("after-{name}"), Duration::from_secs(20)).await {
                Ok(took) => {
                    println!(
                        "{kind}: {name} client: lock calls succeed {took:?} after the failover"
                    );
                    if took >= Duration::from_secs(8) {
                        failures.push(format!("{name} client: {took:?} after the failover"));
                    }
                }
                Err(e) => {
                    println!("{kind}: {name} client after the failover: {e}");
                    failures.push(format!("{name} client after the failover: {e}"));
                }
            }
        }
        assert!(
            harness::commandstats_calls(new_primary, "evalsha")
                + harness::commandstats_calls(new_primary, "eval")
                > 0,
            "{kind}: nothing ran on the new primary"
        );
        drop(frozen);
        assert!(failures.is_empty(), "{kind}: {failures:#?}");
        for client in clients.into_iter().map(|(_, client)| client) {
            client.quit().await;
        }
    }
}

/// A service started through Sentinel while the primary is down, before the Sentinels fail it
/// over, connects once they have, within its connect timeout, and locks on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_with_the_primary_down_waits_for_its_failover() {
    for kind in ServerKind::ALL {
        let setup = SentinelSetup::start(kind);
        let down = setup.current_primary_port();
        setup.current_primary().kill();
        let client = common::connect_through_failover(kind, &setup.url(), down).await;
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("connect-failover"))
            .expect("opts");
        locks
            .with_lock("k", Duration::from_secs(10), async {
                assert_ne!(
                    setup.current_primary_port(),
                    down,
                    "{kind}: not failed over"
                );
            })
            .await
            .unwrap_or_else(|error| panic!("{kind}: lock: {error}"));
        client.quit().await;
    }
}

/// A frozen primary (`SIGSTOP`), replaced by Sentinel, while callers with short waits keep a
/// small pool of dedicated connections busy: once the new primary is named, locks are taken
/// there within a few seconds. The new connections callers open to the frozen node while it is
/// still named never connect; finishing them in the background (for the next caller) must not
/// keep the pool's slots from connections to the new primary until the connect timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_pool_reaches_the_new_primary_soon_after_a_frozen_one_is_replaced() {
    // RESP3 too: its connections say `HELLO` first, which a frozen node never answers.
    for (kind, resp3) in [
        (ServerKind::Redis, false),
        (ServerKind::Valkey, false),
        (ServerKind::Redis, true),
    ] {
        let setup = SentinelSetup::start(kind);
        let old = setup.current_primary();
        let old_port = old.port();
        let mut config =
            sage_lock::fred::types::config::Config::from_url(&setup.url()).expect("url");
        if resp3 {
            config.version = sage_lock::fred::types::RespVersion::RESP3;
        }
        let fred = sage_lock::fred::types::Builder::from_config(config)
            .build()
            .expect("a fred client");
        let client = LockClient::builder()
            .fred_client(&fred)
            .max_connections(2)
            .connect()
            .await
            .expect("connect through sentinel");
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("frozen-small-pool"))
            .expect("opts");
        locks
            .with_lock("warm", Duration::from_secs(5), async {})
            .await
            .expect("before the freeze");
        old.pause();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let callers: Vec<_> = (0..6)
            .map(|i| {
                let (locks, stop) = (locks.clone(), std::sync::Arc::clone(&stop));
                tokio::spawn(async move {
                    let mut round = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        round += 1;
                        let key = format!("c{i}-{round}");
                        let _ = locks
                            .with_lock(key.as_str(), Duration::from_millis(300), async {})
                            .await;
                    }
                })
            })
            .collect();
        let failover = setup.wait_for_failover(old_port, Duration::from_secs(30));
        let named = Instant::now();
        // The first call after the promotion that takes a lock, retried for up to 15 s.
        let mut took = None;
        while failover.is_ok() && named.elapsed() < Duration::from_secs(15) {
            let outcome = locks
                .with_lock("after", Duration::from_millis(500), async {})
                .await;
            if outcome.is_ok() {
                took = Some(named.elapsed());
                break;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for caller in callers {
            caller.await.expect("caller");
        }
        old.resume();
        client.quit().await;
        let kind = format!("{kind} (RESP3: {resp3})");
        println!("{kind}: failover {failover:?}; first lock on the new primary {took:?} after");
        failover.expect("failover completes");
        let took = took.expect("a lock on the new primary within 15 s");
        assert!(
            took < Duration::from_secs(4),
            "{kind}: the first lock on the new primary took {took:?} after it was named"
        );
    }
}
