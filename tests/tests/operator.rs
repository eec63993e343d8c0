//! Operator tools against standalone servers and a cluster, Redis and Valkey: `is_locked`,
//! `holder` (fencing token, lease left, time held), `force_unlock` (the holder loses its lock)
//! and `scan` (every shard, glob characters in the namespace escaped).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Target, raw_exists};
use harness::{Cluster, ServerKind};
use sage_lock::{LockClient, LockError, LockOptions, Locks, LossReason, current_lease};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::instrument::WithSubscriber;

fn cluster(kind: ServerKind) -> Target {
    Target {
        kind,
        url: harness::shared_cluster(kind).url(),
        replicated: false,
        label: "cluster",
        resp3: false,
    }
}

fn targets() -> Vec<Target> {
    ServerKind::ALL
        .into_iter()
        .flat_map(|kind| [Target::standalone(kind), cluster(kind)])
        .collect()
}

fn family(client: &LockClient, namespace: &str, lease: Duration) -> Locks<str> {
    client
        .lock_with::<str>(
            LockOptions::new()
                .namespace(namespace)
                .lease(lease)
                .replica_acknowledgement(false),
        )
        .expect("valid options")
}

/// A holder task: holds `key` until the sender fires; reports its fencing token first, and its
/// outcome when joined.
async fn hold(
    locks: &Locks<str>,
    key: &str,
) -> (u64, oneshot::Sender<()>, JoinHandle<Result<(), LockError>>) {
    let (token_tx, token_rx) = oneshot::channel();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let (locks, key) = (locks.clone(), key.to_owned());
    let task = tokio::spawn(async move {
        locks
            .with_lock(&key, Duration::from_secs(5), async move {
                let token = current_lease().expect("lease").fencing_token();
                let _ = token_tx.send(token);
                let _ = release_rx.await;
            })
            .await
    });
    let token = token_rx.await.expect("the holder acquired");
    (token, release_tx, task)
}

/// [`hold`] for each of `keys`: each key with its fencing token, and each hold's release and task.
async fn hold_all(
    locks: &Locks<str>,
    keys: &[String],
) -> (
    Vec<(String, u64)>,
    Vec<(oneshot::Sender<()>, JoinHandle<Result<(), LockError>>)>,
) {
    let mut tokens = Vec::new();
    let mut holders = Vec::new();
    for key in keys {
        let (token, release, task) = hold(locks, key).await;
        tokens.push((key.clone(), token));
        holders.push((release, task));
    }
    (tokens, holders)
}

