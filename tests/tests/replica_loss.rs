//! The replica-count floor (issue 8, found by the chaos suite with `--topology sentinel --server
//! valkey --seconds 8 --seed 6`): during a Sentinel failover the replica being promoted leaves the
//! old primary's `ROLE` list before the old primary is demoted. A grant (or renewal) made on the
//! old primary in that window and acknowledged only by the replicas still attached is lost when
//! those replicas resync from the new primary, which then grants the same fencing token again.
//!
//! These tests open that window deterministically on a primary with two replicas: one replica is
//! detached with `REPLICAOF NO ONE` (exactly what Sentinel sends to the replica it promotes), so
//! `ROLE` lists one replica where it listed two. Until the smaller count has been seen for
//! [`sage_lock::REPLICA_LOSS_HOLD`], neither an acquisition nor a renewal may count as
//! acknowledged; after it, availability comes back; a replica that comes back restores it at once.
//! A client that has seen no `ROLE` yet (a new process) takes the first floor from Sentinel.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use harness::{Replicated, SentinelSetup, ServerKind};
use sage_lock::{LockClient, LockError, LockOptions, Locks, LossReason, TimeoutReason};

const HOLD: Duration = sage_lock::REPLICA_LOSS_HOLD;

async fn connect(setup: &Replicated) -> LockClient {
    LockClient::builder()
        .url(&setup.primary_url())
        .replicated(true)
        .command_timeout(Duration::from_secs(1))
        .connect()
        .await
        .expect("connect")
}

/// Waits until the primary lists `n` connected replicas.
fn wait_connected_replicas(setup: &Replicated, n: usize) {
    let expected = n.to_string();
    harness::wait_until(Duration::from_secs(20), || {
        match harness::info_field(setup.primary.port(), "replication", "connected_slaves") {
            Some(count) if count == expected => Ok(()),
            other => Err(format!("connected_slaves {other:?}, want {expected}")),
        }
    })
    .expect("replica count");
}

/// Detaches `replicas[1]` the way Sentinel promotes a replica (`REPLICAOF NO ONE`).
fn detach_one(setup: &Replicated) {
    setup.replicas[1].cmd_ok(&["REPLICAOF", "NO", "ONE"]);
    wait_connected_replicas(setup, 1);
}

/// Locks in `namespace` (2 s lease), taken three times while the primary's replicas are
/// attached, so the client has seen them in `ROLE`.
async fn warmed_locks(client: &LockClient, namespace: &str) -> Locks<str> {
    let locks: Locks<str> = client
        .lock_with(
            LockOptions::new()
                .namespace(namespace)
                .lease(Duration::from_secs(2)),
        )
        .expect("opts");
    for _ in 0..3 {
        locks
            .with_lock("k", Duration::from_secs(2), async {})
            .await
            .expect("the replicas attached");
    }
    locks
}

/// Waits for `k` once more and asserts it is granted after [`HOLD`] (counted from `started`,
/// the first acquisition that saw the replica missing) but not much later; returns when.
async fn granted_after_the_hold(
    locks: &Locks<str>,
    started: Instant,
    kind: ServerKind,
) -> Duration {
    let back = locks
        .with_lock("k", HOLD + Duration::from_secs(5), async { 7 })
        .await;
    let available_after = started.elapsed();
    assert_eq!(
        back.unwrap_or_else(|e| panic!("{}: after the hold: {e:?}", kind.name())),
        7
    );
    assert!(
        available_after >= HOLD,
        "{}: fewer replicas were accepted after {available_after:?}, before {HOLD:?}",
        kind.name()
    );
    assert!(
        available_after < HOLD + Duration::from_secs(3),
        "{}: availability came back only after {available_after:?}",
        kind.name()
    );
    available_after
}

fn lock_key_exists(setup: &Replicated, namespace: &str, key: &str) -> bool {
    let name = format!("{{{namespace}:{key}}}");
    setup.primary.cmd_ok(&["EXISTS", &name]).as_int() == Some(1)
}

