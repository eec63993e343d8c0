//! A client process that stops running for a while (`SIGSTOP`, a VM pause, a runtime whose
//! threads are blocked): what its calls say when it runs again (audit 46). A current-thread
//! runtime blocked by `std::thread::sleep` stops every task of the client, its renewals and
//! timers included, the way a stopped process does.

use std::time::Duration;

use harness::ServerKind;
use sage_lock::{LockClient, LockError, LockOptions, Locks, LossReason, TimeoutReason};

/// Blocks the current-thread runtime (every task of the client) for `pause`, `after` from now.
fn stall(after: Duration, pause: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        std::thread::sleep(pause);
    })
}

/// A holder stalled past its lease is told so: the loss says it was noticed late because the
/// process did not run, not only that "no renewal completed in time", which points at the
/// server (audit 46: "held 2.297s" for a 600 ms lease, with nothing about the stall).
#[tokio::test(flavor = "current_thread")]
async fn a_holder_stalled_past_its_lease_is_told_why_it_lost() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks: Locks<str> = client
            .lock_with(
                LockOptions::new()
                    .namespace("stalls-holder")
                    .lease(Duration::from_millis(600)),
            )
            .expect("options");
        let stalled = stall(Duration::from_millis(100), Duration::from_millis(2000));
        let outcome = locks
            .with_lock("k", Duration::from_secs(2), async {
                tokio::time::sleep(Duration::from_secs(5)).await;
            })
            .await;
        stalled.await.expect("the stall ends");
        println!("{kind}: {outcome:?}");
        let Err(LockError::LockLost { reason, .. }) = &outcome else {
            panic!("{kind}: a stall of 2 s over a 600 ms lease loses it: {outcome:?}");
        };
        let text = reason.to_string();
        assert!(
            matches!(reason, LossReason::RenewalFailed(_))
                && text.contains("after the usable lease ran out")
                && text.contains("did not run"),
            "{kind}: {text}"
        );
        client.quit().await;
    }
}

/// Two tasks of one process wait for a key another client holds; the process stalls past both
/// waits. The task that waited behind the other one in the process timed out
/// `Unavailable("no reply from the server within the wait")`, now and then, although the
/// server was fine (audit 46): handed the lead after its deadline, it sent an attempt with no
/// time left. Both say `Busy`.
#[tokio::test(flavor = "current_thread")]
async fn waiters_stalled_past_their_wait_time_out_busy() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let holder = LockClient::connect(&server.url()).await.expect("connect");
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let options = LockOptions::new()
            .namespace("stalls-waiters")
            .lease(Duration::from_secs(5));
        let held: Locks<str> = holder.lock_with(options.clone()).expect("options");
        let locks: Locks<str> = client.lock_with(options).expect("options");
        let mut reasons = Vec::new();
        for round in 0..8 {
            let key = format!("k{round}");
            let (taken_tx, taken_rx) = tokio::sync::oneshot::channel();
            let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
            let holding = {
                let (held, key) = (held.clone(), key.clone());
                tokio::spawn(async move {
                    held.with_lock(key.as_str(), Duration::from_secs(2), async {
                        let _ = taken_tx.send(());
                        let _ = done_rx.await;
                    })
                    .await
                })
            };
            taken_rx.await.expect("the holder takes the key");
            let mut waiters = Vec::new();
            for i in 0..2_u64 {
                let (locks, key) = (locks.clone(), key.clone());
                waiters.push(tokio::spawn(async move {
                    locks
                        .with_lock(key.as_str(), Duration::from_millis(300 + 20 * i), async {})
                        .await
                }));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let stalled = stall(Duration::from_millis(100), Duration::from_millis(600));
            for waiter in waiters {
                match waiter.await.expect("the waiter ends") {
                    Err(LockError::TimedOut { reason, .. }) => reasons.push(reason),
                    other => panic!("{kind}: the key stays held: {other:?}"),
                }
            }
            stalled.await.expect("the stall ends");
            let _ = done_tx.send(());
            holding
                .await
                .expect("the holder ends")
                .expect("the holder keeps the key");
        }
        println!("{kind}: {reasons:?}");
        assert!(
            reasons.iter().all(|reason| *reason == TimeoutReason::Busy),
            "{kind}: {reasons:?}"
        );
        holder.quit().await;
        client.quit().await;
    }
}

