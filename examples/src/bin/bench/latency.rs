//! Uncontended latency: `PING`, sage-lock's `with_lock` and rslock, sequential round trips of one
//! task; and two floors: the same cycles' commands sent with bare fred, no lock library around them.

use std::time::Instant;

use fred::clients::Client;
use fred::interfaces::ClientLike as _;
use rslock::LockManager;
use sage_lock::{LockClient, LockOptions, Locks};
use sage_lock_examples::floor::Floor;
use sage_lock_examples::percentile;
use serde_json::json;

use crate::measure::{Probe, Usage, nanos, to_f64};
use crate::peer::peer_error;
use crate::report::{Goal, Report};
use crate::{LEASE, NO_NESTED, Plan, RSLOCK_NESTED, SAGE_NESTED};

#[derive(Debug)]
pub(crate) struct Measured {
    pub(crate) p50_us: f64,
    p99_us: f64,
    ops: u64,
    usage: Usage,
}

#[derive(Debug)]
pub(crate) struct LatencySuite {
    pub(crate) ping: Measured,
    sage: Measured,
    rslock: Measured,
    /// sage-lock's two uncontended commands, sent with bare fred.
    fred_sage: Measured,
    /// rslock's two commands (`SET NX PX`, its compare-and-delete script), sent with bare fred.
    fred_rslock: Measured,
}

/// Sequential round trips of one task: `PING`, `with_lock` (empty body), rslock `lock`+`unlock`.
pub(crate) async fn latency_suite(
    fred: &Client,
    locks: &Locks<str>,
    manager: &LockManager,
    plan: &Plan,
) -> anyhow::Result<LatencySuite> {
    let batch = plan.samples / plan.rounds as usize;
    let floor = Floor::prepare(fred, 1).await?;
    let mut samples: [Vec<u64>; 5] = Default::default();
    let mut usage: [Usage; 5] = Default::default();
    for round in 0..=plan.rounds {
        // Round 0 warms up connections, scripts and allocators.
        let warm_up = round == 0;
        let count = if warm_up { 200 } else { batch };
        for (subject, (times, total)) in samples.iter_mut().zip(&mut usage).enumerate() {
            let probe = Probe::start(fred).await?;
            for _ in 0..count {
                let start = Instant::now();
                match subject {
                    0 => {
                        let _: String = fred.ping(None).await?;
                    }
                    1 => locks.with_lock("latency", LEASE, async {}).await?,
                    2 => {
                        let lock = manager
                            .lock(b"rslock:latency".as_slice(), LEASE)
                            .await
                            .map_err(peer_error)?;
                        manager.unlock(&lock).await;
                    }
                    3 => floor.sage_commands(0).await?,
                    _ => floor.rslock_commands(0).await?,
                }
                if !warm_up {
                    times.push(nanos(start.elapsed()));
                }
            }
            let measured = probe.stop(fred).await?;
            if !warm_up {
                total.add(measured);
            }
        }
    }
    let [ping, sage, rslock, fred_sage, fred_rslock] = samples;
    let [ping_u, sage_u, rslock_u, fred_sage_u, fred_rslock_u] = usage;
    Ok(LatencySuite {
        ping: Measured::of(ping, ping_u),
        sage: Measured::of(sage, sage_u),
        rslock: Measured::of(rslock, rslock_u),
        fred_sage: Measured::of(fred_sage, fred_sage_u),
        fred_rslock: Measured::of(fred_rslock, fred_rslock_u),
    })
}

impl Measured {
    fn of(mut samples: Vec<u64>, usage: Usage) -> Measured {
        samples.sort_unstable();
        Measured {
            p50_us: to_f64(percentile(&samples, 0.50)) / 1000.0,
            p99_us: to_f64(percentile(&samples, 0.99)) / 1000.0,
            ops: samples.len() as u64,
            usage,
        }
    }
}

