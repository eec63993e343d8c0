//! The subscriber connection killed again and again while a client waits on many keys: once
//! idle, the client leaves no subscription on the server. A binary of its own: its thousands of
//! tasks would move the process-wide memory the `soak` tests measure.

use std::time::{Duration, Instant};

use harness::{Server, ServerKind};
use sage_lock::__private::resident;
use sage_lock::{LockClient, LockError, LockOptions};

/// How long a holder waits for its lock.
const WAIT: Duration = Duration::from_secs(15);
/// How long an idle client may take to drop its channels: they linger 2 s and are swept every
/// second, one `SUNSUBSCRIBE` at a time (about 3 s when run alone; 10.6 s seen beside the
/// cluster test of this binary); the rest is slack for a busy machine.
const SETTLE: Duration = Duration::from_secs(30);

/// Keys one waiting client waits on at once in [`subscriptions_outlast_no_kill_storm`].
const STORM_KEYS: usize = 2000;

/// `keys` keys held by one client (30 s leases) and waited on by another, both of `url`, in
/// namespace `ns`: when [`Contention::start`] returns, every holder has its lock and every
/// waiter is on its way.
struct Contention {
    holder: LockClient,
    waiter: LockClient,
    release: tokio::sync::watch::Sender<bool>,
    holders: Vec<tokio::task::JoinHandle<Result<(), LockError>>>,
    waiters: Vec<tokio::task::JoinHandle<Result<(), LockError>>>,
}

impl Contention {
    async fn start(url: &str, ns: &str, keys: usize) -> Contention {
        let options = || {
            LockOptions::new()
                .namespace(ns)
                .lease(Duration::from_secs(30))
        };
        let holder = LockClient::connect(url).await.expect("connect");
        let waiter = LockClient::connect(url).await.expect("connect");
        let (holds, waits) = (
            holder.lock_with::<str>(options()).expect("options"),
            waiter.lock_with::<str>(options()).expect("options"),
        );
        let (release, released) = tokio::sync::watch::channel(false);
        let (held_tx, mut held) = tokio::sync::mpsc::channel::<()>(keys);
        let holders = (0..keys)
            .map(|i| {
                let (holds, mut released, held_tx) =
                    (holds.clone(), released.clone(), held_tx.clone());
                tokio::spawn(async move {
                    holds
                        .with_lock(&format!("k{i}"), WAIT, async move {
                            let _ = held_tx.send(()).await;
                            let _ = released.wait_for(|go| *go).await;
                        })
                        .await
                })
            })
            .collect();
        for _ in 0..keys {
            held.recv().await.expect("a holder acquired");
        }
        let waiters = (0..keys)
            .map(|i| {
                let waits = waits.clone();
                tokio::spawn(async move {
                    waits
                        .with_lock(&format!("k{i}"), Duration::from_secs(60), async {})
                        .await
                })
            })
            .collect();
        Contention {
            holder,
            waiter,
            release,
            holders,
            waiters,
        }
    }

    /// Lets the holders go and waits until every waiter had its lock; returns the holder's and
    /// the waiter's clients.
    async fn finish(self) -> (LockClient, LockClient) {
        self.release.send_replace(true);
        for holder in self.holders {
            holder.await.expect("holder task").expect("holder");
        }
        for waiter in self.waiters {
            waiter.await.expect("waiter task").expect("waiter");
        }
        (self.holder, self.waiter)
    }
}

