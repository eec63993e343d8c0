//! Callers of several keys (`with_locks`) wait in line on each of their keys.

use super::*;

/// Starts `with_locks(keys)` on its own task; resolves to the instant its body began, or the
/// error.
fn wait_for_all(
    locks: &Locks<str>,
    keys: &[&str],
    wait: Duration,
) -> tokio::task::JoinHandle<Result<Instant, sage_lock::LockError>> {
    let locks = locks.clone();
    let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    tokio::spawn(async move {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        locks
            .with_locks(&keys, wait, async { Instant::now() })
            .await
    })
}

/// A mutex release whose next live waiter waits for several keys does not hand it this key
/// alone: the key stays free for it (it keeps its place at the head), and the single-key waiter
/// behind it gets the key once that place ends. The caller of several keys is written into the
/// queue directly (a token starting with `m`, as `with_locks` tokens do), so nothing retries
/// for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_keeps_the_key_free_for_a_caller_of_several_keys() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("several-head", kind);
        let (lock, queue, deadlines) = (
            format!("{{{ns}:k}}"),
            format!("{{{ns}:k}}:queue"),
            format!("{{{ns}:k}}:waiters"),
        );
        let (holder, waiter) = (connect(&server.url()).await, connect(&server.url()).await);
        let (release, held) = hold(&locks(&holder, &ns), "k").await;
        let several = format!("m{:032x}", rand::random::<u128>());
        let time = server.cmd_ok(&["TIME"]);
        let seconds = time
            .as_array()
            .and_then(|t| t.first())
            .and_then(|s| s.as_str())
            .and_then(|s| s.parse::<i64>().ok())
            .expect("TIME");
        // Its place ends 2 s after the server's clock now (to the second).
        let due = ((seconds + 2) * 1000).to_string();
        server.cmd_ok(&["RPUSH", &queue, &several]);
        server.cmd_ok(&["ZADD", &deadlines, &due, &several]);
        let entered = wait_for(&locks(&waiter, &ns), "k", Duration::from_secs(10));
        until_queued(server.port(), &ns, "k", 2).await;
        release.send(()).expect("release");
        let released_at = held.await.expect("holder");
        let value = server.cmd_ok(&["GET", &lock]);
        assert!(
            matches!(value, harness::Reply::Bulk(None)),
            "{}: the release handed the key to the caller of several keys alone: {value:?}",
            kind.name()
        );
        let head = server.cmd_ok(&["LINDEX", &queue, "0"]);
        assert_eq!(
            head.as_str(),
            Some(several.as_str()),
            "{}: the caller of several keys lost its place",
            kind.name()
        );
        let waited = entered
            .await
            .expect("waiter")
            .saturating_duration_since(released_at);
        println!(
            "{}: the single-key waiter entered {waited:?} after the release",
            kind.name()
        );
        assert!(
            waited >= Duration::from_millis(500) && waited < DEAD_WAITER_BOUND,
            "{}: the waiter behind entered {waited:?} after the release (the place ended \
             1-2 s after it)",
            kind.name()
        );
    }
}

/// A waiting caller of several keys holds a place in every key's queue: a key it waits for
/// that is free stays free for it (a try is refused) while another of its keys is held. When
/// its wait runs out it leaves every queue, and the free key can be taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_of_several_keys_queues_on_each_and_leaves_them_all() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("several-queue", kind);
        let (holder, several, other) = (
            connect(&server.url()).await,
            connect(&server.url()).await,
            connect(&server.url()).await,
        );
        let (release, held) = hold(&locks(&holder, &ns), "b").await;
        let waiting = wait_for_all(
            &locks(&several, &ns),
            &["a", "b"],
            Duration::from_millis(1500),
        );
        until_queued(server.port(), &ns, "a", 1).await;
        until_queued(server.port(), &ns, "b", 1).await;
        let tried = locks(&other, &ns)
            .try_with_lock("a", async {})
            .await
            .expect("try");
        assert!(
            tried.is_none(),
            "{}: a try took a key a queued caller of several keys waits for",
            kind.name()
        );
        let outcome = waiting.await.expect("task");
        assert!(
            matches!(outcome, Err(sage_lock::LockError::TimedOut { .. })),
            "{}: {outcome:?}",
            kind.name()
        );
        for key in ["a", "b"] {
            assert_eq!(
                queue_len(server.port(), &ns, key),
                0,
                "{}: the caller that gave up is still queued on {key}",
                kind.name()
            );
        }
        let tried = locks(&other, &ns)
            .try_with_lock("a", async {})
            .await
            .expect("try");
        assert!(tried.is_some(), "{}: a stayed reserved", kind.name());
        release.send(()).expect("release");
        held.await.expect("holder");
    }
}

/// A queued caller of several keys learns of the release of any of them within a few round
/// trips, not at its next poll (500 ms): here the release of its second key, which is not the
/// one its lease reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_of_several_keys_is_woken_by_the_release_of_any() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("several-wake", kind);
        let (holder, several) = (connect(&server.url()).await, connect(&server.url()).await);
        let (holding, waiting) = (locks(&holder, &ns), locks(&several, &ns));
        let mut worst = Duration::ZERO;
        for _ in 0..3 {
            let (release, held) = hold(&holding, "b").await;
            let entered = wait_for_all(&waiting, &["a", "b"], Duration::from_secs(5));
            until_queued(server.port(), &ns, "b", 1).await;
            // Settled into waiting: its next poll is about 450 ms away.
            tokio::time::sleep(Duration::from_millis(50)).await;
            release.send(()).expect("release");
            let released_at = held.await.expect("holder");
            let took = entered
                .await
                .expect("task")
                .expect("the caller of several keys got them")
                .saturating_duration_since(released_at);
            worst = worst.max(took);
        }
        println!(
            "{}: woken {worst:?} after the release at worst",
            kind.name()
        );
        assert!(
            worst < Duration::from_millis(200),
            "{}: the caller of several keys took {worst:?} to enter after the release",
            kind.name()
        );
    }
}
