//! The mutex's queue: a release hands the lock to the next waiter within a few round trips, in
//! arrival order, and nobody (a try, a free-looking lock) overtakes a live waiter.

use super::*;

/// The release → grant hand-off to a waiter in another client takes a few round trips, not a
/// poll interval, and the waiter's attempts stay within busy + granted (+1 right after
/// subscribing).
pub(crate) async fn handoff_within_round_trips(
    url: &str,
    port: u16,
    kind: ServerKind,
    label: &str,
) {
    let ns = ns("handoff", kind);
    let (holder, waiter) = (connect(url).await, connect(url).await);
    let (holding, waiting) = (locks(&holder, &ns), locks(&waiter, &ns));
    let rtt = ping_rtt(&waiter).await;
    let mut worst = Duration::ZERO;
    for round in 0..5 {
        let (release, held) = hold(&holding, "k").await;
        let before = waiter.stats();
        let entered = wait_for(&waiting, "k", Duration::from_secs(5));
        until_queued(port, &ns, "k", 1).await;
        // Let the waiter settle into waiting for the notification (well under the poll).
        tokio::time::sleep(Duration::from_millis(50)).await;
        release.send(()).expect("release");
        let released_at = held.await.expect("holder");
        let handoff = entered
            .await
            .expect("waiter")
            .saturating_duration_since(released_at);
        let attempts = waiter.stats().busy_retries - before.busy_retries + 1;
        println!(
            "{} {label}: round {round}: hand-off {handoff:?} (PING {rtt:?}), {attempts} attempts",
            kind.name()
        );
        assert!(
            attempts <= 3,
            "{} {label}: {attempts} attempts for one contended acquisition",
            kind.name()
        );
        worst = worst.max(handoff);
    }
    assert!(
        worst < Duration::from_millis(50),
        "{} {label}: hand-off took {worst:?} (PING {rtt:?})",
        kind.name()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_after_release_within_round_trips() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        handoff_within_round_trips(&server.url(), server.port(), kind, "standalone").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_in_a_cluster() {
    for kind in ServerKind::ALL {
        let cluster = harness::shared_cluster(kind);
        let ns = ns("handoff", kind);
        let slot = harness::key_slot(format!("{{{ns}:k}}").as_bytes());
        let port = cluster.primary_for_slot(slot).port();
        // The namespace is fixed inside; route queue checks to the slot's primary.
        handoff_cluster_round(&cluster.url(), port, kind, &ns).await;
    }
}

async fn handoff_cluster_round(url: &str, port: u16, kind: ServerKind, ns: &str) {
    let (holder, waiter) = (connect(url).await, connect(url).await);
    let (holding, waiting) = (locks(&holder, ns), locks(&waiter, ns));
    let (release, held) = hold(&holding, "k").await;
    let entered = wait_for(&waiting, "k", Duration::from_secs(5));
    until_queued(port, ns, "k", 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let spublish_before = harness::commandstats_calls(port, "spublish");
    release.send(()).expect("release");
    let released_at = held.await.expect("holder");
    let handoff = entered
        .await
        .expect("waiter")
        .saturating_duration_since(released_at);
    println!("{} cluster: hand-off {handoff:?}", kind.name());
    assert!(
        harness::commandstats_calls(port, "spublish") > spublish_before,
        "{}: the release published on the slot's primary",
        kind.name()
    );
    assert!(
        handoff < Duration::from_millis(50),
        "{}: {handoff:?}",
        kind.name()
    );
}

/// Waiters from different clients get the lock in the order they started waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("fifo", kind);
        let holder = connect(&server.url()).await;
        let (release, held) = hold(&locks(&holder, &ns), "k").await;
        let mut entered = Vec::new();
        for i in 0..4 {
            let client = connect(&server.url()).await;
            entered.push((
                i,
                wait_for(&locks(&client, &ns), "k", Duration::from_secs(10)),
            ));
            until_queued(server.port(), &ns, "k", i + 1).await;
        }
        release.send(()).expect("release");
        held.await.expect("holder");
        let mut order = Vec::new();
        for (i, task) in entered {
            order.push((task.await.expect("waiter"), i));
        }
        order.sort();
        let order: Vec<i64> = order.into_iter().map(|(_, i)| i).collect();
        assert_eq!(order, [0, 1, 2, 3], "{}", kind.name());
        assert_eq!(queue_len(server.port(), &ns, "k"), 0, "{}", kind.name());
    }
}

/// A try never jumps the queue: it fails while a live waiter is queued, even if the lock is
/// momentarily free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_does_not_overtake_a_waiter() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("try-queue", kind);
        let (a, b) = (connect(&server.url()).await, connect(&server.url()).await);
        let (release, held) = hold(&locks(&a, &ns), "k").await;
        let waiter = wait_for(&locks(&b, &ns), "k", Duration::from_secs(5));
        until_queued(server.port(), &ns, "k", 1).await;
        let tried = locks(&a, &ns)
            .try_with_lock("k", async {})
            .await
            .expect("try");
        assert!(
            tried.is_none(),
            "{}: try succeeded on a held lock",
            kind.name()
        );
        release.send(()).expect("release");
        held.await.expect("holder");
        waiter.await.expect("waiter");
        let tried = locks(&a, &ns)
            .try_with_lock("k", async { 1 })
            .await
            .expect("try");
        assert_eq!(tried, Some(1), "{}: free lock, empty queue", kind.name());
    }
}

