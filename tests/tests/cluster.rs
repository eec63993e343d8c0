//! A 3-primary cluster with one replica per primary: the behaviour suite through a
//! `redis-cluster://` URL, a `CLUSTER FAILOVER` while a lock is held, and a slot migration
//! (MOVED/ASK) under contention.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::Target;
use harness::{Cluster, ServerKind};
use sage_lock::{Deployment, LockClient, LockError, LockOptions, Locks};

fn target(kind: ServerKind) -> Target {
    Target {
        kind,
        url: harness::shared_cluster(kind).url(),
        replicated: false,
        label: "cluster",
    }
}

common::behaviour_suite!(target);
common::primitives::primitive_suite!(target);

/// Locks spread over all three shards, and each shard's lock key sits with its fencing counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_spread_over_shards() {
    for kind in ServerKind::ALL {
        let cluster = harness::shared_cluster(kind);
        let client = target(kind).client().await;
        assert_eq!(client.deployment(), Deployment::Cluster);
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("spread"))
            .expect("opts");
        let mut primaries = std::collections::BTreeSet::new();
        for i in 0..30 {
            let key = format!("k{i}");
            let server_key = LockClient::server_key("spread", key.as_str());
            primaries.insert(
                cluster
                    .primary_for_slot(harness::key_slot(&server_key))
                    .port(),
            );
            locks
                .with_lock(key.as_str(), Duration::from_secs(2), async {})
                .await
                .expect("lock");
        }
        assert_eq!(
            primaries.len(),
            3,
            "{}: 30 keys should hit all shards",
            kind.name()
        );
    }
}

/// `CLUSTER FAILOVER` on the replica of the lock's shard while the lock is held: `LockLost`;
/// afterwards the new primary grants the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_loses_held_lock() {
    for kind in ServerKind::ALL {
        let cluster = Cluster::start(kind);
        let client = LockClient::connect(&cluster.url()).await.expect("connect");
        let lease = Duration::from_secs(1);
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("cfail").lease(lease))
            .expect("opts");
        let slot = harness::key_slot(&LockClient::server_key("cfail", "k"));
        let primary = cluster.primary_for_slot(slot).port();
        let replica = cluster.replica_of(primary);
        let mut failover_at = None;
        let result = locks
            .with_lock("k", Duration::from_secs(5), async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                replica.cmd_ok(&["CLUSTER", "FAILOVER"]);
                failover_at = Some(Instant::now());
                tokio::time::sleep(Duration::from_secs(30)).await;
            })
            .await;
        let detected = failover_at.map(|t| t.elapsed()).unwrap_or_default();
        let Err(LockError::LockLost { ref reason, .. }) = result else {
            panic!(
                "{}: expected LockLost after CLUSTER FAILOVER, got {result:?}",
                kind.name()
            );
        };
        println!(
            "{}: cluster failover -> LockLost after {detected:?}: {reason}",
            kind.name()
        );
        assert!(
            detected < Duration::from_secs(10),
            "{}: took {detected:?}",
            kind.name()
        );
        let value = locks
            .with_lock("k", Duration::from_secs(20), async { 1 })
            .await;
        assert_eq!(value.expect("new primary grants the lock"), 1);
    }
}

/// Moving the lock's slot to another primary (MIGRATING/IMPORTING, MIGRATE, SETSLOT NODE) while
/// tasks contend for it: every acquisition succeeds, the count is exact, no body overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_migration_under_contention() {
    for kind in ServerKind::ALL {
        let cluster = Cluster::start(kind);
        let client = LockClient::connect(&cluster.url()).await.expect("connect");
        let lease = Duration::from_secs(5);
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("migrate").lease(lease))
            .expect("opts");
        let server_key = LockClient::server_key("migrate", "m");
        let slot = harness::key_slot(&server_key);
        let source = cluster.primary_for_slot(slot);
        let target_node = cluster
            .nodes
            .iter()
            .take(3)
            .find(|n| n.port() != source.port())
            .expect("another primary");
        let counter = Arc::new(AtomicU64::new(0));
        let inside = Arc::new(AtomicUsize::new(0));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let stop_at = Instant::now() + Duration::from_secs(3);
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (locks, counter, inside, overlaps) = (
                locks.clone(),
                counter.clone(),
                inside.clone(),
                overlaps.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut done = 0_u64;
                while Instant::now() < stop_at {
                    locks
                        .with_lock("m", Duration::from_secs(20), async {
                            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            let v = counter.load(Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            counter.store(v + 1, Ordering::SeqCst);
                            inside.fetch_sub(1, Ordering::SeqCst);
                        })
                        .await
                        .expect("acquire during migration");
                    done += 1;
                }
                done
            }));
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
        let (src_id, dst_id) = (node_id(source.port()), node_id(target_node.port()));
        let slot_text = slot.to_string();
        target_node.cmd_ok(&["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &src_id]);
        source.cmd_ok(&["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &dst_id]);
        tokio::time::sleep(Duration::from_millis(300)).await; // let ASK redirections happen
        loop {
            let keys = source.cmd_ok(&["CLUSTER", "GETKEYSINSLOT", &slot_text, "100"]);
            let keys: Vec<String> = keys
                .as_array()
                .unwrap_or_default()
                .iter()
                .filter_map(|k| k.to_text())
                .collect();
            if keys.is_empty() {
                break;
            }
            let port = target_node.port().to_string();
            let mut args = vec![
                "MIGRATE",
                "127.0.0.1",
                port.as_str(),
                "",
                "0",
                "5000",
                "KEYS",
            ];
            args.extend(keys.iter().map(String::as_str));
            source.cmd_ok(&args);
        }
        for node in cluster.nodes.iter() {
            let _ = node.cmd(&["CLUSTER", "SETSLOT", &slot_text, "NODE", &dst_id]);
        }
        let mut total = 0;
        for task in tasks {
            total += task.await.expect("task");
        }
        assert_eq!(
            counter.load(Ordering::SeqCst),
            total,
            "{}: lost updates",
            kind.name()
        );
        assert_eq!(
            overlaps.load(Ordering::SeqCst),
            0,
            "{}: overlapping bodies",
            kind.name()
        );
        assert_eq!(
            cluster.primary_for_slot(slot).port(),
            target_node.port(),
            "slot did not move"
        );
        println!(
            "{}: {total} critical sections across a slot migration",
            kind.name()
        );
    }
}

fn node_id(port: u16) -> String {
    harness::cmd(port, &["CLUSTER", "MYID"])
        .ok()
        .and_then(|r| r.to_text())
        .expect("CLUSTER MYID")
}