/// An acquisition on a primary that just lost one of its two replicas is not acknowledged (the
/// one replica left acknowledges, but two were seen), its grant is undone, and the body never
/// runs; once the smaller count has been seen for `REPLICA_LOSS_HOLD`, acquisitions succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_needs_every_replica_seen_before_one_left() {
    for kind in ServerKind::ALL {
        let setup = Replicated::start(kind, 2);
        let client = connect(&setup).await;
        let locks = warmed_locks(&client, "floor").await;
        detach_one(&setup);
        let ran = AtomicBool::new(false);
        let started = Instant::now();
        let result = locks
            .with_lock("k", Duration::from_millis(1500), async {
                ran.store(true, Ordering::SeqCst);
            })
            .await;
        let refused_after = started.elapsed();
        match &result {
            Err(LockError::TimedOut {
                reason:
                    TimeoutReason::NotAcknowledged {
                        acknowledged: 1,
                        required: 2,
                    },
                ..
            }) => {}
            other => panic!(
                "{}: a grant acknowledged by 1 of the 2 replicas seen before was accepted: \
                 {other:?}",
                kind.name()
            ),
        }
        assert!(!ran.load(Ordering::SeqCst), "{}: body ran", kind.name());
        assert!(
            !lock_key_exists(&setup, "floor", "k"),
            "{}: the unacknowledged grant was not undone",
            kind.name()
        );
        // Availability comes back once the smaller count has been seen for the hold interval
        // (measured from the first acquisition that saw it).
        let available_after = granted_after_the_hold(&locks, started, kind).await;
        println!(
            "{}: one of two replicas detached -> TimedOut(NotAcknowledged 1/2) after \
             {refused_after:?}; granted again {available_after:?} after the detach (hold {HOLD:?})",
            kind.name()
        );
    }
}

/// A renewal on a primary that lost one of its two replicas while the lock is held is not
/// acknowledged either: the holder gets `LockLost` once its usable lease runs out (the replica
/// that left has the lease's older expiry) and the body is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_needs_every_replica_seen_before_one_left() {
    for kind in ServerKind::ALL {
        let setup = Replicated::start(kind, 2);
        let client = connect(&setup).await;
        let lease = Duration::from_millis(600);
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("floor-renew").lease(lease))
            .expect("opts");
        let finished = AtomicBool::new(false);
        let mut detached_at = None;
        let result = locks
            .with_lock("k", Duration::from_secs(2), async {
                tokio::time::sleep(Duration::from_millis(250)).await;
                detach_one(&setup);
                detached_at = Some(Instant::now());
                tokio::time::sleep(Duration::from_secs(5)).await;
                finished.store(true, Ordering::SeqCst);
            })
            .await;
        let detected_after = detached_at.map(|t| t.elapsed()).unwrap_or_default();
        match &result {
            Err(LockError::LockLost {
                reason:
                    LossReason::NotAcknowledged {
                        acknowledged: 1,
                        required: 2,
                    },
                ..
            }) => {}
            other => panic!(
                "{}: renewals acknowledged by 1 of the 2 replicas seen before kept the lock: \
                 {other:?}",
                kind.name()
            ),
        }
        assert!(!finished.load(Ordering::SeqCst), "{}", kind.name());
        assert!(
            detected_after <= lease + Duration::from_millis(500),
            "{}: detected after {detected_after:?}",
            kind.name()
        );
        println!(
            "{}: replica detached while held -> LockLost(NotAcknowledged 1/2) {detected_after:?} \
             after the detach (lease {lease:?})",
            kind.name()
        );
    }
}

