//! What a service's logs and counters say when a hold ends badly (lost, cancelled, unanswered),
//! read as an on-call engineer would: at a `WARN` level filter, where the `sage_lock` span (at
//! `DEBUG`) does not exist, every warning still names its key and namespace, and every hold is
//! counted once, as what happened to it (helper 30's audit).

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{raw_del, raw_exists};
use harness::{Captured, Server, ServerKind};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use sage_lock::{LockClient, LockError, LockOptions, Locks, LossReason, current_lease};

/// This binary's global `WARN` log and metrics recorder (events of background tasks included).
fn observers() -> &'static (Captured, Snapshotter) {
    static OBSERVERS: OnceLock<(Captured, Snapshotter)> = OnceLock::new();
    OBSERVERS.get_or_init(|| {
        let captured = Captured::global_warn();
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("one global recorder");
        (captured, snapshotter)
    })
}

/// The logged lines that mention `namespace`.
fn lines_of(namespace: &str) -> Vec<String> {
    observers()
        .0
        .text()
        .lines()
        .filter(|line| line.contains(namespace))
        .map(str::to_owned)
        .collect()
}

/// Asserts that a line of `namespace` holds `message` and `key={key}` (and `more`).
fn assert_logged(kind: ServerKind, namespace: &str, message: &str, key: &str, more: &[&str]) {
    let key = format!("key={key}");
    assert!(
        lines_of(namespace).iter().any(|line| line.contains(message)
            && line.contains(&key)
            && more.iter().all(|part| line.contains(part))),
        "{kind}: no `{message}` naming {key} in {namespace}: {:?}",
        observers().0.text()
    );
}

/// A client of this binary's shared server of `kind`.
async fn shared_client(kind: ServerKind) -> LockClient {
    LockClient::connect(&harness::shared(kind).url())
        .await
        .expect("connect")
}

fn family(client: &LockClient, namespace: &str, lease: Duration) -> Locks<str> {
    client
        .lock_with(LockOptions::new().namespace(namespace).lease(lease))
        .expect("valid options")
}

fn namespace(test: &str, kind: ServerKind) -> String {
    format!("{test}-{}-{}", kind.name(), rand::random::<u32>())
}

/// Polls `done` every 10 ms for up to `within`; whether it came true.
async fn eventually(within: Duration, mut done: impl AsyncFnMut() -> bool) -> bool {
    let until = Instant::now() + within;
    loop {
        if done().await {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A lock force-unlocked under its body: the loss warning names the key, the namespace and
/// the fencing token, with only `WARN` enabled (before, it had neither key nor namespace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_warning_names_its_key_namespace_and_token() {
    observers();
    for kind in ServerKind::ALL {
        let client = shared_client(kind).await;
        let ns = namespace("warned-loss", kind);
        let locks = family(&client, &ns, Duration::from_millis(900));
        let operator = locks.clone();
        let outcome = locks
            .with_lock("forced", Duration::from_secs(2), async move {
                let token = current_lease().map(|lease| lease.fencing_token());
                operator
                    .force_unlock_by("forced", "the test")
                    .await
                    .expect("force");
                tokio::time::sleep(Duration::from_secs(5)).await;
                token
            })
            .await;
        assert!(
            matches!(
                outcome,
                Err(LockError::LockLost {
                    reason: LossReason::NotOwner,
                    ..
                })
            ),
            "{kind}: {outcome:?}"
        );
        assert_logged(
            kind,
            &ns,
            "lock lost; body cancelled",
            "forced",
            &["fencing_token="],
        );
        client.quit().await;
    }
}

/// Releases at a server that stopped answering, after the body and after a cancellation (in
/// the background): each warning names its key and namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_release_names_its_key_and_namespace() {
    observers();
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let ns = namespace("unanswered-release", kind);
        let locks = family(&client, &ns, Duration::from_secs(10));
        let out = locks
            .with_lock("after-body", Duration::from_secs(2), async {
                server.pause();
                7
            })
            .await;
        assert!(matches!(out, Ok(7)), "{kind}: {out:?}");
        server.resume();
        let cancelled = tokio::time::timeout(
            Duration::from_millis(300),
            locks.with_lock("cancelled", Duration::from_secs(2), async {
                server.pause();
                tokio::time::sleep(Duration::from_secs(10)).await;
            }),
        )
        .await;
        assert!(cancelled.is_err(), "{kind}: the call was not cancelled");
        // The cancelled call's background release, unanswered within its second.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        server.resume();
        for key in ["after-body", "cancelled"] {
            assert_logged(kind, &ns, "release not answered", key, &[]);
        }
        client.quit().await;
    }
}

