//! Operator tools against standalone servers and a cluster, Redis and Valkey: `is_locked`,
//! `holder` (fencing token, lease left, time held), `force_unlock` (the holder loses its lock)
//! and `scan` (every shard, glob characters in the namespace escaped).

mod common;

use std::time::Duration;

use common::{Target, raw_exists};
use harness::ServerKind;
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
        let mut holders = Vec::new();
        let mut expected = Vec::new();
        for key in &keys {
            let (token, release, task) = hold(&locks, key).await;
            expected.push((key.clone(), token));
            holders.push((release, task));
        }
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
