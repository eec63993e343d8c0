//! Fair hand-off: waiters queue on the server in arrival order, a release notifies the next one,
//! dead waiters and lost notifications cost bounded time, and no process starves another.

use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use harness::{SentinelSetup, Server, ServerKind};
use sage_lock::{LockClient, LockOptions, Locks};
use tokio::io::{AsyncBufReadExt, BufReader};

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

/// The release → grant hand-off to a waiter in another client takes a few round trips, not a
/// poll interval, and the waiter's attempts stay within busy + granted (+1 right after
/// subscribing).
async fn handoff_within_round_trips(url: &str, port: u16, kind: ServerKind, label: &str) {
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
        server.cmd_ok(&["DEL", &lock]);
        let client = connect(&server.url()).await;
        let tried = locks(&client, &ns)
            .try_with_lock("k", async {})
            .await
            .expect("try");
        assert!(
            tried.is_none(),
            "{}: a try overtook the paused head",
            kind.name()
        );
        let exists = server.cmd_ok(&["EXISTS", &lock]).as_int();
        assert_eq!(
            exists,
            Some(0),
            "{}: the refused try left the key set",
            kind.name()
        );
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
        let lock = format!("{{{ns}:k}}");
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
        server.cmd_ok(&["DEL", &lock]);
        let tried = locks(&client, &ns)
            .try_with_lock("k", async {})
            .await
            .expect("try");
        assert!(
            tried.is_none(),
            "{}: a try overtook the second waiter",
            kind.name()
        );
        let exists = server.cmd_ok(&["EXISTS", &lock]).as_int();
        assert_eq!(
            exists,
            Some(0),
            "{}: the refused try left the key set",
            kind.name()
        );
        for mut child in children {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        client.quit().await;
    }
}

/// Starts a `fair_worker` process that waits for `k` in `ns` (for `wait_ms`, default 60 s) and
/// returns once it is queued on the server (the queue was empty).
async fn queued_process(
    url: &str,
    port: u16,
    ns: &str,
    wait_ms: Option<&str>,
) -> tokio::process::Child {
    let mut args = vec!["wait", url, ns, "k"];
    args.extend(wait_ms);
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fair_worker"))
        .args(&args)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn fair_worker");
    until_queued(port, ns, "k", 1).await;
    child
}

/// A waiter on a client of its own that queues for `k` behind the one waiter already queued;
/// returns once it is queued, with its client and the instant its body began.
async fn live_waiter_behind(
    url: &str,
    port: u16,
    ns: &str,
) -> (LockClient, tokio::task::JoinHandle<Instant>) {
    let client = connect(url).await;
    let entered = wait_for(&locks(&client, ns), "k", Duration::from_secs(10));
    until_queued(port, ns, "k", 2).await;
    (client, entered)
}

/// Asserts that the live waiter entered within `bound` of the release (`why`: what a longer
/// wait means).
fn entered_within(kind: ServerKind, waited: Duration, bound: Duration, why: &str) {
    println!(
        "{}: live waiter entered {waited:?} after the release",
        kind.name()
    );
    assert!(
        waited < bound,
        "{}: the live waiter entered {waited:?} after the release: {why}",
        kind.name()
    );
}

/// SIGKILLs a waiter process and reaps it.
async fn kill(mut child: tokio::process::Child) {
    child.start_kill().expect("SIGKILL the queued waiter");
    let _ = child.wait().await;
}

/// Ends the hold `release` controls and returns how long after `released_at` the live waiter
/// `entered` began its body.
async fn entered_after_release(
    release: tokio::sync::oneshot::Sender<()>,
    held: tokio::task::JoinHandle<Instant>,
    entered: tokio::task::JoinHandle<Instant>,
    released_at: Instant,
) -> Duration {
    release.send(()).expect("release");
    held.await.expect("holder");
    let got = entered.await.expect("the live waiter gets the lock");
    got.saturating_duration_since(released_at)
}

/// A waiter process killed while queued at the head does not block the others beyond its
/// waiter TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_waiter_does_not_block_the_queue() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("dead-waiter", kind);
        let holder = connect(&server.url()).await;
        let (release, held) = hold(&locks(&holder, &ns), "k").await;
        let child = queued_process(&server.url(), server.port(), &ns, None).await;
        let (other, entered) = live_waiter_behind(&server.url(), server.port(), &ns).await;
        kill(child).await;
        let killed_at = Instant::now();
        let waited = entered_after_release(release, held, entered, killed_at).await;
        println!("{}: dead head skipped after {waited:?}", kind.name());
        assert!(waited < DEAD_WAITER_BOUND, "{}: {waited:?}", kind.name());
        other.quit().await;
        holder.quit().await;
    }
}