/// `with_locks` on one server (one unit of three keys): when one key is taken away, the other
/// two are released with the loss, not left taken by nobody until their lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_locks_releases_the_other_keys_when_one_is_lost() {
    observers();
    for kind in ServerKind::ALL {
        let client = shared_client(kind).await;
        let ns = namespace("multi-loss", kind);
        let locks = family(&client, &ns, Duration::from_secs(3));
        let intruder = client.clone();
        let b = LockClient::server_key(&ns, "b");
        let outcome = locks
            .with_locks(&["a", "b", "c"], Duration::from_secs(2), async move {
                assert_eq!(raw_del(&intruder, &b).await, 1);
                tokio::time::sleep(Duration::from_secs(10)).await;
            })
            .await;
        match &outcome {
            Err(LockError::LockLost {
                key,
                reason: LossReason::NotOwner,
                ..
            }) => assert_eq!(key, "b", "{kind}"),
            other => panic!("{kind}: expected b's loss: {other:?}"),
        }
        let (a, c) = (
            LockClient::server_key(&ns, "a"),
            LockClient::server_key(&ns, "c"),
        );
        let freed = eventually(Duration::from_secs(1), async || {
            !raw_exists(&client, &a).await && !raw_exists(&client, &c).await
        })
        .await;
        assert!(
            freed,
            "{kind}: a and c are still taken by nobody after the loss of b"
        );
        client.quit().await;
    }
}

/// A call cancelled after its lock was taken away: its background release finds the key gone,
/// which is a loss (counted, and warned about), not a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_after_its_lock_was_taken_away_counts_a_loss() {
    observers();
    for kind in ServerKind::ALL {
        let client = shared_client(kind).await;
        let ns = namespace("cancelled-loss", kind);
        let locks = family(&client, &ns, Duration::from_secs(6));
        let operator = locks.clone();
        let before = client.stats();
        let cancelled = tokio::time::timeout(
            Duration::from_millis(300),
            locks.with_lock("k", Duration::from_secs(2), async move {
                operator
                    .force_unlock_by("k", "the test")
                    .await
                    .expect("force");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }),
        )
        .await;
        assert!(cancelled.is_err(), "{kind}: the call was not cancelled");
        let counted = eventually(Duration::from_secs(2), async || {
            client.stats().losses > before.losses
        })
        .await;
        let after = client.stats();
        assert!(counted, "{kind}: no loss counted: {before:?} -> {after:?}");
        assert_eq!(after.releases, before.releases, "{kind}: {after:?}");
        assert_logged(
            kind,
            &ns,
            "lock lost before its release",
            "k",
            &["body=\"cancelled\""],
        );
        client.quit().await;
    }
}

