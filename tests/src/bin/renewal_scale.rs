//! Renewal at scale on a cluster: many locks on distinct keys held at once on a throwaway
//! 3-primary cluster (one replica each), and how many renewal calls each primary serves per tick.
//!
//! ```text
//! cargo run -p sage-lock-tests --release --bin renewal_scale -- [--valkey] [--locks N] [--lease-ms MS] [--hold-s S] [--batch-limit N]
//! ```
//!
//! `--batch-limit N` sets the client's `renewal_batch_limit` (default 256 leases per call).
//!
//! Prints, per primary, the locks it holds, its script calls per tick (`INFO commandstats`:
//! `EVALSHA` and `EVAL` while the locks are held, when renewal is the only script traffic) and
//! their server time, next to the calls one call per hash slot would take; then renewals and
//! losses from the client's stats. A measurement aid, not a test: it asserts nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use harness::{Cluster, ServerKind};
use sage_lock::{LockClient, LockError, LockOptions, Locks};

/// `(calls, usec)` of the script commands in `INFO commandstats` of the node at `port`.
fn script_stats(port: u16) -> (u64, u64) {
    let Ok(text) = harness::info(port, "commandstats") else {
        return (0, 0);
    };
    let mut total = (0, 0);
    for command in ["evalsha", "eval"] {
        let Some(stats) = harness::parse_info_field(&text, &format!("cmdstat_{command}")) else {
            continue;
        };
        let field = |name: &str| -> u64 {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix(name))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        total.0 += field("calls=");
        total.1 += field("usec=");
    }
    total
}

fn flag<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let kind = if std::env::args().any(|a| a == "--valkey") {
        ServerKind::Valkey
    } else {
        ServerKind::Redis
    };
    let count: usize = flag("--locks", 10_000);
    let lease = Duration::from_millis(flag("--lease-ms", 3_000));
    let hold = Duration::from_secs(flag("--hold-s", 10));
    let cluster = Cluster::start(kind);
    let batch_limit = flag("--batch-limit", sage_lock::DEFAULT_RENEWAL_BATCH_LIMIT);
    let client = LockClient::builder()
        .url(&cluster.url())
        .renewal_batch_limit(batch_limit)
        .connect()
        .await?;
    let locks: Locks<str> =
        client.lock_with(LockOptions::new().namespace("renew-scale").lease(lease))?;
    let primaries: Vec<&harness::Server> = cluster.nodes.iter().take(3).collect();
    let keys: Vec<String> = (0..count).map(|i| format!("held:{i}")).collect();
    // Locks and distinct slots per primary.
    let mut per_node: BTreeMap<u16, (usize, BTreeSet<u16>)> = BTreeMap::new();
    for key in &keys {
        let slot = harness::key_slot(&LockClient::server_key("renew-scale", key.as_str()));
        let entry = per_node
            .entry(cluster.primary_for_slot(slot).port())
            .or_default();
        entry.0 += 1;
        entry.1.insert(slot);
    }

    let held = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for key in keys {
        let (locks, held, mut stop) = (locks.clone(), Arc::clone(&held), stop_rx.clone());
        tasks.push(tokio::spawn(async move {
            locks
                .with_lock(key.as_str(), Duration::from_secs(60), async move {
                    held.fetch_add(1, Ordering::Relaxed);
                    let _ = stop.wait_for(|stop| *stop).await;
                })
                .await
        }));
    }
    while held.load(Ordering::Relaxed) < count {
        if started.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "only {} of {count} locks taken in 60 s",
                held.load(Ordering::Relaxed)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let acquired_in = started.elapsed();
    let before: Vec<(u64, u64)> = primaries.iter().map(|n| script_stats(n.port())).collect();
    let stats_before = client.stats();
    let window = Instant::now();
    tokio::time::sleep(hold).await;
    let elapsed = window.elapsed();
    let after: Vec<(u64, u64)> = primaries.iter().map(|n| script_stats(n.port())).collect();
    let stats_after = client.stats();
    stop_tx.send_replace(true);
    let mut errors = 0;
    for task in tasks {
        match task.await? {
            Ok(()) => {}
            Err(LockError::LockLost { .. }) | Err(_) => errors += 1,
        }
    }
    client.quit().await;

    let ticks = elapsed.as_secs_f64() / (lease.as_secs_f64() / 3.0);
    println!(
        "{}: {count} locks on a 3-primary cluster, lease {lease:?}, renewal_batch_limit {batch_limit}, all taken in {acquired_in:.2?}, held {elapsed:.2?} ({ticks:.1} renewal ticks)",
        kind.name()
    );
    // Each round renews every lock once: calls per round is calls per node and tick, whatever
    // the window's edges cut off.
    let rounds = (stats_after.renewals - stats_before.renewals) as f64 / count.max(1) as f64;
    println!(
        "primary  locks  slots  calls/tick  calls/round  one call per slot would be  server µs/call  server ms/tick"
    );
    for ((node, b), a) in primaries.iter().zip(&before).zip(&after) {
        let (locks_here, slots) = per_node.get(&node.port()).cloned().unwrap_or_default();
        let calls = a.0.saturating_sub(b.0);
        let usec = a.1.saturating_sub(b.1);
        println!(
            "{:>7}  {locks_here:>5}  {:>5}  {:>10.1}  {:>11.2}  {:>26}  {:>14.1}  {:>14.2}",
            node.port(),
            slots.len(),
            calls as f64 / ticks,
            calls as f64 / rounds.max(1.0),
            slots.len(),
            usec as f64 / calls.max(1) as f64,
            usec as f64 / 1000.0 / ticks,
        );
    }
    println!(
        "renewals {} ({:.0}/s), renewal failures {}, losses {}, other errors {errors}",
        stats_after.renewals - stats_before.renewals,
        (stats_after.renewals - stats_before.renewals) as f64 / elapsed.as_secs_f64(),
        stats_after.renewal_failures - stats_before.renewal_failures,
        stats_after.losses - stats_before.losses,
    );
    Ok(())
}