/// The latency suite on a runtime of its own with a single thread (and its own connections), where
/// no reply has to wake another thread: it shows the client's own overhead without thread hops.
pub(crate) fn current_thread_latency(url: &str, plan: &Plan) -> anyhow::Result<LatencySuite> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = LockClient::connect(url).await?;
        let locks = client.lock_with::<str>(LockOptions::new().lease(LEASE).namespace("bench"))?;
        let manager = LockManager::new(vec![url.to_owned()]);
        let suite = latency_suite(client.fred(), &locks, &manager, plan).await;
        client.quit().await;
        suite
    })
}

pub(crate) fn report_latency(report: &mut Report, suite: &LatencySuite, runtime: &str) {
    let rtt = suite.ping.p50_us;
    report.info(
        &format!("server: PING, 1 task, {runtime} rt"),
        "round trip p50",
        rtt,
        "us",
    );
    report.info("", "round trip p99", suite.ping.p99_us, "us");
    report.costs("", "PING", &suite.ping.usage, suite.ping.ops, NO_NESTED);
    for (library, what, measured, nested) in [
        ("sage-lock", "with_lock", &suite.sage, SAGE_NESTED),
        ("rslock", "lock+unlock", &suite.rslock, RSLOCK_NESTED),
    ] {
        report.ratio(
            &format!("{library} uncontended, {runtime} rt"),
            &format!("{what} p50 / (2 x PING p50)"),
            (measured.p50_us, "us"),
            measured.p50_us / (2.0 * rtt),
            Some(Goal::AtMost(1.2)),
        );
        report.info("", &format!("{what} p99"), measured.p99_us, "us");
        report.costs("", "cycle", &measured.usage, measured.ops, nested);
    }
    report.ratio(
        &format!("p50 latency, {runtime} rt"),
        "sage-lock / rslock",
        (suite.sage.p50_us, "us"),
        suite.sage.p50_us / suite.rslock.p50_us.max(f64::MIN_POSITIVE),
        Some(Goal::AtMost(1.0)),
    );
    for (what, measured, nested) in [
        ("sage-lock's commands", &suite.fred_sage, SAGE_NESTED),
        ("rslock's commands", &suite.fred_rslock, RSLOCK_NESTED),
    ] {
        report.ratio(
            &format!("floor: bare fred, {what}, {runtime} rt"),
            "p50 / (2 x PING p50)",
            (measured.p50_us, "us"),
            measured.p50_us / (2.0 * rtt),
            None,
        );
        report.costs("", "cycle", &measured.usage, measured.ops, nested);
    }
    // Where a sage-lock cycle's time above rslock's goes, from the p50s of this run.
    report.info(
        &format!("p50 split, {runtime} rt"),
        "sage-lock's own code (sage-lock - its commands on bare fred)",
        suite.sage.p50_us - suite.fred_sage.p50_us,
        "us",
    );
    report.info(
        "",
        "its server work (its commands - rslock's, both on bare fred)",
        suite.fred_sage.p50_us - suite.fred_rslock.p50_us,
        "us",
    );
    report.info(
        "",
        "fred against redis-rs (rslock's commands on fred - rslock)",
        suite.fred_rslock.p50_us - suite.rslock.p50_us,
        "us",
    );
    report.detail(
        &format!("latency, {runtime} runtime"),
        json!({
            "ping": suite.ping.json(NO_NESTED),
            "sage_lock": suite.sage.json(SAGE_NESTED),
            "rslock": suite.rslock.json(RSLOCK_NESTED),
            "fred_with_sage_lock_commands": suite.fred_sage.json(SAGE_NESTED),
            "fred_with_rslock_commands": suite.fred_rslock.json(RSLOCK_NESTED),
        }),
    );
}

impl Measured {
    fn json(&self, nested: &[&str]) -> serde_json::Value {
        json!({"p50_us": self.p50_us, "p99_us": self.p99_us,
               "usage": self.usage.json(self.ops, nested)})
    }
}