/// A waiter killed while queued holds its place no longer than its own wait: a release after
/// that wait would have ended goes to the live waiter behind it, not to the dead one (which
/// would keep the lock for the hand-off lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiters_place_ends_with_its_wait() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("dead-short-wait", kind);
        let holder = connect(&server.url()).await;
        let (release, held) = hold(&locks(&holder, &ns), "k").await;
        let child = queued_process(&server.url(), server.port(), &ns, Some("400")).await;
        kill(child).await;
        let killed_at = Instant::now();
        let (other, entered) = live_waiter_behind(&server.url(), server.port(), &ns).await;
        // Well past the dead waiter's 400 ms wait, well within the 2 s a place lasts at most.
        tokio::time::sleep(Duration::from_millis(900).saturating_sub(killed_at.elapsed())).await;
        let released_at = Instant::now();
        let waited = entered_after_release(release, held, entered, released_at).await;
        entered_within(
            kind,
            waited,
            Duration::from_millis(700),
            "the dead waiter's place outlived its wait",
        );
        other.quit().await;
        holder.quit().await;
    }
}

/// A release that hands the lock to a waiter that died while queued (its place still valid)
/// gives it no longer than the releaser's own lease (under 2 s): the live waiter behind it gets
/// the lock about one short lease later, not after the 2 s hand-off lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_to_a_dead_waiter_lasts_the_releasers_lease() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("dead-handoff", kind);
        let holder = connect(&server.url()).await;
        let short: Locks<str> = holder
            .lock_with(
                LockOptions::new()
                    .namespace(&ns)
                    .lease(Duration::from_millis(300)),
            )
            .expect("options");
        let (release, held) = hold(&short, "k").await;
        let child = queued_process(&server.url(), server.port(), &ns, None).await;
        let (other, entered) = live_waiter_behind(&server.url(), server.port(), &ns).await;
        kill(child).await;
        // The dead waiter's place (60 s wait) is still valid: the release hands it the lock.
        let released_at = Instant::now();
        let waited = entered_after_release(release, held, entered, released_at).await;
        entered_within(
            kind,
            waited,
            Duration::from_millis(1200),
            "the dead waiter kept the lock longer than the releaser's 300 ms lease",
        );
        other.quit().await;
        holder.quit().await;
    }
}

/// The subscriber connection killed (its notifications lost): the waiter still gets the lock by
/// polling, and notifications work again after the subscriber reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_notification_costs_at_most_a_poll() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let ns = ns("lost", kind);
        let (holder, waiter) = (connect(&server.url()).await, connect(&server.url()).await);
        let (holding, waiting) = (locks(&holder, &ns), locks(&waiter, &ns));
        let (release, held) = hold(&holding, "k").await;
        let entered = wait_for(&waiting, "k", Duration::from_secs(10));
        until_queued(server.port(), &ns, "k", 1).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let killed = server.cmd_ok(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        assert!(
            killed.as_int().unwrap_or(0) >= 1,
            "{}: no subscriber to kill",
            kind.name()
        );
        release.send(()).expect("release");
        let released_at = held.await.expect("holder");
        let late = entered
            .await
            .expect("waiter")
            .saturating_duration_since(released_at);
        println!(
            "{}: hand-off with the subscriber killed: {late:?}",
            kind.name()
        );
        assert!(late < Duration::from_secs(2), "{}: {late:?}", kind.name());
        // Resubscribed: hand-offs are event-driven again.
        tokio::time::sleep(Duration::from_millis(300)).await;
        handoff_within_round_trips(&server.url(), server.port(), kind, "after CLIENT KILL").await;
    }
}

/// Four processes of two tasks each contend for one key of `primitive` (a `fair_worker`
/// primitive: `mutex`, `semaphore` with one permit, `write`) for `run` with 1 ms sections: every
/// process gets its share and no wait times out.
async fn no_starvation(kind: ServerKind, primitive: &str, run: Duration) {
    no_starvation_of(kind, [primitive; 4], run, Some(SCRIPTS_PER_SECTION)).await;
}

