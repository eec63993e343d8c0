//! Issue 8, defect 2: a MOVED or ASK redirection must not split the replicated pipeline
//! (`ROLE`, `EVALSHA`, `WAIT`). With stale routing the pipeline goes to the slot's old owner; if
//! fred followed the script's redirection, the script would run on the new owner while `ROLE`
//! and `WAIT` ran on the old one, whose replicas "acknowledge" a write they never saw.
//!
//! Each test warms a client's routing, moves the lock's slot to another primary behind the
//! client's back (MOVED: a finished migration; ASK: the slot still MIGRATING with the keys
//! already on the target) and, where it matters, SIGSTOPs the new owner's only replica: then no
//! replica of the node that really runs the script can acknowledge it, so nothing may be
//! reported as acknowledged. `INFO commandstats` deltas show which node ran what.

mod common;

use std::time::{Duration, Instant};

use harness::{Cluster, Server, ServerKind};
use sage_lock::{LockClient, LockError, LockOptions, Locks, LossReason, TimeoutReason};

/// `calls` of `WAIT`, `ROLE` and `EVALSHA` on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Calls {
    wait: u64,
    role: u64,
    evalsha: u64,
}

impl Calls {
    fn of(node: &Server) -> Calls {
        let calls = |c| harness::commandstats_calls(node.port(), c);
        Calls {
            wait: calls("wait"),
            role: calls("role"),
            evalsha: calls("evalsha") + calls("eval"),
        }
    }

    fn since(self, before: Calls) -> Calls {
        Calls {
            wait: self.wait - before.wait,
            role: self.role - before.role,
            evalsha: self.evalsha - before.evalsha,
        }
    }
}

/// One lock's slot, its owner, another primary to move it to, and that primary's replica.
struct Move<'c> {
    slot: u16,
    source: &'c Server,
    target: &'c Server,
    target_replica: &'c Server,
}

