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