/// The most script calls (acquire attempts and releases, all processes) per critical section in
/// [`no_starvation`] (and with readers and writers mixed): a release hands the lock over to the
/// next waiter (or the next readers) and wakes only it, not every queued process (about 2: the release, and the attempt with which the new holder's
/// local follower joins the queue).
const SCRIPTS_PER_SECTION: f64 = 3.0;

/// Four processes of two tasks each, process `i` taking the lock as `primitives[i]`, contend for
/// one key for `run` with 1 ms sections: every process gets its share (the fewest sections at
/// least half the most), no wait times out, and the server runs at most `max_scripts` script
/// calls per section. The test has a server of its own, so that the count is its own.
async fn no_starvation_of(
    kind: ServerKind,
    primitives: [&str; 4],
    run: Duration,
    max_scripts: Option<f64>,
) {
    let server = &Server::start(kind);
    let ns = ns(&format!("starve-{}", primitives.join("-")), kind);
    let scripts = || {
        ["evalsha", "eval"]
            .iter()
            .map(|command| harness::commandstats_calls(server.port(), command))
            .sum::<u64>()
    };
    let scripts_before = scripts();
    let reports = contend_processes(&server.url(), &ns, primitives, run).await;
    let sections = assert_shares(&format!("{} {primitives:?}", kind.name()), &reports);
    let scripts_per_section = (scripts() - scripts_before) as f64 / sections.max(1) as f64;
    println!(
        "{} {primitives:?}: {scripts_per_section:.2} script calls per section",
        kind.name()
    );
    if let Some(max) = max_scripts {
        assert!(
            scripts_per_section <= max,
            "{} {primitives:?}: {scripts_per_section:.2} script calls per section (at most \
             {max}): releases wake waiters that cannot take the lock",
            kind.name()
        );
    }
}

/// Runs four `fair_worker contend` processes of two tasks each on key `k` of `ns` at `url`,
/// process `i` taking it as `primitives[i]`, for `run` with 1 ms sections and 5 s waits, all
/// started together; returns their report lines.
async fn contend_processes(
    url: &str,
    ns: &str,
    primitives: [&str; 4],
    run: Duration,
) -> Vec<String> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    let start = (now_ms + 1500).to_string();
    let mut children = Vec::new();
    for primitive in primitives {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fair_worker"))
            .args([
                "contend",
                url,
                ns,
                "k",
                "2",
                &run.as_millis().to_string(),
                "1",
                "5000",
                &start,
                primitive,
            ])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn fair_worker");
        children.push(child);
    }
    let mut reports = Vec::new();
    for mut child in children {
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .await
            .expect("report");
        let status = child.wait().await.expect("worker exits");
        assert!(status.success(), "{url}: worker failed: {line}");
        reports.push(line.trim().to_owned());
    }
    reports
}

/// Asserts that no wait in `reports` timed out and every process got its share (the fewest
/// sections at least half the most); returns the sections of all.
fn assert_shares(label: &str, reports: &[String]) -> u64 {
    let field = |line: &str, name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")[..]))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
    };
    let sections: Vec<u64> = reports.iter().map(|r| field(r, "sections")).collect();
    let timeouts: u64 = reports.iter().map(|r| field(r, "timeouts")).sum();
    let (fewest, most) = (
        sections.iter().copied().min().unwrap_or(0),
        sections.iter().copied().max().unwrap_or(0),
    );
    println!("{label}: 4 processes x 2 tasks: {reports:#?}");
    assert_eq!(timeouts, 0, "{label}: waits timed out: {reports:?}");
    assert!(
        fewest * 2 >= most && fewest > 0,
        "{label}: a process starved: {sections:?}"
    );
    sections.iter().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_starvation_across_processes_redis() {
    no_starvation(ServerKind::Redis, "mutex", Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_starvation_across_processes_valkey() {
    no_starvation(ServerKind::Valkey, "mutex", Duration::from_secs(30)).await;
}

/// The semaphore's waiters queue too: with one permit it is as fair as the mutex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_semaphore_starvation_across_processes() {
    for kind in ServerKind::ALL {
        no_starvation(kind, "semaphore", Duration::from_secs(10)).await;
    }
}

/// A caller of several keys (`with_locks` on `k` and a second key, one process of two tasks)
/// against three processes of single-key waiters on `k`: it queues on every key's waiter queue
/// too, so it gets its share and no wait times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_several_keys_starvation_across_processes() {
    for kind in ServerKind::ALL {
        no_starvation_of(
            kind,
            ["pair", "mutex", "mutex", "mutex"],
            Duration::from_secs(10),
            Some(SCRIPTS_PER_SECTION),
        )
        .await;
    }
}

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

