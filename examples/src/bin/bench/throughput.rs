//! Throughput on distinct keys: `SET`, sage-lock's `with_lock`, rslock, and the floors (their
//! commands on bare fred, see `sage_lock_examples::floor`), in interleaved rounds.

use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::KeysInterface as _;
use rslock::LockManager;
use sage_lock::Locks;
use sage_lock_examples::floor::Floor;
use serde_json::json;

use crate::measure::{Probe, Usage, run_for, to_f64};
use crate::peer;
use crate::report::{Goal, Report};
use crate::{LEASE, NO_NESTED, Plan, RSLOCK_NESTED, SAGE_NESTED, THROUGHPUT_TASKS};

#[derive(Debug, Default)]
struct Throughput {
    ops: u64,
    usage: Usage,
}

impl Throughput {
    fn rate(&self) -> f64 {
        to_f64(self.ops) / self.usage.elapsed_s.max(1e-9)
    }
}

#[derive(Debug)]
pub(crate) struct ThroughputSuite {
    set: Throughput,
    sage: Throughput,
    rslock: Throughput,
    fred_sage: Throughput,
    fred_rslock: Throughput,
}

/// [`THROUGHPUT_TASKS`] tasks on distinct keys, one shared client: `SET`, `with_lock` (empty
/// body), rslock.
pub(crate) async fn throughput_suite(
    fred: &Client,
    locks: &Locks<str>,
    manager: &LockManager,
    plan: &Plan,
) -> anyhow::Result<ThroughputSuite> {
    let slice = plan.window / plan.rounds.min(3);
    let floor = Arc::new(Floor::prepare(fred, THROUGHPUT_TASKS).await?);
    let mut results: [Throughput; 5] = Default::default();
    for _ in 0..plan.rounds.min(3) {
        for (subject, result) in results.iter_mut().enumerate() {
            let probe = Probe::start(fred).await?;
            let ops = match subject {
                0 => set_throughput(fred, slice).await?,
                1 => sage_throughput(locks, slice).await?,
                2 => peer::throughput(manager, slice).await?,
                3 => floor_throughput(&floor, slice, true).await?,
                _ => floor_throughput(&floor, slice, false).await?,
            };
            result.usage.add(probe.stop(fred).await?);
            result.ops += ops;
        }
    }
    let [set, sage, rslock, fred_sage, fred_rslock] = results;
    Ok(ThroughputSuite {
        set,
        sage,
        rslock,
        fred_sage,
        fred_rslock,
    })
}

pub(crate) fn report_throughput(report: &mut Report, suite: &ThroughputSuite) {
    let set_rate = suite.set.rate();
    report.info(
        &format!("server: SET, {THROUGHPUT_TASKS} tasks"),
        "SET ops/s (one shared fred client)",
        set_rate,
        "/s",
    );
    report.costs("", "SET", &suite.set.usage, suite.set.ops, NO_NESTED);
    for (scenario, measured, nested) in [
        ("sage-lock throughput", &suite.sage, SAGE_NESTED),
        ("rslock throughput", &suite.rslock, RSLOCK_NESTED),
    ] {
        report.ratio(
            scenario,
            &format!("cycles/s, {THROUGHPUT_TASKS} tasks, distinct keys / SET ops/s"),
            (measured.rate(), "/s"),
            measured.rate() / set_rate,
            Some(Goal::AtLeast(0.45)),
        );
        report.costs("", "cycle", &measured.usage, measured.ops, nested);
    }
    report.ratio(
        &format!("throughput, {THROUGHPUT_TASKS} tasks"),
        "sage-lock / rslock",
        (suite.sage.rate(), "/s"),
        suite.sage.rate() / suite.rslock.rate().max(f64::MIN_POSITIVE),
        Some(Goal::AtLeast(1.0)),
    );
    let rslock_rate = suite.rslock.rate().max(f64::MIN_POSITIVE);
    for (what, measured, nested) in [
        ("sage-lock's commands", &suite.fred_sage, SAGE_NESTED),
        ("rslock's commands", &suite.fred_rslock, RSLOCK_NESTED),
    ] {
        report.ratio(
            &format!("floor: bare fred, {what}, {THROUGHPUT_TASKS} tasks"),
            "cycles/s / rslock's",
            (measured.rate(), "/s"),
            measured.rate() / rslock_rate,
            None,
        );
        report.costs("", "cycle", &measured.usage, measured.ops, nested);
    }
    report.ratio(
        "",
        "sage-lock / its commands on bare fred",
        (suite.sage.rate(), "/s"),
        suite.sage.rate() / suite.fred_sage.rate().max(f64::MIN_POSITIVE),
        None,
    );
    report.detail(
        "throughput",
        json!({
            "set": {"ops_per_s": set_rate, "usage": suite.set.usage.json(suite.set.ops, NO_NESTED)},
            "sage_lock": {"cycles_per_s": suite.sage.rate(),
                          "usage": suite.sage.usage.json(suite.sage.ops, SAGE_NESTED)},
            "rslock": {"cycles_per_s": suite.rslock.rate(),
                       "usage": suite.rslock.usage.json(suite.rslock.ops, RSLOCK_NESTED)},
            "fred_with_sage_lock_commands": {"cycles_per_s": suite.fred_sage.rate(),
                "usage": suite.fred_sage.usage.json(suite.fred_sage.ops, SAGE_NESTED)},
            "fred_with_rslock_commands": {"cycles_per_s": suite.fred_rslock.rate(),
                "usage": suite.fred_rslock.usage.json(suite.fred_rslock.ops, RSLOCK_NESTED)},
        }),
    );
}

async fn set_throughput(fred: &Client, window: Duration) -> anyhow::Result<u64> {
    let keys: Arc<Vec<String>> = Arc::new(
        (0..THROUGHPUT_TASKS)
            .map(|i| format!("bench:set:{i}"))
            .collect(),
    );
    let fred = fred.clone();
    run_for(THROUGHPUT_TASKS, window, move |task| {
        let (fred, keys) = (fred.clone(), Arc::clone(&keys));
        async move {
            let () = fred.set(&keys[task], "x", None, None, false).await?;
            Ok(true)
        }
    })
    .await
}

async fn sage_throughput(locks: &Locks<str>, window: Duration) -> anyhow::Result<u64> {
    let keys: Arc<Vec<String>> =
        Arc::new((0..THROUGHPUT_TASKS).map(|i| format!("tp:{i}")).collect());
    let locks = locks.clone();
    run_for(THROUGHPUT_TASKS, window, move |task| {
        let (locks, keys) = (locks.clone(), Arc::clone(&keys));
        async move {
            locks
                .with_lock(keys[task].as_str(), LEASE, async {})
                .await?;
            Ok(true)
        }
    })
    .await
}

/// The floors on [`THROUGHPUT_TASKS`] tasks: sage-lock's commands (`sage`) or rslock's, on
/// bare fred.
async fn floor_throughput(floor: &Arc<Floor>, window: Duration, sage: bool) -> anyhow::Result<u64> {
    let floor = Arc::clone(floor);
    run_for(THROUGHPUT_TASKS, window, move |task| {
        let floor = Arc::clone(&floor);
        async move {
            if sage {
                floor.sage_commands(task).await?;
            } else {
                floor.rslock_commands(task).await?;
            }
            Ok(true)
        }
    })
    .await
}