/// A body that panics after its lock was taken away: its release, in the background, finds the
/// key gone (a loss, counted) and the warning says the body panicked, not that its call was
/// cancelled (before, the two could not be told apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_panics_is_told_from_a_cancelled_call() {
    observers();
    for kind in ServerKind::ALL {
        let client = shared_client(kind).await;
        let ns = namespace("panicked-loss", kind);
        let locks = family(&client, &ns, Duration::from_secs(6));
        let operator = locks.clone();
        let before = client.stats();
        let panicked = tokio::spawn(async move {
            locks
                .with_lock("k", Duration::from_secs(2), async move {
                    operator
                        .force_unlock_by("k", "the test")
                        .await
                        .expect("force");
                    panic!("the body's own bug");
                })
                .await
        })
        .await;
        assert!(
            panicked
                .as_ref()
                .is_err_and(tokio::task::JoinError::is_panic),
            "{kind}: the body did not panic: {panicked:?}"
        );
        let counted = eventually(Duration::from_secs(2), async || {
            client.stats().losses > before.losses
        })
        .await;
        assert!(counted, "{kind}: no loss counted: {:?}", client.stats());
        assert_logged(
            kind,
            &ns,
            "lock lost before its release",
            "k",
            &["body=\"panicked\""],
        );
        client.quit().await;
    }
}

/// A call cancelled while its release waits for a paused server: the release it sent runs
/// when the server resumes, so the hold counts as released (not lost, and not nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_before_its_call_was_cancelled_counts_a_release() {
    observers();
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let ns = namespace("cancelled-release", kind);
        let locks = family(&client, &ns, Duration::from_secs(3));
        let before = client.stats();
        let cancelled = tokio::time::timeout(
            Duration::from_millis(400),
            locks.with_lock("k", Duration::from_secs(2), async {
                server.pause();
            }),
        )
        .await;
        assert!(cancelled.is_err(), "{kind}: the release should wait");
        tokio::time::sleep(Duration::from_millis(500)).await;
        server.resume();
        let key = LockClient::server_key(&ns, "k");
        let counted = eventually(Duration::from_secs(2), async || {
            client.stats().releases > before.releases
        })
        .await;
        let after = client.stats();
        assert!(
            counted,
            "{kind}: no release counted: {before:?} -> {after:?}"
        );
        assert!(!raw_exists(&client, &key).await, "{kind}: the key is left");
        assert_eq!(after.losses, before.losses, "{kind}: {after:?}");
        assert!(
            !lines_of(&ns).iter().any(|line| line.contains("lock lost")),
            "{kind}: a release was reported as a loss: {:?}",
            lines_of(&ns)
        );
        client.quit().await;
    }
}

/// A `try_with_lock` that finds the lock held counts as a busy attempt, as a waiting call's do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_try_counts_a_busy_attempt() {
    observers();
    for kind in ServerKind::ALL {
        let client = shared_client(kind).await;
        let ns = namespace("busy-try", kind);
        let locks = family(&client, &ns, Duration::from_secs(5));
        let by_hand: Locks<String> = client
            .lock_with(LockOptions::new().namespace(ns.as_str()))
            .expect("options");
        let (release, holder) = harness::hold_by_hand(&by_hand, "k").await;
        let before = client.stats();
        let tried = locks.try_with_lock("k", async {}).await;
        assert!(matches!(tried, Ok(None)), "{kind}: {tried:?}");
        let after = client.stats();
        let _ = release.send(());
        holder.await.expect("holder");
        assert_eq!(
            after.busy_retries,
            before.busy_retries + 1,
            "{kind}: {after:?}"
        );
        client.quit().await;
    }
}