/// Joins a [`hold`] task whose lock was force-unlocked: within 3 s (its next renewal) its body
/// is cancelled with `LockLost(NotOwner)`.
async fn lost_as_not_owner(name: &str, task: JoinHandle<Result<(), LockError>>) {
    let outcome = tokio::time::timeout(Duration::from_secs(3), task)
        .await
        .expect("the holder noticed in time")
        .expect("holder task");
    assert!(
        matches!(
            outcome,
            Err(LockError::LockLost {
                reason: LossReason::NotOwner,
                ..
            })
        ),
        "{name}: {outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_locked_and_holder() {
    for target in targets() {
        let name = format!("{} {}", target.kind.name(), target.label);
        let client = target.client().await;
        let locks = family(&client, &target.ns("holder"), Duration::from_secs(10));
        assert!(!locks.is_locked("k").await.expect("is_locked"), "{name}");
        assert_eq!(locks.holder("k").await.expect("holder"), None, "{name}");
        let (token, release, task) = hold(&locks, "k").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(locks.is_locked("k").await.expect("is_locked"), "{name}");
        let holder = locks.holder("k").await.expect("holder").expect("held");
        assert_eq!(holder.fencing_token, token, "{name}");
        let remaining = holder.remaining.expect("a TTL");
        assert!(
            remaining > Duration::from_secs(5) && remaining <= Duration::from_secs(10),
            "{name}: {remaining:?}"
        );
        let held_for = holder.held_for.expect("known");
        assert!(
            held_for >= Duration::from_millis(250) && held_for < Duration::from_secs(5),
            "{name}: {held_for:?}"
        );
        let _ = release.send(());
        task.await.expect("holder").expect("held and released");
        assert!(!locks.is_locked("k").await.expect("is_locked"), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_takes_the_lock_from_its_holder() {
    for target in targets() {
        let name = format!("{} {}", target.kind.name(), target.label);
        let client = target.client().await;
        let ns = target.ns("force");
        let locks = family(&client, &ns, Duration::from_millis(600));
        let refused = locks.force_unlock_by("k", " ").await;
        assert!(
            matches!(
                refused,
                Err(LockError::InvalidArgument { argument: "by", .. })
            ),
            "{name}: {refused:?}"
        );
        assert!(
            !locks.force_unlock_by("k", "test").await.expect("free"),
            "{name}"
        );
        let (_token, _release, task) = hold(&locks, "k").await;
        assert!(
            locks
                .force_unlock_by("k", "the operator test")
                .await
                .expect("force"),
            "{name}"
        );
        assert!(
            !raw_exists(&client, &LockClient::server_key(&ns, "k")).await,
            "{name}"
        );
        // The holder finds out at its next renewal: its body is cancelled.
        lost_as_not_owner(&name, task).await;
        // And the lock is free for others.
        assert_eq!(
            locks.try_with_lock("k", async { 1 }).await.expect("try"),
            Some(1)
        );
        // The SPEC's shape, naming nobody, does the same.
        let (_token, _release, task) = hold(&locks, "k").await;
        assert!(locks.force_unlock("k").await.expect("force"), "{name}");
        assert!(!locks.is_locked("k").await.expect("is_locked"), "{name}");
        lost_as_not_owner(&name, task).await;
        assert!(!locks.force_unlock("k").await.expect("free"), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_lists_the_held_locks_of_one_namespace() {
    for target in targets() {
        let name = format!("{} {}", target.kind.name(), target.label);
        let client = target.client().await;
        let base = target.ns("scan");
        // A glob character in the namespace: unescaped, `{base*:*}` would match `other`'s keys.
        let ns = format!("{base}*");
        let locks = family(&client, &ns, Duration::from_secs(10));
        let other = family(&client, &format!("{base}Q"), Duration::from_secs(10));
        let mut keys: Vec<String> = (0..12).map(|i| format!("job:{i}")).collect();
        keys.extend(["a*b", "x{y}z", "per%cent", "q?[x]"].map(String::from));
        let (mut expected, holders) = hold_all(&locks, &keys).await;
        let (_, other_release, other_task) = hold(&other, "job:0").await;
        locks
            .try_with_lock("released", async {})
            .await
            .expect("a released lock is not listed");
        let mut found: Vec<(String, u64)> = locks
            .scan()
            .await
            .expect("scan")
            .into_iter()
            .map(|held| {
                assert!(held.holder.remaining.is_some(), "{name}");
                assert_eq!(held.key.as_bytes(), held.key_bytes.as_slice());
                (held.key, held.holder.fencing_token)
            })
            .collect();
        found.sort();
        expected.sort();
        assert_eq!(found, expected, "{name}");
        for (release, task) in holders {
            let _ = release.send(());
            task.await.expect("holder").expect("held");
        }
        let _ = other_release.send(());
        other_task.await.expect("holder").expect("held");
        assert!(locks.scan().await.expect("scan").is_empty(), "{name}");
    }
}

/// A lock's server key holding another type (set by hand or by another program: no primitive
/// writes anything but a string there, the others use keys of their own) is refused with the
/// type and how to look at it, not "inspect it with the tool of that primitive" (there is none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_refuse_a_key_of_another_type_and_say_how_to_look_at_it() {
    let kind = ServerKind::Redis;
    let client = Target::standalone(kind).client().await;
    let namespace = "operator-by-hand";
    let locks = family(&client, namespace, Duration::from_secs(5));
    let port = harness::shared(kind).port();
    harness::cmd_ok(port, &["HSET", "{operator-by-hand:by-hand}", "f", "v"]);
    let refused = locks.holder("by-hand").await;
    let Err(LockError::InvalidArgument { argument, message }) = refused else {
        panic!("holder of a hash: {refused:?}");
    };
    println!("{message}");
    assert_eq!(argument, "key");
    assert!(
        message.contains("hash") && message.contains("redis-cli") && !message.contains("tool of"),
        "{message}"
    );
    // `is_locked` reads the same reply: it refuses the hash as `holder` does, rather than
    // calling it locked (audit 38, defect 3).
    let refused = locks.is_locked("by-hand").await;
    let Err(LockError::InvalidArgument { argument, message }) = refused else {
        panic!("is_locked of a hash: {refused:?}");
    };
    assert_eq!(argument, "key");
    assert!(message.contains("hash"), "{message}");
    // `scan` (the `locks list` tool) lists the held locks and says which key it skipped, and
    // why, rather than leaving it out silently.
    let (_, release, holder) = hold(&locks, "held-beside").await;
    let captured = harness::Captured::default();
    let listed = locks
        .scan()
        .with_subscriber(captured.warn_subscriber())
        .await
        .expect("scan");
    let keys: Vec<&str> = listed.iter().map(|held| held.key.as_str()).collect();
    assert_eq!(keys, ["held-beside"]);
    let logged = captured.text();
    println!("{logged}");
    assert!(
        logged.contains("by-hand") && logged.contains("hash") && logged.contains("TYPE"),
        "scan skipped the hash without a word: {logged:?}"
    );
    drop(release);
    holder.await.expect("holder task").expect("held");
    harness::cmd_ok(port, &["DEL", "{operator-by-hand:by-hand}"]);
    client.quit().await;
}

/// A body that ends before the holder's next renewal, after its lock was force-unlocked (or
/// lost otherwise), still returns its output, but the release that finds the lock no longer
/// its owner's says so: a `WARN` naming the key, and the loss counted in `losses` (not in
/// `releases`). Before, only a `DEBUG` line said so and the stats counted a release (an audit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_found_by_the_release_is_warned_and_counted() {
    for target in targets() {
        let name = format!("{} {}", target.kind.name(), target.label);
        let client = target.client().await;
        let locks = family(
            &client,
            &target.ns("found-at-release"),
            Duration::from_secs(10),
        );
        for key in ["uncontended", "taken-over"] {
            let before = client.stats();
            let captured = harness::Captured::default();
            let operator = locks.clone();
            let intruder = locks.clone();
            let output = locks
                .with_lock(key, Duration::from_secs(2), async move {
                    assert!(
                        operator
                            .force_unlock_by(key, "the test")
                            .await
                            .expect("force")
                    );
                    if key == "taken-over" {
                        // Another owner takes the lock before this body ends.
                        let taken = intruder.try_with_lock(key, async {}).await;
                        assert!(matches!(taken, Ok(Some(()))), "{taken:?}");
                    }
                    7
                })
                .with_subscriber(captured.warn_subscriber())
                .await;
            assert!(matches!(output, Ok(7)), "{name} {key}: {output:?}");
            let after = client.stats();
            let logged = captured.text();
            println!("{name} {key}: {logged}");
            let warned = logged
                .lines()
                .find(|line| line.contains("no longer"))
                .unwrap_or_default();
            assert!(
                warned.contains("WARN") && warned.contains(key),
                "{name} {key}: {logged:?}"
            );
            assert_eq!(after.losses, before.losses + 1, "{name} {key}: {after:?}");
            let others = u64::from(key == "taken-over");
            assert_eq!(
                after.releases,
                before.releases + others,
                "{name} {key}: {after:?}"
            );
        }
        client.quit().await;
    }
}

/// The cluster tests below move slots, so each starts a cluster of its own.
async fn cluster_client(cluster: &Cluster) -> LockClient {
    LockClient::connect(&cluster.url()).await.expect("connect")
}

/// A key of `namespace` whose lock lives in hash slot `slot`.
fn key_in_slot(namespace: &str, slot: u16) -> String {
    (0..1_000_000)
        .map(|i| format!("in-slot-{slot}:{i}"))
        .find(|key| harness::key_slot(&LockClient::server_key(namespace, key.as_str())) == slot)
        .expect("a key for every slot")
}

/// Audit 38, defect 1: `scan` routed each primary's `SCAN` by one slot picked from the routing
/// it read before the loop. When the routing is refreshed during the scan (a `MOVED` met by a
/// per-key read) after that slot moved, the `SCAN` meant for its old owner went to the new one:
/// that shard was scanned twice and the old owner never (the audit: 42 of 60 locks listed, no
/// error). Here the slot picked for the primary scanned last moves to the one scanned first,
/// behind the operator client's back, with a lock in it: every held lock must still be listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_lists_every_shard_after_a_slot_moves() {
    for kind in ServerKind::ALL {
        let cluster = Cluster::start(kind);
        let holders_client = cluster_client(&cluster).await;
        // Connected (its routing read) before the move, and used for nothing else.
        let operator_client = cluster_client(&cluster).await;
        let ns = "scan-moved";
        let locks = family(&holders_client, ns, Duration::from_secs(30));
        let operator = family(&operator_client, ns, Duration::from_secs(30));
        // The initial primaries, in the order the scan visits them (by "host:port"), and the
        // slot it picked for each: the first of its range.
        let mut primaries: Vec<(String, usize, u16)> = [0_u16, 5461, 10923]
            .into_iter()
            .enumerate()
            .map(|(index, start)| {
                let port = cluster.nodes[index].port();
                (format!("127.0.0.1:{port}"), index, start)
            })
            .collect();
        primaries.sort();
        let (_, first, _) = primaries[0];
        let (_, last, moved_slot) = primaries[2];
        let mut keys: Vec<String> = (0..60).map(|i| format!("job:{i}")).collect();
        keys.push(key_in_slot(ns, moved_slot));
        let (mut expected, holders) = hold_all(&locks, &keys).await;
        let (source, target) = (&cluster.nodes[last], &cluster.nodes[first]);
        cluster.mark_slot_migrating(moved_slot, source, target);
        cluster.move_slot_keys(moved_slot, source, target);
        cluster.assign_slot(moved_slot, source, target);
        let started = Instant::now();
        let listed = operator.scan().await.expect("scan");
        let took = started.elapsed();
        let mut found: Vec<(String, u64)> = listed
            .into_iter()
            .map(|held| (held.key, held.holder.fencing_token))
            .collect();
        found.sort();
        expected.sort();
        println!(
            "{kind}: slot {moved_slot} moved from {} to {}; scan listed {} of {} held locks in \
             {took:?}",
            source.port(),
            target.port(),
            found.len(),
            expected.len()
        );
        assert_eq!(found, expected, "{kind}");
        for (release, task) in holders {
            let _ = release.send(());
            task.await.expect("holder").expect("held");
        }
        operator_client.quit().await;
        holders_client.quit().await;
    }
}

/// Starts moving the slot of `key`'s lock to another primary, with the lock's key alone moved
/// (`partial`: the old owner answers `TRYAGAIN` to a script naming the lock's keys) or all of
/// its keys (the old owner answers `ASK`); a thread ends the move after `after`.
fn migrate_meanwhile(
    cluster: &Arc<Cluster>,
    namespace: &str,
    key: &str,
    partial: bool,
    after: Duration,
) -> std::thread::JoinHandle<()> {
    let server_key = LockClient::server_key(namespace, key);
    let slot = harness::key_slot(&server_key);
    let source_port = cluster.primary_for_slot(slot).port();
    let source = cluster
        .nodes
        .iter()
        .position(|node| node.port() == source_port)
        .expect("the source is a node");
    let target = (0..3).find(|&i| i != source).expect("another primary");
    cluster.mark_slot_migrating(slot, &cluster.nodes[source], &cluster.nodes[target]);
    if partial {
        let key = String::from_utf8(server_key).expect("a UTF-8 key");
        let port = cluster.nodes[target].port().to_string();
        let args = ["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", &key];
        cluster.nodes[source].cmd_ok(&args);
    } else {
        cluster.move_slot_keys(slot, &cluster.nodes[source], &cluster.nodes[target]);
    }
    let cluster = Arc::clone(cluster);
    std::thread::spawn(move || {
        std::thread::sleep(after);
        let (source, target) = (&cluster.nodes[source], &cluster.nodes[target]);
        cluster.move_slot_keys(slot, source, target);
        cluster.assign_slot(slot, source, target);
    })
}

/// Audit 38, defect 2: the operator calls read a lock with a script that was not retried, so a
/// slot being migrated made them fail at once (`TRYAGAIN`, or an error saying "retrying until
/// the migration ends" although nothing retried), and one migrating lock failed a whole
/// `scan`. Each call here runs while its lock's slot migrates (ended 300 ms later): it must
/// answer as if nothing moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_calls_wait_for_a_slot_migration() {
    let after = Duration::from_millis(300);
    for kind in ServerKind::ALL {
        let cluster = Arc::new(Cluster::start(kind));
        let client = cluster_client(&cluster).await;
        let ns = "operator-migrating";
        let locks = family(&client, ns, Duration::from_secs(30));
        for (key, partial) in [
            ("holder", true),
            ("is-locked", false),
            ("scan", false),
            ("force", true),
        ] {
            let name = format!(
                "{kind} {key} ({})",
                if partial { "TRYAGAIN" } else { "ASK" }
            );
            let (token, release, task) = hold(&locks, key).await;
            let finisher = migrate_meanwhile(&cluster, ns, key, partial, after);
            let started = Instant::now();
            let answer = match key {
                "holder" => locks
                    .holder(key)
                    .await
                    .map(|holder| format!("{:?}", holder.map(|h| h.fencing_token))),
                "is-locked" => locks.is_locked(key).await.map(|held| format!("{held}")),
                "scan" => locks.scan().await.map(|listed| {
                    let found: Vec<_> = listed
                        .into_iter()
                        .map(|held| (held.key, held.holder.fencing_token))
                        .collect();
                    format!("{found:?}")
                }),
                _ => locks
                    .force_unlock(key)
                    .await
                    .map(|removed| format!("{removed}")),
            };
            let took = started.elapsed();
            finisher.join().expect("the migration ended");
            println!("{name}: {answer:?} after {took:?}");
            let expected = match key {
                "holder" => format!("{:?}", Some(token)),
                "scan" => format!("{:?}", [(key.to_owned(), token)]),
                _ => "true".to_owned(),
            };
            assert_eq!(
                answer.as_deref().ok(),
                Some(expected.as_str()),
                "{name}: {answer:?}"
            );
            if key == "force" {
                // Its holder finds out at its next renewal (a third of the 30 s lease away).
                assert!(!locks.is_locked(key).await.expect("is_locked"), "{name}");
                let _ = release.send(());
                let _ = task.await.expect("holder");
            } else {
                let _ = release.send(());
                task.await.expect("holder").expect("held");
            }
        }
        client.quit().await;
    }
}

/// A client for the holders of `cluster`, and one for the operator whose calls are bounded by
/// `bound` (its command timeout).
async fn holder_and_operator(cluster: &Cluster, bound: Duration) -> (LockClient, LockClient) {
    let holders = cluster_client(cluster).await;
    let operator = LockClient::builder()
        .url(&cluster.url())
        .command_timeout(bound)
        .connect()
        .await
        .expect("connect");
    (holders, operator)
}

/// A migration that outlasts an operator call's bound (the command timeout, 1 s here) ends the
/// call with the server's answer and the retrying it did, not a claim that it still retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_call_that_outlasts_a_migration_says_it_gave_up() {
    let bound = Duration::from_secs(1);
    for kind in ServerKind::ALL {
        let cluster = Arc::new(Cluster::start(kind));
        let (holders, operator_client) = holder_and_operator(&cluster, bound).await;
        let ns = "operator-gives-up";
        let locks = family(&holders, ns, Duration::from_secs(30));
        let operator = family(&operator_client, ns, Duration::from_secs(30));
        for (key, partial, server_said) in [
            ("holder", true, "TRYAGAIN"),
            ("is-locked", false, "being migrated"),
        ] {
            let name = format!("{kind} {key}");
            let (_, release, task) = hold(&locks, key).await;
            let finisher = migrate_meanwhile(&cluster, ns, key, partial, bound * 2);
            let started = Instant::now();
            let answer = if key == "holder" {
                operator.holder(key).await.map(|_| ())
            } else {
                operator.is_locked(key).await.map(|_| ())
            };
            let took = started.elapsed();
            finisher.join().expect("the migration ended");
            println!("{name}: {answer:?} after {took:?}");
            let text = format!("{answer:?}");
            assert!(
                matches!(answer, Err(LockError::Backend { .. }))
                    && text.contains(server_said)
                    && text.contains("gave up after"),
                "{name}: {text}"
            );
            assert!(
                took >= bound && took < bound + Duration::from_millis(500),
                "{name}: {took:?}"
            );
            let _ = release.send(());
            task.await.expect("holder").expect("held");
        }
        operator_client.quit().await;
        holders.quit().await;
    }
}

/// The held locks `scan` listed, as (key, fencing token), sorted.
fn listed_sorted(listed: Vec<sage_lock::HeldLock>) -> Vec<(String, u64)> {
    let mut found: Vec<(String, u64)> = listed
        .into_iter()
        .map(|held| (held.key, held.holder.fencing_token))
        .collect();
    found.sort();
    found
}

/// Index in `cluster.nodes` of the primary serving `key`'s lock in `namespace`.
fn owner_index(cluster: &Cluster, namespace: &str, key: &str) -> usize {
    let slot = harness::key_slot(&LockClient::server_key(namespace, key));
    let port = cluster.primary_for_slot(slot).port();
    (0..3)
        .find(|&i| cluster.nodes[i].port() == port)
        .expect("a primary")
}

/// Audit 47: `scan` (and `locks list`) silently left out held locks whose slot was migrating
/// while it ran: a lock whose keys moved from a primary not scanned yet to one already scanned
/// was seen by neither `SCAN` ("9945 locks held" of 10k, exit 0). Here the scan of the first
/// primary is held up by a lock whose slot migrates to it (its key moved, its `:fence` and
/// `:since` not yet); meanwhile another lock's slot moves from the last primary to the first,
/// then both migrations end. Every held lock must be listed exactly once. A migration that
/// outlasts the scan's bound (the command timeout) must end it with an error naming the slot,
/// never a shorter list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_never_leaves_out_a_lock_whose_slot_migrates() {
    let bound = Duration::from_secs(1);
    for kind in ServerKind::ALL {
        let cluster = Arc::new(Cluster::start(kind));
        let (holders_client, operator_client) = holder_and_operator(&cluster, bound).await;
        let ns = "scan-migrating";
        let locks = family(&holders_client, ns, Duration::from_secs(30));
        let operator = family(&operator_client, ns, Duration::from_secs(30));
        let keys: Vec<String> = (0..30).map(|i| format!("job:{i}")).collect();
        let (mut expected, holders) = hold_all(&locks, &keys).await;
        expected.sort();
        // The primaries in the order the scan visits them (fred's routing: by host, then port).
        let mut order: Vec<usize> = (0..3).collect();
        order.sort_by_key(|&i| cluster.nodes[i].port());
        let (first, last) = (order[0], order[2]);
        let slot_of = |key: &str| harness::key_slot(&LockClient::server_key(ns, key));
        let stalling = keys
            .iter()
            .find(|key| owner_index(&cluster, ns, key) != first)
            .expect("a lock off the first primary");
        let stalling_source = owner_index(&cluster, ns, stalling);
        let moving = keys
            .iter()
            .find(|key| owner_index(&cluster, ns, key) == last && slot_of(key) != slot_of(stalling))
            .expect("a lock on the last primary");
        let name = format!(
            "{kind}: slot {} of {moving} moved from {} to {} while slot {} of {stalling} \
             migrated from {} to it",
            slot_of(moving),
            cluster.nodes[last].port(),
            cluster.nodes[first].port(),
            slot_of(stalling),
            cluster.nodes[stalling_source].port(),
        );
        let (stalling_slot, moving_slot) = (slot_of(stalling), slot_of(moving));
        cluster.mark_slot_migrating(
            stalling_slot,
            &cluster.nodes[stalling_source],
            &cluster.nodes[first],
        );
        let server_key = LockClient::server_key(ns, stalling);
        let server_key = String::from_utf8(server_key).expect("a UTF-8 key");
        let port = cluster.nodes[first].port().to_string();
        let args = [
            "MIGRATE",
            "127.0.0.1",
            &port,
            "",
            "0",
            "5000",
            "KEYS",
            &server_key,
        ];
        cluster.nodes[stalling_source].cmd_ok(&args);
        let mover = {
            let cluster = Arc::clone(&cluster);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                let (source, target) = (&cluster.nodes[last], &cluster.nodes[first]);
                cluster.mark_slot_migrating(moving_slot, source, target);
                cluster.move_slot_keys(moving_slot, source, target);
                cluster.assign_slot(moving_slot, source, target);
                let source = &cluster.nodes[stalling_source];
                cluster.move_slot_keys(stalling_slot, source, target);
                cluster.assign_slot(stalling_slot, source, target);
            })
        };
        let started = Instant::now();
        let answer = operator.scan().await;
        let took = started.elapsed();
        mover.join().expect("the migrations ended");
        let found = listed_sorted(answer.expect("scan"));
        println!(
            "{name}: listed {} of {} after {took:?}",
            found.len(),
            expected.len()
        );
        assert_eq!(found, expected, "{name}: a lock left out or listed twice");

        // A migration that outlasts the bound (the lock's key moved, its other keys not).
        let outlasting = &keys[13];
        let slot = slot_of(outlasting);
        let finisher = migrate_meanwhile(&cluster, ns, outlasting, true, bound * 3);
        let started = Instant::now();
        let answer = operator.scan().await;
        let took = started.elapsed();
        finisher.join().expect("the migration ended");
        let name = format!(
            "{kind}: slot {slot} of {outlasting} migrating for {:?}",
            bound * 3
        );
        match answer {
            Ok(listed) => {
                let found = listed_sorted(listed);
                println!("{name}: listed {} after {took:?}", found.len());
                assert_eq!(found, expected, "{name}: a lock left out or listed twice");
            }
            Err(error) => {
                let text = error.to_string();
                println!("{name}: {text} after {took:?}");
                assert!(
                    matches!(error, LockError::Backend { .. })
                        && text.contains(&format!("slot {slot}")),
                    "{name}: the error names the migrating slot: {text}"
                );
            }
        }
        let found = listed_sorted(operator.scan().await.expect("scan after the migrations"));
        assert_eq!(found, expected, "{kind}: after the migrations");
        for (release, task) in holders {
            let _ = release.send(());
            task.await.expect("holder").expect("held");
        }
        operator_client.quit().await;
        holders_client.quit().await;
    }
}