/// The chaos suite's Sentinel runs (Redis, seed 7: 7 fencing tokens granted twice) found the
/// count not enough: Sentinel promoted the old primary's only replica and, before the failover
/// ended, attached the previous failover's stale primary to the *old* primary as a new replica.
/// The count was back to 1, grants there were acknowledged by the newcomer, and the newcomer then
/// resynced from the new primary and dropped them. A replica that left is not replaced by one
/// that joined: until it has been gone for the hold, writes are not acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_does_not_stand_in_for_a_replica_that_left() {
    for kind in ServerKind::ALL {
        let setup = Replicated::start(kind, 1);
        let newcomer = harness::Server::start(kind);
        let client = connect(&setup).await;
        let locks = warmed_locks(&client, "floor-swap").await;
        // What Sentinel did: the replica is promoted, another node attached to the old primary.
        setup.replicas[0].cmd_ok(&["REPLICAOF", "NO", "ONE"]);
        let primary = setup.primary.port().to_string();
        newcomer.cmd_ok(&["REPLICAOF", "127.0.0.1", &primary]);
        let listed = format!("port={},state=online", newcomer.port());
        harness::wait_until(Duration::from_secs(20), || {
            match harness::info_field(setup.primary.port(), "replication", "slave0") {
                Some(line) if line.contains(&listed) => Ok(()),
                other => Err(format!("slave0 {other:?}")),
            }
        })
        .expect("the newcomer is the primary's one replica");
        wait_connected_replicas(&setup, 1);
        let ran = AtomicBool::new(false);
        let started = Instant::now();
        let result = locks
            .with_lock("k", Duration::from_millis(1500), async {
                ran.store(true, Ordering::SeqCst);
            })
            .await;
        match &result {
            Err(LockError::TimedOut {
                reason:
                    TimeoutReason::NotAcknowledged {
                        acknowledged: 1,
                        required: 2,
                    },
                ..
            }) => {}
            other => panic!(
                "{}: a grant acknowledged only by a replica that joined after the one seen \
                 before left was accepted: {other:?}",
                kind.name()
            ),
        }
        assert!(!ran.load(Ordering::SeqCst), "{}: body ran", kind.name());
        // The price is bounded: once the replica has been gone for the hold, the newcomer counts.
        let available_after = granted_after_the_hold(&locks, started, kind).await;
        println!(
            "{}: replica swapped -> TimedOut(NotAcknowledged 1/2); granted again \
             {available_after:?} later (hold {HOLD:?})",
            kind.name()
        );
    }
}

/// The same swap, but the newcomer attaches while the acquisition's `WAIT` blocks (the chaos
/// suite, Sentinel Valkey seed 7, 2 tokens granted twice): the `ROLE` before the write listed
/// no replica (1 required, for the one that left) and `WAIT` then counted the newcomer's
/// acknowledgement. A replica that joined during the `WAIT` acknowledges nothing that counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_joining_during_wait_does_not_acknowledge() {
    for kind in ServerKind::ALL {
        let setup = Replicated::start(kind, 1);
        let newcomer = harness::Server::start(kind);
        let client = LockClient::builder()
            .url(&setup.primary_url())
            .replicated(true)
            .command_timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("connect");
        let locks = warmed_locks(&client, "floor-join").await;
        setup.replicas[0].cmd_ok(&["REPLICAOF", "NO", "ONE"]);
        wait_connected_replicas(&setup, 0);
        let primary = setup.primary.port().to_string();
        let attach = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            newcomer.cmd_ok(&["REPLICAOF", "127.0.0.1", &primary]);
        };
        let ran = AtomicBool::new(false);
        let acquire = locks.with_lock("k", Duration::from_secs(3), async {
            ran.store(true, Ordering::SeqCst);
        });
        let (result, ()) = tokio::join!(acquire, attach);
        assert!(
            matches!(
                &result,
                Err(LockError::TimedOut {
                    reason: TimeoutReason::NotAcknowledged { .. },
                    ..
                })
            ),
            "{}: a grant acknowledged by a replica that joined during WAIT was accepted: \
             {result:?}",
            kind.name()
        );
        assert!(!ran.load(Ordering::SeqCst), "{}: body ran", kind.name());
        wait_connected_replicas(&setup, 1);
        println!("{}: replica joined during WAIT -> {result:?}", kind.name());
    }
}

