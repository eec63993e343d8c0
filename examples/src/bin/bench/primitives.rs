//! The read lock and the semaphore against the uncontended mutex.

use fred::clients::Client;
use sage_lock::{LockClient, LockOptions};
use serde_json::json;

use crate::measure::{Probe, Usage, run_for, to_f64};
use crate::report::{Goal, Report};
use crate::{LEASE, PRIMITIVE_TASKS, Plan, SAGE_NESTED};

/// The read lock with [`PRIMITIVE_TASKS`] readers on one key, and a semaphore with as many permits
/// on one key, against the uncontended mutex ([`PRIMITIVE_TASKS`] tasks on distinct keys): readers
/// do not exclude each other, so the goal is to be close to the mutex. Each one's server
/// execution time per cycle comes from `INFO commandstats` (read through `fred`).
pub(crate) async fn primitives_suite(
    report: &mut Report,
    client: &LockClient,
    fred: &Client,
    plan: &Plan,
) -> anyhow::Result<()> {
    let options = || {
        LockOptions::new()
            .lease(LEASE)
            .namespace("bench-primitives")
    };
    let mutex = client.lock_with::<str>(options())?;
    let rw = client.rw_lock_with::<str>(options())?;
    let permits = u32::try_from(PRIMITIVE_TASKS)?;
    let semaphore = client.semaphore_with::<str>(permits, options())?;
    let window = plan.window / 3;
    let (mut mutex_ops, mut read_ops, mut sem_ops) = (0, 0, 0);
    let (mut mutex_usage, mut read_usage, mut sem_usage) =
        (Usage::default(), Usage::default(), Usage::default());
    // Interleaved, so that a noisy machine shifts all three alike.
    for _ in 0..3 {
        let locks = mutex.clone();
        let probe = Probe::start(fred).await?;
        mutex_ops += run_for(PRIMITIVE_TASKS, window, move |task| {
            let (locks, key) = (locks.clone(), format!("mutex:{task}"));
            async move {
                locks.with_lock(key.as_str(), LEASE, async {}).await?;
                Ok(true)
            }
        })
        .await?;
        mutex_usage.add(probe.stop(fred).await?);
        let readers = rw.clone();
        let probe = Probe::start(fred).await?;
        read_ops += run_for(PRIMITIVE_TASKS, window, move |_| {
            let readers = readers.clone();
            async move {
                readers.read("shared", LEASE, async {}).await?;
                Ok(true)
            }
        })
        .await?;
        read_usage.add(probe.stop(fred).await?);
        let holders = semaphore.clone();
        let probe = Probe::start(fred).await?;
        sem_ops += run_for(PRIMITIVE_TASKS, window, move |_| {
            let holders = holders.clone();
            async move {
                holders.acquire("shared", LEASE, async {}).await?;
                Ok(true)
            }
        })
        .await?;
        sem_usage.add(probe.stop(fred).await?);
    }
    let seconds = (window * 3).as_secs_f64();
    let rate = |ops: u64| to_f64(ops) / seconds;
    let mutex_rate = rate(mutex_ops);
    report.info(
        &format!("mutex, {PRIMITIVE_TASKS} tasks"),
        "cycles/s, distinct keys (uncontended)",
        mutex_rate,
        "/s",
    );
    report.costs("", "cycle", &mutex_usage, mutex_ops, SAGE_NESTED);
    report.ratio(
        "read lock",
        &format!("cycles/s, {PRIMITIVE_TASKS} readers, one key / mutex"),
        (rate(read_ops), "/s"),
        rate(read_ops) / mutex_rate,
        Some(Goal::AtLeast(0.8)),
    );
    report.costs("", "cycle", &read_usage, read_ops, SAGE_NESTED);
    report.ratio(
        "semaphore",
        &format!("cycles/s, {PRIMITIVE_TASKS} holders of {permits} permits, one key / mutex"),
        (rate(sem_ops), "/s"),
        rate(sem_ops) / mutex_rate,
        None,
    );
    report.costs("", "cycle", &sem_usage, sem_ops, SAGE_NESTED);
    report.detail(
        "primitives",
        json!({"tasks": PRIMITIVE_TASKS, "mutex_cycles_per_s": mutex_rate,
               "read_cycles_per_s": rate(read_ops), "semaphore_cycles_per_s": rate(sem_ops)}),
    );
    Ok(())
}