/// In a cluster, a caller of keys in two slots waits in line for each in turn, holding the
/// first while it waits for the second: single-key waiters on its later slot's key cannot keep
/// it out. (The namespace is picked so that `k`, which the other processes contend for, is the
/// later slot.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_several_slots_starvation_in_a_cluster() {
    for kind in ServerKind::ALL {
        let cluster = harness::shared_cluster(kind);
        let ns = loop {
            let ns = ns("starve-slots", kind);
            let slot = |key: &str| harness::key_slot(format!("{{{ns}:{key}}}").as_bytes());
            if slot("k:pair") < slot("k") {
                break ns;
            }
        };
        let reports = contend_processes(
            &cluster.url(),
            &ns,
            ["pair", "mutex", "mutex", "mutex"],
            Duration::from_secs(10),
        )
        .await;
        assert_shares(&format!("{} cluster", kind.name()), &reports);
    }
}

/// A failover while a waiter is queued: the waiter still gets the lock (on the new primary),
/// and later hand-offs there work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_waiter_survives_failover() {
    for kind in ServerKind::ALL {
        let setup = SentinelSetup::start(kind);
        let old = setup.current_primary_port();
        let ns = ns("failover-queue", kind);
        let (holder, waiter) = (connect(&setup.url()).await, connect(&setup.url()).await);
        let holding: Locks<str> = holder
            .lock_with(
                LockOptions::new()
                    .namespace(&ns)
                    .lease(Duration::from_secs(1)),
            )
            .expect("options");
        let waiting = locks(&waiter, &ns);
        let body = holding.with_lock("k", Duration::from_secs(5), async {
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let holder_task = tokio::spawn(body);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let entered = wait_for(&waiting, "k", Duration::from_secs(30));
        until_queued(old, &ns, "k", 1).await;
        setup.sentinels[0].cmd_ok(&["SENTINEL", "FAILOVER", harness::SENTINEL_SERVICE]);
        let failed_over = Instant::now();
        let new = setup
            .wait_for_failover(old, Duration::from_secs(20))
            .expect("failover completes");
        assert_ne!(new, old);
        let lost = holder_task.await.expect("holder task");
        assert!(lost.is_err(), "{}: the holder kept its lock", kind.name());
        entered
            .await
            .expect("queued waiter gets the lock after failover");
        println!(
            "{}: queued waiter in {:?} after the failover",
            kind.name(),
            failed_over.elapsed()
        );
        assert!(failed_over.elapsed() < Duration::from_secs(25));
        // On the new primary, contended hand-offs still complete promptly.
        let (release, held) = hold(&waiting, "k2").await;
        let second = wait_for(&holding, "k2", Duration::from_secs(10));
        until_queued(new, &ns, "k2", 1).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        release.send(()).expect("release");
        let released_at = held.await.expect("holder");
        let handoff = second
            .await
            .expect("second")
            .saturating_duration_since(released_at);
        println!("{}: hand-off on the new primary: {handoff:?}", kind.name());
        assert!(
            handoff < Duration::from_secs(2),
            "{}: {handoff:?}",
            kind.name()
        );
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

/// A free permit stays free for a live queued waiter: a try is refused and a new waiter queues
/// behind it. Once that waiter's place ends (it died between attempts), the new waiter gets the
/// permit on its own. The queued waiter is written into the queue directly, so nothing retries
/// for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_permit_stays_free_for_a_live_queued_waiter() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("sem-reserved", kind);
        let client = connect(&server.url()).await;
        let sem = semaphore(&client, &ns);
        let (queue, dues) = (
            format!("{{{ns}:k}}:sem-queue"),
            format!("{{{ns}:k}}:sem-due"),
        );
        queue_ghost(server.port(), &queue, &dues, 1500);
        let tried = sem.try_acquire("k", async {}).await.expect("try");
        assert!(
            tried.is_none(),
            "{}: a try took the permit a queued waiter is owed",
            kind.name()
        );
        let asked = Instant::now();
        let entered = sem
            .acquire("k", Duration::from_secs(5), async { asked.elapsed() })
            .await
            .expect("the waiter behind gets the permit once the place ends");
        println!("{}: entered after {entered:?}", kind.name());
        assert!(
            entered > Duration::from_millis(700) && entered < DEAD_WAITER_BOUND,
            "{}: entered after {entered:?}, the ghost's place lasted about 1.5 s",
            kind.name()
        );
        assert_eq!(sem_queue_len(server.port(), &ns, "k"), 0, "{}", kind.name());
    }
}

/// Waits until the `waiting` task is queued (`queued()` is 1), drops its future, and waits until
/// `queued()` is 0, which a waiter that gave up must reach well before its place (1–2 s after
/// its last attempt) would end on its own.
async fn gives_up<T>(waiting: tokio::task::JoinHandle<T>, queued: impl Fn() -> i64, who: &str) {
    let start = Instant::now();
    while queued() != 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{who} never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waiting.abort();
    assert!(waiting.await.is_err(), "{who} got in");
    let start = Instant::now();
    while queued() != 0 {
        assert!(
            start.elapsed() < Duration::from_millis(400),
            "{who} is still queued after {:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("{who} left the queue within {:?}", start.elapsed());
}

/// A waiting caller that gives up leaves the queue at once, whether its wait ran out or its
/// future was dropped mid-wait: it does not hold up the permit until its place would have
/// ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_waiter_that_gives_up_leaves_the_queue() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("sem-give-up", kind);
        let holder = connect(&server.url()).await;
        let (release, held) = hold_queued(&Queued::Permit(semaphore(&holder, &ns)), "k").await;
        let waiter = semaphore(&connect(&server.url()).await, &ns);
        let waited = waiter
            .acquire("k", Duration::from_millis(300), async {})
            .await;
        assert!(
            matches!(waited, Err(sage_lock::LockError::TimedOut { .. })),
            "{}: {waited:?}",
            kind.name()
        );
        assert_eq!(
            sem_queue_len(server.port(), &ns, "k"),
            0,
            "{}: the waiter whose wait ran out is still queued",
            kind.name()
        );
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move { waiter.acquire("k", Duration::from_secs(5), async {}).await }
        });
        let queued = || sem_queue_len(server.port(), &ns, "k");
        gives_up(waiting, queued, "the semaphore waiter that gave up").await;
        release.send(()).expect("release");
        held.await.expect("holder");
        let tried = waiter.try_acquire("k", async { 1 }).await.expect("try");
        assert_eq!(tried, Some(1), "{}: free permit, empty queue", kind.name());
    }
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