/// A replica that comes back restores availability at once, without waiting out the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returning_replica_restores_availability() {
    for kind in ServerKind::ALL {
        let setup = Replicated::start(kind, 2);
        let client = connect(&setup).await;
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("floor-back"))
            .expect("opts");
        locks
            .with_lock("k", Duration::from_secs(2), async {})
            .await
            .expect("both replicas attached");
        detach_one(&setup);
        let refused = locks
            .with_lock("k", Duration::from_millis(800), async {})
            .await;
        assert!(
            matches!(
                refused,
                Err(LockError::TimedOut {
                    reason: TimeoutReason::NotAcknowledged { .. },
                    ..
                })
            ),
            "{}: {refused:?}",
            kind.name()
        );
        let port = setup.primary.port().to_string();
        setup.replicas[1].cmd_ok(&["REPLICAOF", "127.0.0.1", &port]);
        setup
            .wait_synced(Duration::from_secs(20))
            .expect("replica back");
        let started = Instant::now();
        let value = locks
            .with_lock("k", Duration::from_secs(2), async { 5 })
            .await;
        assert_eq!(value.expect("replica back"), 5, "{}", kind.name());
        assert!(
            started.elapsed() < HOLD,
            "{}: took {:?}",
            kind.name(),
            started.elapsed()
        );
    }
}

/// A new client that first reaches the primary after one of its replicas left (a new process in
/// the middle of a failover) takes its floor from Sentinel, which still lists that replica: its
/// grant, acknowledged by the one replica left, is not accepted either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_client_through_sentinel_takes_the_floor_from_sentinel() {
    for kind in ServerKind::ALL {
        let setup = SentinelSetup::start(kind);
        let data = &setup.data;
        // What Sentinel sends the replica it promotes, behind its back: it still lists it.
        detach_one(data);
        let client = LockClient::connect(&setup.url())
            .await
            .expect("connect through sentinel");
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("floor-sentinel"))
            .expect("opts");
        let result = locks
            .with_lock("k", Duration::from_millis(1500), async {})
            .await;
        match &result {
            Err(LockError::TimedOut {
                reason:
                    TimeoutReason::NotAcknowledged {
                        acknowledged: 1,
                        required: 2,
                    },
                ..
            }) => {}
            other => panic!(
                "{}: a new client accepted a grant acknowledged by 1 of the 2 replicas Sentinel \
                 knows: {other:?}",
                kind.name()
            ),
        }
        let port = data.primary.port().to_string();
        data.replicas[1].cmd_ok(&["REPLICAOF", "127.0.0.1", &port]);
        data.wait_synced(Duration::from_secs(20))
            .expect("replica back");
        let value = locks
            .with_lock("k", Duration::from_secs(3), async { 9 })
            .await;
        assert_eq!(value.expect("replica back"), 9, "{}", kind.name());
        println!(
            "{}: new client, one of two replicas detached -> {result:?}",
            kind.name()
        );
    }
}