/// A free lock whose queue has another live head (its holder's lease ran out with waiters
/// queued) stays free for that head: an attempt by anybody else is refused and leaves no key
/// behind, a waiter queues behind the head, and once the head is dead the waiter gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_lock_stays_free_for_the_live_head() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("free-head", kind);
        let (lock, queue, deadlines) = (
            format!("{{{ns}:k}}"),
            format!("{{{ns}:k}}:queue"),
            format!("{{{ns}:k}}:waiters"),
        );
        // A live waiter of another process heads the queue (deadline far ahead); the key is free.
        // As a real waiter does, it marked the grant marker `q` when it joined the queue (see
        // `a_paused_waiter_keeps_its_place_after_the_holder_dies` for the same without forging).
        server.cmd_ok(&["RPUSH", &queue, "other-process-token"]);
        server.cmd_ok(&["ZADD", &deadlines, "99999999999999", "other-process-token"]);
        server.cmd_ok(&["SET", &format!("{{{ns}:k}}:since"), "q", "PX", "60000"]);
        let client = connect(&server.url()).await;
        let tried = locks(&client, &ns)
            .try_with_lock("k", async {})
            .await
            .expect("try");
        assert!(tried.is_none(), "{}: a try overtook the head", kind.name());
        let exists = server.cmd_ok(&["EXISTS", &lock]).as_int();
        assert_eq!(
            exists,
            Some(0),
            "{}: the refused attempt left the key set",
            kind.name()
        );
        let waiter = wait_for(&locks(&client, &ns), "k", Duration::from_secs(10));
        until_queued(server.port(), &ns, "k", 2).await;
        assert!(
            !waiter.is_finished(),
            "{}: the waiter overtook the head",
            kind.name()
        );
        // The head dies (its deadline passes): the waiter's next attempt drops it and is granted.
        server.cmd_ok(&["ZADD", &deadlines, "1", "other-process-token"]);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter got the lock after the head died")
            .expect("waiter");
        assert_eq!(queue_len(server.port(), &ns, "k"), 0, "{}", kind.name());
    }
}

/// Deletes the lock key `k` of `ns` (its holder's lease ran out) while a live waiter is queued:
/// a try from `client` is refused and leaves the key free for `head`, the waiter first in line.
async fn a_try_on_the_freed_key_is_refused(
    server: &Server,
    client: &LockClient,
    ns: &str,
    kind: ServerKind,
    head: &str,
) {
    let lock = format!("{{{ns}:k}}");
    server.cmd_ok(&["DEL", &lock]);
    let tried = locks(client, ns)
        .try_with_lock("k", async {})
        .await
        .expect("try");
    assert!(tried.is_none(), "{}: a try overtook {head}", kind.name());
    let exists = server.cmd_ok(&["EXISTS", &lock]).as_int();
    assert_eq!(
        exists,
        Some(0),
        "{}: the refused try left the key set",
        kind.name()
    );
}

/// The same state as above reached for real: a waiter in another process queues behind a
/// holder, is paused (SIGSTOP, so it cannot poll), and the holder's key goes away as if its
/// lease ran out (no release, so no hand-off). The free lock stays free for the paused head:
/// a try from another client is refused, until the head resumes and takes the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_waiter_keeps_its_place_after_the_holder_dies() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("paused-head", kind);
        let lock = format!("{{{ns}:k}}");
        // A holder that will die: its key, without a lease, until the test deletes it.
        server.cmd_ok(&["SET", &lock, "dead-holder-token"]);
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fair_worker"))
            .args(["wait", &server.url(), &ns, "k"])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn fair_worker");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        until_queued(server.port(), &ns, "k", 1).await;
        let pid = child.id().expect("the waiter runs").to_string();
        let stopped = std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .expect("kill -STOP");
        assert!(stopped.success(), "SIGSTOP the queued waiter");
        // The holder's lease runs out: the key goes, the queue stays.
        let client = connect(&server.url()).await;
        a_try_on_the_freed_key_is_refused(server, &client, &ns, kind, "the paused head").await;
        let resumed = std::process::Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .expect("kill -CONT");
        assert!(resumed.success(), "SIGCONT the queued waiter");
        let acquired = tokio::time::timeout(Duration::from_secs(10), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line == "acquired" {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(
            acquired,
            Ok(true),
            "{}: the resumed head got the lock",
            kind.name()
        );
        let _ = child.wait().await;
        client.quit().await;
    }
}

/// A hand-off that leaves waiters queued keeps the queue marked: two waiters in other processes
/// queue behind a holder and are paused (SIGSTOP); the release hands the lock to the first,
/// whose lease then runs out (its key goes) while it is paused. The second, still queued and
/// live, keeps its place: a try from another client is refused and leaves no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_keeps_the_remaining_queue_marked() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("handoff-mark", kind);
        let client = connect(&server.url()).await;
        let (release, held) = hold(&locks(&client, &ns), "k").await;
        let mut children = Vec::new();
        for queued in 1..=2 {
            let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fair_worker"))
                .args(["wait", &server.url(), &ns, "k"])
                .stdout(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn fair_worker");
            until_queued(server.port(), &ns, "k", queued).await;
            children.push(child);
        }
        for child in &children {
            let pid = child.id().expect("the waiter runs").to_string();
            let stopped = std::process::Command::new("kill")
                .args(["-STOP", &pid])
                .status()
                .expect("kill -STOP");
            assert!(stopped.success(), "SIGSTOP a queued waiter");
        }
        release.send(()).expect("release");
        held.await.expect("holder");
        assert_eq!(
            queue_len(server.port(), &ns, "k"),
            1,
            "{}: the release handed the lock to the first waiter",
            kind.name()
        );
        // The first waiter's lease runs out while it is paused.
        a_try_on_the_freed_key_is_refused(server, &client, &ns, kind, "the second waiter").await;
        for mut child in children {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        client.quit().await;
    }
}