/// Waiting callers of `primitive` in different clients get it in the order they started
/// waiting, a try while they wait is refused even when the lock is momentarily free, and the
/// queue is gone once all of them have had it.
async fn served_in_arrival_order(primitive: &str) {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns(&format!("fifo-{primitive}"), kind);
        let holder = Queued::new(primitive, &connect(&server.url()).await, &ns);
        let [queue, places] = holder
            .queue_keys()
            .map(|suffix| format!("{{{ns}:k}}:{suffix}"));
        let queued_len = || zcard(server.port(), &queue);
        let (release, held) = hold_queued(&holder, "k").await;
        let mut entered = Vec::new();
        for i in 0..4 {
            let waiter = Queued::new(primitive, &connect(&server.url()).await, &ns);
            entered.push((
                i,
                tokio::spawn(async move {
                    waiter
                        .hold("k", Duration::from_secs(10), async {
                            let at = Instant::now();
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            at
                        })
                        .await
                        .expect("waiter gets the lock")
                }),
            ));
            let start = Instant::now();
            while queued_len() < i + 1 {
                assert!(start.elapsed() < Duration::from_secs(10), "never queued");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let queued = harness::cmd(server.port(), &["ZRANGE", &queue, "0", "-1", "WITHSCORES"]);
        release.send(()).expect("release");
        held.await.expect("holder");
        assert!(
            holder.try_hold("k").await.is_none(),
            "{} {primitive}: a try overtook the queue",
            kind.name()
        );
        let mut order = Vec::new();
        for (i, task) in entered {
            order.push((task.await.expect("waiter"), i));
        }
        order.sort();
        let order: Vec<i64> = order.into_iter().map(|(_, i)| i).collect();
        assert_eq!(
            order,
            [0, 1, 2, 3],
            "{} {primitive}: the queue before the release: {queued:?}",
            kind.name()
        );
        for key in [&queue, &places] {
            let exists = harness::cmd(server.port(), &["EXISTS", key]).map(|r| r.as_int());
            assert_eq!(exists, Ok(Some(0)), "{}: {key} left behind", kind.name());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_waiters_are_served_in_arrival_order() {
    served_in_arrival_order("semaphore").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_are_served_in_arrival_order() {
    served_in_arrival_order("write").await;
}

/// The read-write lock's waiting writers queue too: four processes of two writers each get
/// their share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_writer_starvation_across_processes() {
    for kind in ServerKind::ALL {
        no_starvation(kind, "write", Duration::from_secs(10)).await;
    }
}

/// Readers are not starved by a stream of writers: one process of two readers against three
/// processes of two writers each gets its share, and no wait times out. Releases hand the lock to
/// the readers as to the writers, so the script calls per section stay within
/// [`SCRIPTS_PER_SECTION`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reader_starvation_across_processes() {
    for kind in ServerKind::ALL {
        no_starvation_of(
            kind,
            ["read", "write", "write", "write"],
            Duration::from_secs(10),
            Some(SCRIPTS_PER_SECTION),
        )
        .await;
    }
}

/// Readers and writers of one key, each in its own client, enter in the order they started
/// waiting, and the readers that queued one after the other enter together: behind a holding
/// writer, reader 0, writer 1, readers 2 and 3 and writer 4 queue in turn; reader 0 goes first,
/// then writer 1, then readers 2 and 3 at once, then writer 4. A `try_write` during the hand-over
/// is refused, and both queues are gone afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_writers_are_served_in_arrival_order() {
    const BODY: Duration = Duration::from_millis(100);
    let writes = [false, true, false, false, true];
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("fifo-rw", kind);
        let rw = |client: &LockClient| rw_locks(client, &ns);
        let holder = rw(&connect(&server.url()).await);
        let queues: Vec<String> = ["wq", "wd", "rq", "rd"]
            .iter()
            .map(|suffix| format!("{{{ns}:k}}:{suffix}"))
            .collect();
        let queued_len = || {
            [&queues[0], &queues[2]]
                .iter()
                .map(|queue| zcard(server.port(), queue))
                .sum::<i64>()
        };
        let (release, held) = hold_queued(&Queued::Write(holder.clone()), "k").await;
        let mut entered = Vec::new();
        for (i, write) in (0_i64..).zip(writes) {
            let waiter = rw(&connect(&server.url()).await);
            entered.push(tokio::spawn(async move {
                let body = async {
                    let at = Instant::now();
                    tokio::time::sleep(BODY).await;
                    (at, Instant::now())
                };
                let wait = Duration::from_secs(10);
                if write {
                    waiter.write("k", wait, body).await
                } else {
                    waiter.read("k", wait, body).await
                }
                .expect("waiter gets the lock")
            }));
            let start = Instant::now();
            while queued_len() < i + 1 {
                assert!(start.elapsed() < Duration::from_secs(10), "never queued");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        release.send(()).expect("release");
        held.await.expect("holder");
        assert!(
            holder
                .try_write("k", async {})
                .await
                .expect("try")
                .is_none(),
            "{}: a try_write overtook the queue",
            kind.name()
        );
        let mut spans = Vec::new();
        for task in entered {
            spans.push(task.await.expect("waiter"));
        }
        let name = kind.name();
        let [r0, w1, r2, r3, w4] = spans[..] else {
            unreachable!("five waiters")
        };
        assert!(r0.1 <= w1.0, "{name}: writer 1 entered while reader 0 read");
        assert!(
            w1.1 <= r2.0 && w1.1 <= r3.0,
            "{name}: a reader overtook writer 1"
        );
        assert!(
            r2.0 < r3.1 && r3.0 < r2.1,
            "{name}: readers 2 and 3 did not read together: {spans:?}"
        );
        assert!(
            r2.1 <= w4.0 && r3.1 <= w4.0,
            "{name}: writer 4 entered while a reader read"
        );
        for key in &queues {
            let exists = harness::cmd(server.port(), &["EXISTS", key]).map(|r| r.as_int());
            assert_eq!(exists, Ok(Some(0)), "{name}: {key} left behind");
        }
    }
}

/// A live queued reader keeps later writers behind it, not later readers: with a reader written
/// into the reader queue directly (so nothing retries for it), its place ending 1.5 s later, a
/// `try_write` is refused, a `try_read` enters, and a waiting writer enters once the place ends.
/// A reader that gives up waiting (its wait ran out, or its future was dropped) leaves the queue
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_reader_keeps_later_writers_behind_it() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("rw-reader-queued", kind);
        let rw = rw_locks(&connect(&server.url()).await, &ns);
        let (queue, dues) = (format!("{{{ns}:k}}:rq"), format!("{{{ns}:k}}:rd"));
        let queued_len = || zcard(server.port(), &queue);
        queue_ghost(server.port(), &queue, &dues, 1500);
        let name = kind.name();
        let tried = rw.try_write("k", async {}).await.expect("try_write");
        assert!(
            tried.is_none(),
            "{name}: a try_write overtook a queued reader"
        );
        let read = rw.try_read("k", async { 1 }).await.expect("try_read");
        assert_eq!(read, Some(1), "{name}: a queued reader kept a reader out");
        let asked = Instant::now();
        let entered = rw
            .write("k", Duration::from_secs(5), async { asked.elapsed() })
            .await
            .expect("the writer gets the lock once the reader's place ends");
        println!("{name}: writer entered after {entered:?}");
        assert!(
            entered > Duration::from_millis(700) && entered < DEAD_WAITER_BOUND,
            "{name}: entered after {entered:?}, the queued reader's place lasted about 1.5 s"
        );
        assert_eq!(queued_len(), 0, "{name}: the ended place is still queued");

        // A reader that gives up leaves the queue.
        let (release, writer) = hold_queued(&Queued::Write(rw.clone()), "k").await;
        let reader = connect(&server.url())
            .await
            .rw_lock_with::<str>(LockOptions::new().namespace(&ns))
            .expect("options");
        let waited = reader.read("k", Duration::from_millis(300), async {}).await;
        assert!(
            matches!(waited, Err(sage_lock::LockError::TimedOut { .. })),
            "{name}: {waited:?}"
        );
        assert_eq!(
            queued_len(),
            0,
            "{name}: the reader whose wait ran out is still queued"
        );
        let reading =
            tokio::spawn(async move { reader.read("k", Duration::from_secs(5), async {}).await });
        gives_up(reading, queued_len, "the reader that gave up").await;
        release.send(()).expect("release");
        writer.await.expect("writer");
        let tried = rw.try_write("k", async { 1 }).await.expect("try_write");
        assert_eq!(tried, Some(1), "{name}: free lock, empty queues");
    }
}

/// A release of the semaphore or of a writer hands the lock over on the server to the first live
/// queued waiter, with a new fencing token: handed to a waiter that never takes it (written
/// into the queue directly, its place lasting 10 s), it comes back when the hand-off lease ends
/// (the releaser's 1 s lease), and a real waiter queued behind it gets it then, with the fencing
/// token after the one the hand-off took. The same for a dead reader queued ahead of a real
/// writer (`read`): the writer's release hands it a read lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_to_a_dead_semaphore_writer_or_reader_waiter_lasts_its_lease() {
    for primitive in ["semaphore", "write", "read"] {
        for kind in ServerKind::ALL {
            let server = harness::shared(kind);
            let ns = ns(&format!("dead-handoff-{primitive}"), kind);
            let name = format!("{} {primitive}", kind.name());
            let short = LockOptions::new()
                .namespace(&ns)
                .lease(Duration::from_secs(1));
            let client = connect(&server.url()).await;
            let holder = match primitive {
                "semaphore" => Queued::Permit(client.semaphore_with(1, short).expect("options")),
                _ => Queued::Write(client.rw_lock_with(short).expect("options")),
            };
            let [queue, places] = holder
                .queue_keys()
                .map(|suffix| format!("{{{ns}:k}}:{suffix}"));
            // The dead waiter: for `read`, a reader queued ahead of the real (writing) waiter.
            let [ghost_queue, ghost_places] = match primitive {
                "read" => ["rq", "rd"].map(|suffix| format!("{{{ns}:k}}:{suffix}")),
                _ => [queue.clone(), places.clone()],
            };
            let fence = std::sync::Arc::new(std::sync::Mutex::new(0));
            let (held_tx, held_rx) = tokio::sync::oneshot::channel();
            let (release, release_rx) = tokio::sync::oneshot::channel::<()>();
            let held = tokio::spawn({
                let (holder, fence) = (holder.clone(), fence.clone());
                async move {
                    holder
                        .hold("k", Duration::from_secs(5), async move {
                            *fence.lock().expect("fence") =
                                sage_lock::current_lease().expect("lease").fencing_token();
                            let _ = held_tx.send(());
                            let _ = release_rx.await;
                        })
                        .await
                        .expect("hold");
                }
            });
            held_rx.await.expect("held");
            let held_fence = *fence.lock().expect("fence");
            queue_ghost(server.port(), &ghost_queue, &ghost_places, 10_000);
            let waiter = Queued::new(primitive, &connect(&server.url()).await, &ns);
            let entered = tokio::spawn(async move {
                waiter
                    .hold("k", Duration::from_secs(8), async {
                        let lease = sage_lock::current_lease().expect("lease");
                        (Instant::now(), lease.fencing_token())
                    })
                    .await
                    .expect("the waiter behind the dead one gets the lock")
            });
            let start = Instant::now();
            let with_ghost = if ghost_queue == queue { 2 } else { 1 };
            while zcard(server.port(), &queue) < with_ghost {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "{name}: never queued"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            release.send(()).expect("release");
            held.await.expect("holder");
            let released_at = Instant::now();
            let handed = match primitive {
                "semaphore" => harness::cmd(
                    server.port(),
                    &["ZSCORE", &format!("{{{ns}:k}}:sem"), "ghost"],
                )
                .map(|r| r.as_str().is_some()),
                "read" => harness::cmd(
                    server.port(),
                    &["ZSCORE", &format!("{{{ns}:k}}:r"), "ghost"],
                )
                .map(|r| r.as_str().is_some()),
                _ => harness::cmd(server.port(), &["GET", &format!("{{{ns}:k}}:w")])
                    .map(|r| r.as_str() == Some("ghost")),
            };
            assert_eq!(handed, Ok(true), "{name}: the release did not hand over");
            let (at, waiter_fence) = entered.await.expect("waiter");
            let waited = at.saturating_duration_since(released_at);
            println!("{name}: the waiter behind the dead one entered {waited:?} after the release");
            assert!(
                waited > Duration::from_millis(600) && waited < DEAD_WAITER_BOUND,
                "{name}: entered {waited:?} after the release; the hand-off lease is 1 s"
            );
            assert_eq!(
                waiter_fence,
                held_fence + 2,
                "{name}: the hand-off took the fencing token between the two holds"
            );
        }
    }
}

/// A release hands the lock to at most 32 queued readers by name, and tells the rest with an
/// empty message: behind a holding writer, 40 readers that never retry (written into the reader
/// queue directly, places lasting 10 s) and then a real reader queue. The writer's release gives
/// the first 32 a read lease each (one fencing token each), leaves the other 8 queued, and the
/// real reader, woken by the message, enters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_at_most_32_readers() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("rw-reader-cap", kind);
        let name = kind.name();
        let rw = |client: &LockClient| rw_locks(client, &ns);
        let writer = rw(&connect(&server.url()).await);
        let (release, held) = hold_queued(&Queued::Write(writer), "k").await;
        let [readers, queue, dues, fence] =
            ["r", "rq", "rd", "fence"].map(|suffix| format!("{{{ns}:k}}:{suffix}"));
        let ghosts: Vec<String> = (0..40).map(|i| format!("ghost-{i:02}")).collect();
        let ghost_names: Vec<&str> = ghosts.iter().map(String::as_str).collect();
        queue_ghosts(server.port(), &queue, &dues, 10_000, &ghost_names);
        let reader = rw(&connect(&server.url()).await);
        let reading = tokio::spawn(async move {
            reader
                .read("k", Duration::from_secs(5), async {
                    sage_lock::current_lease().expect("lease").fencing_token()
                })
                .await
        });
        let start = Instant::now();
        while zcard(server.port(), &queue) < 41 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{name}: never queued"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let counter = |port| {
            harness::cmd(port, &["GET", &fence])
                .ok()
                .and_then(|r| r.as_str().and_then(|s| s.parse::<u64>().ok()))
                .unwrap_or(0)
        };
        let before = counter(server.port());
        release.send(()).expect("release");
        held.await.expect("writer");
        let entered_with = reading
            .await
            .expect("reader")
            .expect("the reader past the cap enters");
        let handed: Vec<bool> = ghosts
            .iter()
            .map(|ghost| {
                harness::cmd(server.port(), &["ZSCORE", &readers, ghost])
                    .map(|r| r.as_str().is_some())
                    .unwrap_or(false)
            })
            .collect();
        assert!(
            handed[..32].iter().all(|h| *h) && !handed[32..].iter().any(|h| *h),
            "{name}: not the first 32 readers handed the lock: {handed:?}"
        );
        assert_eq!(
            zcard(server.port(), &queue),
            8,
            "{name}: the 8 readers past the cap stay queued"
        );
        assert!(
            entered_with > before + 32,
            "{name}: the reader's fencing token {entered_with} comes after the 32 hand-offs' \
             (counter {before} before the release)"
        );
    }
}