/// A shared hold (a reader, a permit) whose grant was not acknowledged is retried with the same
/// token, and the retry finds the token still holding. Other shares granted in between moved
/// the key's fencing counter on: the retry must not answer with that counter (another holder's
/// token) but with a token of its own. Found by the chaos suite (`--primitives all`, seed 1253,
/// replicated Redis: three readers of one key granted token 6).
/// Brings the detached replica back, lets the `retried` grant (held up, unacknowledged, while
/// `other` was granted) complete, asserts that its token is above `other`'s, and detaches the
/// replica again.
async fn assert_retried_grant_is_above(
    setup: &Replicated,
    label: &str,
    retried: tokio::task::JoinHandle<Result<Option<u64>, LockError>>,
    other: Option<u64>,
) {
    let port = setup.primary.port().to_string();
    setup.replicas[1].cmd_ok(&["REPLICAOF", "127.0.0.1", &port]);
    setup
        .wait_synced(Duration::from_secs(20))
        .expect("replica back");
    let retried = retried
        .await
        .expect("task")
        .unwrap_or_else(|e| panic!("{label}: {e:?}"));
    println!("{label}: the other holder's token {other:?}, the retried grant's {retried:?}");
    assert!(
        retried > other,
        "{label}: the retried grant's token {retried:?} is not above the token {other:?} of the \
         holder granted before it"
    );
    detach_one(setup);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_shared_grant_gets_a_token_of_its_own() {
    for kind in ServerKind::ALL {
        let setup = Replicated::start(kind, 2);
        let client = connect(&setup).await;
        let acknowledged = LockOptions::new().namespace("shared-retry");
        let unacknowledged = acknowledged.clone().replica_acknowledgement(false);
        let readers = client
            .rw_lock_with::<str>(acknowledged.clone())
            .expect("opts");
        let other_readers = client
            .rw_lock_with::<str>(unacknowledged.clone())
            .expect("opts");
        let permits = client.semaphore_with::<str>(2, acknowledged).expect("opts");
        let other_permits = client
            .semaphore_with::<str>(2, unacknowledged)
            .expect("opts");
        let token = || async { sage_lock::current_lease().map(|l| l.fencing_token()) };
        // Both replicas seen.
        readers
            .read("warm", Duration::from_secs(2), token())
            .await
            .expect("both replicas attached");
        detach_one(&setup);
        for primitive in ["reader", "permit"] {
            let key = format!("k-{primitive}");
            let retried = {
                let (readers, permits, key) = (readers.clone(), permits.clone(), key.clone());
                tokio::spawn(async move {
                    let wait = Duration::from_secs(4);
                    if primitive == "reader" {
                        readers.read(key.as_str(), wait, token()).await
                    } else {
                        permits.acquire(key.as_str(), wait, token()).await
                    }
                })
            };
            // The first grant is in, unacknowledged; another holder is granted meanwhile.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let wait = Duration::from_secs(1);
            let other = if primitive == "reader" {
                other_readers.read(key.as_str(), wait, token()).await
            } else {
                other_permits.acquire(key.as_str(), wait, token()).await
            };
            let other = other.expect("the other holder, without acknowledgement");
            let label = format!("{} {primitive}", kind.name());
            assert_retried_grant_is_above(&setup, &label, retried, other).await;
        }
    }
}

/// The mutex, the writer and `with_locks` of one name share the key's fencing counter without
/// excluding each other. A grant of one of them retried with its token (its first attempt
/// unacknowledged) must not answer the counter, which another of them may have taken since:
/// two holders would carry one token (helper 27, from reading the scripts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_exclusive_grant_gets_a_token_of_its_own() {
    for kind in ServerKind::ALL {
        let setup = Replicated::start(kind, 2);
        let client = connect(&setup).await;
        let acknowledged = LockOptions::new().namespace("exclusive-retry");
        let unacknowledged = acknowledged.clone().replica_acknowledgement(false);
        let mutex = client.lock_with::<str>(acknowledged.clone()).expect("opts");
        let other_mutex = client
            .lock_with::<str>(unacknowledged.clone())
            .expect("opts");
        let writers = client.rw_lock_with::<str>(acknowledged).expect("opts");
        let other_writers = client.rw_lock_with::<str>(unacknowledged).expect("opts");
        let token = || async { sage_lock::current_lease().map(|l| l.fencing_token()) };
        // Both replicas seen.
        mutex
            .with_lock("warm", Duration::from_secs(2), token())
            .await
            .expect("both replicas attached");
        detach_one(&setup);
        for primitive in ["mutex", "writer", "several keys"] {
            let key = format!("k-{}", primitive.replace(' ', "-"));
            let retried = {
                let (mutex, writers, key) = (mutex.clone(), writers.clone(), key.clone());
                tokio::spawn(async move {
                    let wait = Duration::from_secs(4);
                    match primitive {
                        "mutex" => mutex.with_lock(key.as_str(), wait, token()).await,
                        "writer" => writers.write(key.as_str(), wait, token()).await,
                        _ => {
                            let body = async {
                                sage_lock::current_lease()
                                    .and_then(|l| l.fencing_token_of(key.as_str()))
                            };
                            mutex
                                .with_locks(&[key.as_str(), "another-key"], wait, body)
                                .await
                        }
                    }
                })
            };
            // The first grant is in, unacknowledged; the other primitive of the same name
            // (which does not exclude it) is granted meanwhile.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let wait = Duration::from_secs(1);
            let other = if primitive == "writer" {
                other_mutex.with_lock(key.as_str(), wait, token()).await
            } else {
                other_writers.write(key.as_str(), wait, token()).await
            };
            let other = other.expect("the other holder, without acknowledgement");
            let label = format!("{} {primitive}", kind.name());
            assert_retried_grant_is_above(&setup, &label, retried, other).await;
        }
    }
}