/// The operator tools, called while the client's connection is down and cannot come back (the
/// server now requires a password the URL lacks), name why: the connection's last error, as
/// a lock call's `TimedOut(Unavailable)` does, not only fred's "Request timed out" after the
/// command timeout (audit 51).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_name_why_the_connection_is_down() {
    for kind in ServerKind::ALL {
        let server = harness::Server::start(kind);
        let client = LockClient::builder()
            .url(&server.url())
            .command_timeout(Duration::from_secs(1))
            .connect()
            .await
            .expect("connect");
        let locks = family(&client, "tools-down", Duration::from_secs(5));
        locks.scan().await.expect("scan before");
        let mut admin = harness::RawConn::connect(server.port()).expect("connect");
        admin
            .cmd(&["CONFIG", "SET", "requirepass", "sesame"])
            .expect("requirepass");
        admin
            .cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
            .expect("kill");
        // Its reconnections are refused from now on.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let scanned = locks.scan().await;
        let holder = locks.holder("k").await;
        println!("{kind}: {scanned:?}\n{holder:?}");
        for (tool, error) in [("scan", scanned.err()), ("holder", holder.err())] {
            let text = error.map(|error| error.to_string()).unwrap_or_default();
            assert!(
                text.contains("NOAUTH") || text.contains("password"),
                "{kind}: {tool}: {text}"
            );
        }
        admin
            .cmd(&["AUTH", "sesame"])
            .and_then(|_| admin.cmd(&["CONFIG", "SET", "requirepass", ""]))
            .expect("requirepass off");
        client.quit().await;
    }
}