/// A waiter whose server stops answering after saying the lock is held (an operator's
/// `CLIENT PAUSE ... WRITE` holds its attempts back) times out `Unavailable`, not `Busy`: its
/// last attempt went unanswered for most of the wait. Before, it said "held by another owner
/// ... for the whole wait" after 1.8 s of silence in a 2 s wait, and the metric counted
/// contention where there was an outage (audit 51).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_server_stops_answering_times_out_unavailable() {
    for kind in ServerKind::ALL {
        let server = harness::Server::start(kind);
        let options = LockOptions::new()
            .namespace("stalls-server")
            .lease(Duration::from_secs(1));
        let (holding, waiting) = (
            LockClient::connect(&server.url()).await.expect("connect"),
            LockClient::connect(&server.url()).await.expect("connect"),
        );
        let holder: Locks<str> = holding.lock_with(options.clone()).expect("opts");
        let waiter: Locks<str> = waiting.lock_with(options).expect("opts");
        let held = tokio::spawn(async move {
            holder
                .with_lock("k", Duration::from_secs(2), async {
                    tokio::time::sleep(Duration::from_secs(4)).await;
                })
                .await
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let waited = tokio::spawn(async move {
            waiter
                .with_lock("k", Duration::from_secs(2), async {})
                .await
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.cmd_ok(&["CLIENT", "PAUSE", "2500", "WRITE"]);
        let waited = waited.await.expect("task");
        println!("{kind}: {waited:?}");
        let Err(LockError::TimedOut { reason, .. }) = &waited else {
            panic!("{kind}: expected a timeout, got {waited:?}");
        };
        assert!(
            matches!(reason, TimeoutReason::Unavailable(_)),
            "{kind}: the server answered nothing for most of the wait: {waited:?}"
        );
        let _ = held.await;
        holding.quit().await;
        waiting.quit().await;
    }
}

/// A release whose answer arrives while the process does not run (stopped after sending it,
/// past the release bound) counts as a release, not a failure, and logs no "release not
/// answered" warning. Before, on resuming, the release's timer often won over its answer,
/// waiting in the socket: audit 50 counted 17 of 33 such releases, which had run, as
/// `release_failures`. Replies come 150 ms late through a proxy, so the stall lands while the
/// release is in flight.
#[tokio::test(flavor = "current_thread")]
async fn a_release_answered_while_the_process_stalled_counts_as_a_release() {
    use harness::chaos::proxy::{Mode, Proxy};
    use tracing::instrument::WithSubscriber as _;
    const ROUNDS: usize = 3;
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let proxy = Proxy::start(server.port()).expect("proxy");
        let client = LockClient::connect(&format!("redis://127.0.0.1:{}", proxy.port()))
            .await
            .expect("connect");
        let locks: Locks<str> = client
            .lock_with(
                LockOptions::new()
                    .namespace("stalls-release")
                    .lease(Duration::from_secs(20)),
            )
            .expect("opts");
        // The first release of a Valkey client asks the server once whether it has DELIFEQ.
        locks
            .with_lock("warm", Duration::from_secs(5), async {})
            .await
            .expect("warm");
        proxy.set_mode(Mode::Latency(Duration::from_millis(150)));
        let captured = harness::Captured::default();
        let before = client.stats();
        for round in 0..ROUNDS {
            let key = format!("k{round}");
            locks
                .with_lock(key.as_str(), Duration::from_secs(5), async {
                    // Blocks the runtime 30 ms into the release, for longer than its bound.
                    drop(stall(
                        Duration::from_millis(30),
                        Duration::from_millis(1500),
                    ));
                })
                .with_subscriber(captured.warn_subscriber())
                .await
                .expect("with_lock");
        }
        let after = client.stats();
        let (released, failed) = (
            after.releases - before.releases,
            after.release_failures - before.release_failures,
        );
        println!("{kind}: {released} releases, {failed} failures: {after:?}");
        assert_eq!(
            (released, failed),
            (ROUNDS as u64, 0),
            "{kind}: releases answered during a stall: {}",
            captured.text()
        );
        assert!(
            !captured.text().contains("release not answered"),
            "{kind}: {}",
            captured.text()
        );
        proxy.set_mode(Mode::Normal);
        for round in 0..ROUNDS {
            let key = format!("k{round}");
            assert!(
                locks.holder(key.as_str()).await.expect("holder").is_none(),
                "{kind}: {key} still held"
            );
        }
        client.quit().await;
    }
}

/// A hold lost because its renewal went unanswered (the server frozen by `SIGSTOP`) counts a
/// renewal failure as well as the loss: a dashboard on `renewal_failures` sees the renewals
/// failing. Before, a renewal still in flight when the usable lease ran out counted nothing:
/// audit 52 saw 24 losses "no renewal completed in time" with `renewal_failures` at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_unanswered_until_the_loss_counts_as_failed() {
    for kind in ServerKind::ALL {
        let server = harness::Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks: Locks<str> = client
            .lock_with(
                LockOptions::new()
                    .namespace("stalls-renewal")
                    .lease(Duration::from_secs(1)),
            )
            .expect("opts");
        let before = client.stats();
        let held = locks
            .with_lock("k", Duration::from_secs(2), async {
                server.pause();
                tokio::time::sleep(Duration::from_secs(3)).await;
            })
            .await;
        server.resume();
        let after = client.stats();
        println!("{kind}: {held:?}: {after:?}");
        assert!(
            matches!(held, Err(LockError::LockLost { .. })),
            "{kind}: {held:?}"
        );
        assert_eq!(
            (
                after.losses - before.losses,
                after.renewal_failures - before.renewal_failures
            ),
            (1, 1),
            "{kind}: (losses, renewal_failures): {after:?}"
        );
        client.quit().await;
    }
}
