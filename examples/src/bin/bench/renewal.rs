//! Renewal at scale: many locks held at once, and what keeping them alive costs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use sage_lock::{LockClient, LockError, LockOptions};
use serde_json::json;

use crate::measure::{Probe, Usage, to_f64};
use crate::report::{Goal, Report};
use crate::{Plan, SAGE_NESTED};

#[derive(Debug)]
pub(crate) struct RenewalResult {
    usage: Usage,
    renewals: u64,
    renewal_failures: u64,
    acquire_s: f64,
    losses: u64,
    errors: u64,
}

/// Holds `renew_locks` locks at once for `renew_hold`, measuring what keeping them alive costs.
pub(crate) async fn renewal_at_scale(
    client: &LockClient,
    plan: &Plan,
) -> anyhow::Result<RenewalResult> {
    let locks = client.lock_with::<str>(
        LockOptions::new()
            .lease(plan.renew_lease)
            .namespace("bench-renew"),
    )?;
    let fred = client.fred().clone();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let held = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut handles = Vec::with_capacity(plan.renew_locks);
    for i in 0..plan.renew_locks {
        let (locks, held, mut stop) = (locks.clone(), Arc::clone(&held), stop_rx.clone());
        handles.push(tokio::spawn(async move {
            let key = format!("held:{i}");
            locks
                .with_lock(key.as_str(), Duration::from_secs(30), async move {
                    held.fetch_add(1, Ordering::Relaxed);
                    let _ = stop.wait_for(|stop| *stop).await;
                })
                .await
        }));
    }
    while held.load(Ordering::Relaxed) < plan.renew_locks {
        if start.elapsed() > Duration::from_secs(30) {
            anyhow::bail!(
                "only {} of {} locks acquired within 30 s",
                held.load(Ordering::Relaxed),
                plan.renew_locks
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let acquire_s = start.elapsed().as_secs_f64();

    // The window opens and closes between two renewal rounds, so that the server's count of
    // calls and the client's count of renewals cover the same rounds (a round whose reply is
    // still being read when the window closes would count as a call but not as renewals).
    let tick = plan.renew_lease / 3;
    between_rounds(client, tick).await;
    let stats_before = client.stats();
    let probe = Probe::start(&fred).await?;
    tokio::time::sleep(plan.renew_hold).await;
    between_rounds(client, tick).await;
    let usage = probe.stop(&fred).await?;
    let stats_after = client.stats();

    stop_tx.send_replace(true);
    let mut errors = 0;
    for handle in handles {
        match handle.await.context("a lock task panicked")? {
            Ok(()) | Err(LockError::LockLost { .. }) => {}
            Err(error) => {
                errors += 1;
                eprintln!("renewal scenario: {error}");
            }
        }
    }
    Ok(RenewalResult {
        usage,
        renewals: stats_after.renewals - stats_before.renewals,
        renewal_failures: stats_after.renewal_failures - stats_before.renewal_failures,
        acquire_s,
        losses: client.stats().losses - stats_before.losses,
        errors,
    })
}

/// Returns once no renewal has completed for a quarter of `tick` (the renewal rounds come a
/// tick apart and each takes far less, so none is in flight then), or after two ticks if the
/// renewals never pause.
async fn between_rounds(client: &LockClient, tick: Duration) {
    let quiet = tick / 4;
    let give_up = Instant::now() + tick * 2;
    let mut last = client.stats().renewals;
    let mut since = Instant::now();
    while Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let renewals = client.stats().renewals;
        if renewals != last {
            (last, since) = (renewals, Instant::now());
        } else if since.elapsed() >= quiet {
            return;
        }
    }
}

/// Reports one renewal run; `batch_limit` is the client's `renewal_batch_limit` when not the
/// default (the goal of one call per node and tick applies to that run).
pub(crate) fn report_renewal(
    report: &mut Report,
    renewal: &RenewalResult,
    plan: &Plan,
    batch_limit: Option<usize>,
) {
    let scenario = match batch_limit {
        None => format!(
            "sage-lock renewal, {} locks, {:?} lease, default batch limit ({})",
            plan.renew_locks,
            plan.renew_lease,
            sage_lock::DEFAULT_RENEWAL_BATCH_LIMIT
        ),
        Some(limit) => format!(
            "sage-lock renewal, {} locks, {:?} lease, renewal_batch_limit({limit})",
            plan.renew_locks, plan.renew_lease
        ),
    };
    let elapsed = renewal.usage.elapsed_s;
    let tick = plan.renew_lease.as_secs_f64() / 3.0;
    let per_tick = renewal.usage.round_trips(SAGE_NESTED) / (elapsed / tick);
    let locks = to_f64(plan.renew_locks as u64);
    let renewals = to_f64(renewal.renewals);
    report.ratio(
        &scenario,
        &format!("renewal round trips per tick ({tick:.1} s) / locks"),
        (per_tick, ""),
        per_tick / locks,
        None,
    );
    report.info("", "renewals/s (client.stats)", renewals / elapsed, "/s");
    // The renewal scripts are the only EVALSHA calls while the locks are held: their server time
    // per call is how long each call holds the (single-threaded) server, and per renewed lock what
    // one call for every lock on the node would hold it for.
    let (calls, usec) = renewal
        .usage
        .commands
        .0
        .get("evalsha")
        .copied()
        .unwrap_or((0, 0));
    let usec_per_call = to_f64(usec) / to_f64(calls.max(1));
    // Each renewal round renews every lock once: calls per round is calls per node and tick
    // (one server here); the window's edges fall between rounds.
    let rounds = renewals / locks;
    let per_round = to_f64(calls) / rounds.max(1.0);
    report.ratio(
        "",
        "renewal calls per round (every lock renewed once)",
        (per_round, ""),
        per_round,
        batch_limit.map(|_| Goal::AtMost(1.0)),
    );
    report.info(
        "",
        "server time per renewal call (INFO commandstats)",
        usec_per_call,
        "us",
    );
    let usec_per_lock = to_f64(usec) / renewals.max(1.0);
    report.info("", "server time per renewed lock", usec_per_lock, "us");
    report.info(
        "",
        "one call for every lock would hold the server for",
        usec_per_lock * locks / 1000.0,
        "ms",
    );
    report.info(
        "",
        "client CPU, share of one core",
        renewal.usage.client_cpu_s / elapsed,
        "",
    );
    report.info(
        "",
        "client CPU per renewal",
        renewal.usage.client_cpu_s * 1e6 / renewals.max(1.0),
        "us",
    );
    report.info(
        "",
        "server CPU, share of one core",
        renewal.usage.server_cpu_s / elapsed,
        "",
    );
    report.info(
        "",
        "time to acquire all locks",
        renewal.acquire_s * 1000.0,
        "ms",
    );
    report.info(
        "",
        "renewal failures (retried)",
        to_f64(renewal.renewal_failures),
        "",
    );
    report.ratio(
        "",
        "losses",
        (to_f64(renewal.losses), ""),
        to_f64(renewal.losses),
        Some(Goal::AtMost(0.0)),
    );
    report.detail(
        if batch_limit.is_some() {
            "renewal_one_call_per_tick"
        } else {
            "renewal"
        },
        json!({"locks": plan.renew_locks, "lease_ms": plan.renew_lease.as_millis(),
               "renewal_batch_limit": batch_limit.unwrap_or(sage_lock::DEFAULT_RENEWAL_BATCH_LIMIT),
               "renewal_calls_per_round": per_round,
               "hold_s": plan.renew_hold.as_secs_f64(), "renewals": renewal.renewals,
               "renewal_failures": renewal.renewal_failures,
               "renewal_round_trips_per_tick": per_tick, "acquire_all_s": renewal.acquire_s,
               "losses": renewal.losses, "other_errors": renewal.errors,
               "usage": renewal.usage.json(renewal.renewals, SAGE_NESTED)}),
    );
}