/// The subscriber connection killed again and again while one client waits on many keys (an
/// audit's repro: 5,000 keys, six `CLIENT KILL TYPE pubsub` 300 ms apart): once every waiter
/// got its lock and the client went idle, no subscription is left on the server. Before, the
/// resubscription after each reconnect forgot which channels might still be subscribed, so a
/// channel whose `SSUBSCRIBE` was still queued in fred when its waiter left was forgotten
/// without an `SUNSUBSCRIBE`: thousands of channels stayed subscribed for the client's life.
async fn subscriptions_outlast_no_kill_storm(kind: ServerKind) {
    let server = Server::start(kind);
    let port = server.port();
    let ns = format!("kill-storm-{}", rand::random::<u32>());
    let contention = Contention::start(&server.url(), &ns, STORM_KEYS).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    for _ in 0..6 {
        harness::cmd_ok(port, &["CLIENT", "KILL", "TYPE", "pubsub"]);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (holder, waiter) = contention.finish().await;
    // Idle channels linger 2 s and are swept every second, one SUNSUBSCRIBE at a time. Until the
    // client has swept them all, the server may show none only because the subscriber
    // connection is reconnecting (with SSUBSCRIBEs still queued in fred): wait for both.
    let started = Instant::now();
    let mut left = harness::shard_channels(port).len();
    while (left > 0 || resident(&waiter).channels > 0) && started.elapsed() < SETTLE {
        tokio::time::sleep(Duration::from_millis(250)).await;
        left = harness::shard_channels(port).len();
    }
    println!(
        "{}: {left} channels subscribed {:?} after the last waiter ({} tracked by the client)",
        kind.name(),
        started.elapsed(),
        resident(&waiter).channels
    );
    assert_eq!(
        left,
        0,
        "{}: subscriptions left on the server by the idle client",
        kind.name()
    );
    holder.quit().await;
    waiter.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_subscriptions_outlast_no_kill_storm() {
    subscriptions_outlast_no_kill_storm(ServerKind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_subscriptions_outlast_no_kill_storm() {
    subscriptions_outlast_no_kill_storm(ServerKind::Valkey).await;
}

/// Keys one waiting client waits on in [`a_reconnect_resubscribes_every_channel_at_once`].
const RESUBSCRIBE_KEYS: usize = 3000;

/// Channels subscribed on the server, summed over `ports` (a cluster's primaries).
fn channels_on(ports: &[u16]) -> usize {
    ports
        .iter()
        .map(|&p| harness::shard_channels(p).len())
        .sum()
}

/// After its subscriber connection is killed, a client waiting on thousands of keys in a
/// cluster subscribes their channels again together, not one round trip after another: its
/// waiters are back on release notifications within about a second, instead of polling for
/// seconds (an audit: about 6 s for 5,000 channels). Once idle, the channels are dropped
/// together too.
async fn a_reconnect_resubscribes_every_channel_at_once(kind: ServerKind) {
    let cluster = harness::Cluster::start(kind);
    let ports: Vec<u16> = cluster.nodes.iter().take(3).map(|n| n.port()).collect();
    let ns = format!("resub-{}", rand::random::<u32>());
    let contention = Contention::start(&cluster.url(), &ns, RESUBSCRIBE_KEYS).await;
    let subscribed = Instant::now() + Duration::from_secs(30);
    while channels_on(&ports) < RESUBSCRIBE_KEYS {
        assert!(
            Instant::now() < subscribed,
            "{kind}: the waiters never all subscribed: {} of {RESUBSCRIBE_KEYS}",
            channels_on(&ports)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for &port in &ports {
        harness::cmd_ok(port, &["CLIENT", "KILL", "TYPE", "pubsub"]);
    }
    let killed = Instant::now();
    let mut back = channels_on(&ports);
    while back < RESUBSCRIBE_KEYS && killed.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        back = channels_on(&ports);
    }
    let took = killed.elapsed();
    println!(
        "{kind}: {back} of {RESUBSCRIBE_KEYS} channels subscribed again {took:?} after the kill"
    );
    let (holder, waiter) = contention.finish().await;
    assert_eq!(
        back, RESUBSCRIBE_KEYS,
        "{kind}: channels not subscribed again"
    );
    assert!(
        took < Duration::from_secs(2),
        "{kind}: {RESUBSCRIBE_KEYS} channels took {took:?} to be subscribed again"
    );
    // Idle, the channels linger 2 s and are then dropped together (the subscriber reads no
    // release message while it sweeps).
    let idle = Instant::now();
    let mut left = channels_on(&ports);
    while left > 0 && idle.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = channels_on(&ports);
    }
    let swept = idle.elapsed();
    println!("{kind}: {left} channels left {swept:?} after the last waiter");
    assert_eq!(
        left, 0,
        "{kind}: channels left subscribed by the idle client"
    );
    assert!(
        swept < Duration::from_secs(5),
        "{kind}: {RESUBSCRIBE_KEYS} idle channels took {swept:?} to be dropped"
    );
    holder.quit().await;
    waiter.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_reconnect_resubscribes_every_channel_at_once() {
    a_reconnect_resubscribes_every_channel_at_once(ServerKind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_a_reconnect_resubscribes_every_channel_at_once() {
    a_reconnect_resubscribes_every_channel_at_once(ServerKind::Valkey).await;
}
