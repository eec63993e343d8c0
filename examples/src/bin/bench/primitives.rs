//! The read lock and the semaphore against the uncontended mutex.

use sage_lock::{LockClient, LockOptions};
use serde_json::json;

use crate::measure::{run_for, to_f64};
use crate::report::{Goal, Report};
use crate::{LEASE, PRIMITIVE_TASKS, Plan};

/// The read lock with [`PRIMITIVE_TASKS`] readers on one key, and a semaphore with as many permits
/// on one key, against the uncontended mutex ([`PRIMITIVE_TASKS`] tasks on distinct keys): readers
/// do not exclude each other, so the goal is to be close to the mutex.
pub(crate) async fn primitives_suite(
    report: &mut Report,
    client: &LockClient,
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
    // Interleaved, so that a noisy machine shifts all three alike.
    for _ in 0..3 {
        let locks = mutex.clone();
        mutex_ops += run_for(PRIMITIVE_TASKS, window, move |task| {
            let (locks, key) = (locks.clone(), format!("mutex:{task}"));
            async move {
                locks.with_lock(key.as_str(), LEASE, async {}).await?;
                Ok(true)
            }
        })
        .await?;
        let readers = rw.clone();
        read_ops += run_for(PRIMITIVE_TASKS, window, move |_| {
            let readers = readers.clone();
            async move {
                readers.read("shared", LEASE, async {}).await?;
                Ok(true)
            }
        })
        .await?;
        let holders = semaphore.clone();
        sem_ops += run_for(PRIMITIVE_TASKS, window, move |_| {
            let holders = holders.clone();
            async move {
                holders.acquire("shared", LEASE, async {}).await?;
                Ok(true)
            }
        })
        .await?;
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
    report.ratio(
        "read lock",
        &format!("cycles/s, {PRIMITIVE_TASKS} readers, one key / mutex"),
        (rate(read_ops), "/s"),
        rate(read_ops) / mutex_rate,
        Some(Goal::AtLeast(0.8)),
    );
    report.ratio(
        "semaphore",
        &format!("cycles/s, {PRIMITIVE_TASKS} holders of {permits} permits, one key / mutex"),
        (rate(sem_ops), "/s"),
        rate(sem_ops) / mutex_rate,
        None,
    );
    report.detail(
        "primitives",
        json!({"tasks": PRIMITIVE_TASKS, "mutex_cycles_per_s": mutex_rate,
               "read_cycles_per_s": rate(read_ops), "semaphore_cycles_per_s": rate(sem_ops)}),
    );
    Ok(())
}