/// The hold-time samples of `namespace` in `snapshot`.
fn hold_samples(
    snapshot: &[(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )],
    namespace: &str,
) -> Vec<f64> {
    snapshot
        .iter()
        .filter(|(key, _, _, _)| {
            key.key().name() == "sage_lock_hold_seconds"
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "namespace" && l.value() == namespace)
        })
        .flat_map(|(_, _, _, value)| match value {
            DebugValue::Histogram(samples) => samples.iter().map(|s| s.into_inner()).collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// One hold-time sample per hold, measured to the body's end: not the release's wait for a
/// server that stopped answering (it was up to 1 s more), and not twice for a loss whose call
/// is cancelled while the loss's release is under way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hold_sample_per_hold_measured_to_the_bodys_end() {
    let (_, snapshotter) = observers();
    let mut checks = Vec::new();
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        // The release waits for a paused server.
        let waited_ns = namespace("sample-release-wait", kind);
        let locks = family(&client, &waited_ns, Duration::from_secs(10));
        let out = locks
            .with_lock("k", Duration::from_secs(2), async {
                server.pause();
            })
            .await;
        assert!(out.is_ok(), "{kind}: {out:?}");
        server.resume();
        // A loss (the server paused past the lease), then the call cancelled at once.
        let lost_ns = namespace("sample-lost-cancelled", kind);
        let locks = family(&client, &lost_ns, Duration::from_millis(900));
        let (lease_tx, lease_rx) = tokio::sync::oneshot::channel();
        let call = locks.with_lock("k", Duration::from_secs(2), async {
            let _ = lease_tx.send(current_lease().expect("a lease"));
            server.pause();
            tokio::time::sleep(Duration::from_secs(10)).await;
        });
        let watch = async {
            let lease = lease_rx.await.expect("the body ran");
            // The loss ends the lease first thing; cancel the call right after.
            while !lease.remaining().is_zero() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::select! {
            outcome = call => panic!("{kind}: the call ended before its cancellation: {outcome:?}"),
            () = watch => {}
        }
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        server.resume();
        checks.push((kind, waited_ns, lost_ns));
        client.quit().await;
    }
    let snapshot = snapshotter.snapshot().into_vec();
    for (kind, waited_ns, lost_ns) in checks {
        let waited = hold_samples(&snapshot, &waited_ns);
        assert!(
            waited.len() == 1 && waited[0] < 0.5,
            "{kind}: the hold is measured to the body's end: {waited:?}"
        );
        let lost = hold_samples(&snapshot, &lost_ns);
        assert_eq!(
            lost.len(),
            1,
            "{kind}: one sample for the lost hold: {lost:?}"
        );
    }
}

/// Requests cut by the service's own timeouts while they wait in a queue (three keys, forty
/// requests a round, each cut at 100–300 ms, 20 ms bodies): once everything settled, every
/// acquisition counted is a release or a loss, and nothing else is. Before, removing a hand-off
/// granted to a waiter already cancelled counted a release for an acquisition never counted,
/// so "held now" (acquisitions − releases − losses) went negative.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_acquisitions_equal_to_releases_and_losses() {
    for kind in ServerKind::ALL {
        let client = shared_client(kind).await;
        let ns = namespace("cancelled-waiters", kind);
        let locks = family(&client, &ns, Duration::from_secs(5));
        let mut cancelled = 0;
        for round in 0..8u64 {
            let requests: Vec<_> = (0..40u64)
                .map(|request| {
                    let locks = locks.clone();
                    let cut = Duration::from_millis(100 + (request * 37 + round * 11) % 200);
                    tokio::spawn(async move {
                        tokio::time::timeout(
                            cut,
                            locks.with_lock(
                                &format!("k{}", request % 3),
                                Duration::from_secs(2),
                                async {
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                },
                            ),
                        )
                        .await
                    })
                })
                .collect();
            for request in requests {
                match request.await.expect("a request task") {
                    Ok(result) => result.expect("a lock call"),
                    Err(_) => cancelled += 1,
                }
            }
        }
        assert!(cancelled > 0, "{kind}: no request was cut");
        let settled = eventually(Duration::from_secs(5), async || {
            sage_lock::__private::resident(&client).releases == 0
        })
        .await;
        assert!(settled, "{kind}: releases still under way");
        let stats = client.stats();
        println!(
            "{kind}: {cancelled} requests cut; acquisitions {}, releases {}, losses {}, \
             handoffs {}",
            stats.acquisitions, stats.releases, stats.losses, stats.handoffs
        );
        assert_eq!(
            stats.acquisitions,
            stats.releases + stats.losses,
            "{kind}: acquisitions are not releases plus losses once settled: {stats:?}"
        );
        client.quit().await;
    }
}