impl<'c> Move<'c> {
    fn plan(cluster: &'c Cluster, namespace: &str, key: &str) -> Move<'c> {
        let slot = harness::key_slot(&LockClient::server_key(namespace, key));
        let source = cluster.primary_for_slot(slot);
        // fred refreshes its routing after MOVED from the first configured node that answers,
        // in port order (all six are in the URL): a SIGSTOPped replica there would stall the
        // refresh for the command timeout. Pause only a replica that is not the lowest port.
        let lowest = cluster.nodes.iter().map(Server::port).min();
        let (target, target_replica) = cluster
            .nodes
            .iter()
            .take(3)
            .filter(|n| n.port() != source.port())
            .map(|n| (n, cluster.replica_of(n.port())))
            .find(|(_, replica)| Some(replica.port()) != lowest)
            .expect("another primary whose replica is not the lowest port");
        Move {
            slot,
            source,
            target,
            target_replica,
        }
    }

    /// `SETSLOT IMPORTING`/`MIGRATING`, then `MIGRATE` every key of the slot: after this the
    /// source answers ASK for the slot's keys.
    fn start(&self, cluster: &Cluster) {
        cluster.mark_slot_migrating(self.slot, self.source, self.target);
        cluster.move_slot_keys(self.slot, self.source, self.target);
    }

    /// `SETSLOT NODE target` on every node: after this the source answers MOVED.
    fn finish(&self, cluster: &Cluster) {
        cluster.assign_slot(self.slot, self.source, self.target);
        let moved = harness::wait_until(Duration::from_secs(10), || {
            for node in cluster.nodes.iter() {
                let view = harness::cluster_nodes(node.port())?;
                let owner = harness::slot_owner(&view, self.slot).map(|n| n.port);
                if owner != Some(self.target.port()) {
                    return Err(format!("node {} sees {owner:?}", node.port()));
                }
            }
            Ok(())
        });
        moved.expect("every node sees the slot's new owner");
    }

    fn describe(&self) -> String {
        format!(
            "slot {} from {} to {} (replica {})",
            self.slot,
            self.source.port(),
            self.target.port(),
            self.target_replica.port()
        )
    }
}

/// Waits until `replica` reports its primary link up again after a SIGCONT.
fn wait_link_up(replica: &Server) {
    let up = harness::wait_until(Duration::from_secs(20), || {
        match replica.info_field("replication", "master_link_status") {
            Some(status) if status == "up" => Ok(()),
            other => Err(format!("master_link_status={other:?}")),
        }
    });
    up.expect("the replica reconnects after SIGCONT");
}

async fn client_and_locks(
    cluster: &Cluster,
    namespace: &str,
    lease: Duration,
) -> (LockClient, Locks<str>) {
    let client = LockClient::connect(&cluster.url()).await.expect("connect");
    let locks = client
        .lock_with(LockOptions::new().namespace(namespace).lease(lease))
        .expect("options");
    (client, locks)
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// The shared connection still answers (an `ASK` followed by fred with one write attempt ended
/// its connection task: every later command hung).
async fn shared_connection_answers(client: &LockClient) -> bool {
    use sage_lock::fred::interfaces::ClientLike;
    let ping = client.fred().ping::<String>(None);
    matches!(
        tokio::time::timeout(Duration::from_secs(2), ping).await,
        Ok(Ok(_))
    )
}

/// MOVED: the slot moved for good while the client's routing still names the old owner. With
/// the new owner's only replica paused the grant cannot be acknowledged: the acquisition must
/// time out as not acknowledged. After SIGCONT it is granted, with `ROLE` and `WAIT` on the new
/// owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_acquisition_is_checked_on_the_new_owner() {
    init_tracing();
    for kind in ServerKind::ALL {
        let cluster = Cluster::start(kind);
        let (client, locks) = client_and_locks(&cluster, "moved", Duration::from_secs(5)).await;
        // Warm routing (and a dedicated connection that keeps it) for the lock's slot.
        locks
            .with_lock("k", Duration::from_secs(5), async {})
            .await
            .expect("warm-up acquisition");
        let plan = Move::plan(&cluster, "moved", "k");
        plan.start(&cluster);
        plan.finish(&cluster);
        let (source_before, target_before) = (Calls::of(plan.source), Calls::of(plan.target));
        plan.target_replica.pause();
        let started = Instant::now();
        let result = locks.with_lock("k", Duration::from_secs(2), async {}).await;
        let took = started.elapsed();
        plan.target_replica.resume();
        let (source, target) = (
            Calls::of(plan.source).since(source_before),
            Calls::of(plan.target).since(target_before),
        );
        println!(
            "{kind} MOVED, {}, target's replica paused: {result:?} after {took:?}; \
             calls on the old owner {source:?}, on the new owner {target:?}",
            plan.describe()
        );
        assert!(
            matches!(
                &result,
                Err(LockError::TimedOut {
                    reason: TimeoutReason::NotAcknowledged { .. },
                    ..
                })
            ),
            "{kind}: with the new owner's only replica paused the grant cannot be \
             acknowledged, got {result:?} (calls on the old owner {source:?}, on the new owner \
             {target:?})"
        );
        assert_eq!(source.evalsha, 0, "{kind}: the old owner ran no script");
        assert!(
            target.evalsha > 0 && target.wait > 0 && target.role > 0,
            "{kind}: the script, ROLE and WAIT ran on the new owner: {target:?}"
        );
        wait_link_up(plan.target_replica);

        let (source_before, target_before) = (Calls::of(plan.source), Calls::of(plan.target));
        let value = locks
            .with_lock("k", Duration::from_secs(10), async { 7 })
            .await;
        let (source, target) = (
            Calls::of(plan.source).since(source_before),
            Calls::of(plan.target).since(target_before),
        );
        println!(
            "{kind} MOVED, replica back: {value:?}; old owner {source:?}, new owner {target:?}"
        );
        assert_eq!(
            value.ok(),
            Some(7),
            "{kind}: granted once the replica is back"
        );
        assert!(
            target.wait > 0 && target.role > 0 && source.wait == 0,
            "{kind}: ROLE and WAIT ran on the new owner only: {source:?} {target:?}"
        );
        assert!(
            shared_connection_answers(&client).await,
            "{kind}: shared connection"
        );
    }
}

/// ASK: the slot is still MIGRATING and the lock's keys already live on the importing node.
/// No grant may be reported on the old owner's word (the importing node's only replica is
/// paused, so nothing can be acknowledged); the client keeps working, and an acquisition that
/// waits across the end of the migration is granted by the new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_acquisition_waits_for_the_migration() {
    init_tracing();
    for kind in ServerKind::ALL {
        let cluster = Cluster::start(kind);
        let (client, locks) = client_and_locks(&cluster, "asked", Duration::from_secs(5)).await;
        locks
            .with_lock("k", Duration::from_secs(5), async {})
            .await
            .expect("warm-up acquisition");
        let plan = Move::plan(&cluster, "asked", "k");
        plan.start(&cluster);
        let (source_before, target_before) = (Calls::of(plan.source), Calls::of(plan.target));
        plan.target_replica.pause();
        let result = locks.with_lock("k", Duration::from_secs(2), async {}).await;
        plan.target_replica.resume();
        let (source, target) = (
            Calls::of(plan.source).since(source_before),
            Calls::of(plan.target).since(target_before),
        );
        println!(
            "{kind} ASK, {}, target's replica paused: {result:?}; calls on the old owner \
             {source:?}, on the new owner {target:?}",
            plan.describe()
        );
        assert!(
            matches!(&result, Err(LockError::TimedOut { .. })),
            "{kind}: no grant while the slot migrates and nothing can be acknowledged: {result:?}"
        );
        assert!(
            shared_connection_answers(&client).await,
            "{kind}: shared connection after ASK"
        );
        wait_link_up(plan.target_replica);
        let waiting = tokio::spawn({
            let locks = locks.clone();
            async move {
                let started = Instant::now();
                let value = locks
                    .with_lock("k", Duration::from_secs(15), async { 7 })
                    .await;
                (value, started.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let target_before = Calls::of(plan.target);
        plan.finish(&cluster);
        let (value, took) = waiting.await.expect("task");
        let target = Calls::of(plan.target).since(target_before);
        println!(
            "{kind} ASK then migration finished: {value:?} after {took:?}; new owner {target:?}"
        );
        assert_eq!(value.ok(), Some(7), "{kind}: granted after the migration");
        assert!(
            target.evalsha > 0 && target.wait > 0 && target.role > 0,
            "{kind}: granted with ROLE and WAIT on the new owner: {target:?}"
        );
        assert!(
            shared_connection_answers(&client).await,
            "{kind}: shared connection"
        );
    }
}

/// Renewals go through the same checked path: a lock held across a slot move whose new owner
/// cannot get the extension acknowledged must be lost, not kept on a foreign node's word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_renewal_is_checked_on_the_new_owner() {
    for kind in ServerKind::ALL {
        let cluster = Cluster::start(kind);
        let lease = Duration::from_millis(1500);
        let (client, locks) = client_and_locks(&cluster, "renewed", lease).await;
        let plan = Move::plan(&cluster, "renewed", "k");
        let mut paused_at = None;
        let result = locks
            .with_lock("k", Duration::from_secs(5), async {
                // A renewal or two on the old owner, so the renewer's connection is warm.
                tokio::time::sleep(Duration::from_millis(1200)).await;
                plan.start(&cluster);
                plan.finish(&cluster);
                plan.target_replica.pause();
                paused_at = Some(Instant::now());
                tokio::time::sleep(Duration::from_secs(6)).await;
            })
            .await;
        let detected = paused_at.map(|t| t.elapsed()).unwrap_or_default();
        plan.target_replica.resume();
        println!(
            "{kind} renewal across {}: {result:?} after {detected:?}",
            plan.describe()
        );
        match &result {
            Err(LockError::LockLost {
                reason: LossReason::NotAcknowledged { .. } | LossReason::RenewalFailed(_),
                ..
            }) => {}
            other => panic!(
                "{kind}: renewals on the new owner cannot be acknowledged with its replica \
                 paused; the lock must be lost, got {other:?}"
            ),
        }
        assert!(
            detected < Duration::from_secs(5),
            "{kind}: the loss is reported within the lease: {detected:?}"
        );
        wait_link_up(plan.target_replica);
        let value = locks
            .with_lock("k", Duration::from_secs(10), async { 1 })
            .await;
        assert_eq!(
            value.ok(),
            Some(1),
            "{kind}: granted on the new owner afterwards"
        );
        assert!(
            shared_connection_answers(&client).await,
            "{kind}: shared connection"
        );
    }
}

/// A release while the lock's slot is migrating and its keys already moved (ASK) fails (the
/// lock expires with its lease), but the shared connection keeps working and the lock is
/// granted again once the migration ends. (With fred following redirections itself and one
/// write attempt per command, the `ASK` ended the shared connection's task: every later
/// command on it hung.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_release_keeps_the_shared_connection() {
    init_tracing();
    for kind in ServerKind::ALL {
        let cluster = Cluster::start(kind);
        let lease = Duration::from_secs(2);
        let (client, locks) = client_and_locks(&cluster, "released", lease).await;
        let plan = Move::plan(&cluster, "released", "k");
        let result = locks
            .with_lock("k", Duration::from_secs(5), async { plan.start(&cluster) })
            .await;
        let answers = shared_connection_answers(&client).await;
        println!(
            "{kind} release during {}: {result:?}; shared connection answers: {answers}",
            plan.describe()
        );
        assert!(result.is_ok(), "{kind}: {result:?}");
        assert!(
            answers,
            "{kind}: the shared connection answers after an ASK"
        );
        plan.finish(&cluster);
        let value = locks
            .with_lock("k", Duration::from_secs(10), async { 2 })
            .await;
        assert_eq!(value.ok(), Some(2), "{kind}: granted on the new owner");
        assert!(
            shared_connection_answers(&client).await,
            "{kind}: shared connection"
        );
    }
}

/// A waited key's slot moves to another primary (the old owner drops the shard channel's
/// subscribers with an `SUNSUBSCRIBE` that fred does not pass on): the next hand-offs still
/// come by release notification within a few round trips, not by the 500 ms poll. Before,
/// every hand-off took the poll (about 400 ms) for as long as the key stayed busy: the client
/// took the channel for subscribed until it went idle (an audit's finding, mutex, semaphore
/// and `with_locks` alike, after a CLUSTER FAILOVER too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notifications_survive_a_slot_move() {
    for kind in ServerKind::ALL {
        let cluster = Cluster::start(kind);
        let ns = format!("slot-move-notify-{}", rand::random::<u32>());
        let options = || LockOptions::new().namespace(ns.as_str());
        let a = LockClient::connect(&cluster.url()).await.expect("connect");
        let b = LockClient::connect(&cluster.url()).await.expect("connect");
        let (la, lb): (Locks<str>, Locks<str>) = (
            a.lock_with(options()).expect("opts"),
            b.lock_with(options()).expect("opts"),
        );
        let before = common::handoff_gap(&la, &lb, "hot").await;
        let slot = harness::key_slot(&LockClient::server_key(&ns, "hot"));
        let source = cluster.primary_for_slot(slot);
        let target = cluster
            .nodes
            .iter()
            .take(3)
            .find(|n| n.port() != source.port())
            .expect("another primary");
        cluster.mark_slot_migrating(slot, source, target);
        cluster.move_slot_keys(slot, source, target);
        cluster.assign_slot(slot, source, target);
        let mut after = Vec::new();
        for _ in 0..6 {
            after.push(common::handoff_gap(&la, &lb, "hot").await);
        }
        println!("{kind}: hand-off {before:?} before the slot moved, then {after:?}");
        // The first may take the poll (its notification was lost); the rest may not.
        let slow = after[2..]
            .iter()
            .filter(|gap| **gap > Duration::from_millis(150))
            .count();
        assert!(
            slow <= 1,
            "{kind}: hand-offs after the slot moved took the poll: {after:?}"
        );
        a.quit().await;
        b.quit().await;
    }
}
