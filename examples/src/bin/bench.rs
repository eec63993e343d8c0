//! Benchmark: sage-lock against the server's own limits and against `rslock`, in one run.
//!
//! ```text
//! cargo run -p sage-lock-examples --release --bin bench [-- --quick] [--json PATH] [--valkey] [--keep-awake] [--only SUITES]
//! ```
//!
//! Starts its own throwaway server (or uses `SAGE_LOCK_URL`) and measures, reporting ratios:
//!
//! - the server's limits: `PING` round trip (1 task, sequential) and `SET` throughput (64 tasks on
//!   one shared fred client);
//! - uncontended acquire + release latency (`with_lock`, empty body) against 2 × `PING`, on a
//!   multi-thread and on a current-thread runtime;
//! - throughput of 8 tasks on distinct keys against `SET` throughput and rslock's;
//! - contention: 8 tasks in the bench process on one key with 1 ms critical sections against the ideal
//!   1 / (1 ms + RTT), and round trips per acquisition;
//! - renewal at scale: many locks held at once, renewal round trips per tick, CPU time, losses;
//! - `rslock` on the latency, throughput and contention scenarios, as the reference peer.
//!
//! The latency and throughput subjects (PING/SET, sage-lock, rslock) are measured in interleaved
//! rounds, so that a noisy machine shifts all of them alike. Costs per operation come from
//! `INFO commandstats` (round trips: the commands a client sent, not those a script ran inside the
//! server), `INFO cpu` (server CPU) and `/proc/self/task/*/schedstat` (this process's CPU).
//!
//! On virtual machines an idle vCPU can take tens of microseconds to wake up, which then swamps
//! the latency ratios (PING p50 jumps between ~20 and ~60 us from run to run on a 2-core VM);
//! `--keep-awake` runs lowest-priority busy loops during the latency suites to avoid that.
//!
//! Nothing is asserted: it is a report. The table goes to stdout, the details to a JSON file
//! (default `<workspace>/target/bench.json`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use fred::clients::Client;
use fred::interfaces::{ClientLike as _, KeysInterface as _};
use fred::types::InfoKind;
use rslock::LockManager;
use sage_lock::{LockClient, LockError, LockOptions, Locks};
use sage_lock_examples::{ThrowawayServer, flag_value, has_flag, percentile, workspace_root};
use serde_json::json;

/// Tasks of the throughput scenarios (each on its own key).
const THROUGHPUT_TASKS: usize = 8;
/// Tasks of the in-process contention scenario (the bench's own process).
const CONTENDERS: usize = 8;
/// Critical section of the contention scenario.
const CRITICAL_SECTION: Duration = Duration::from_millis(1);
/// Lease of the latency, throughput and contention scenarios (no renewal happens in them).
const LEASE: Duration = Duration::from_secs(10);

/// Tasks of the primitives scenario.
const PRIMITIVE_TASKS: usize = 8;

/// Commands sage-lock's scripts run inside the server (`INFO commandstats` counts them too).
/// Every command sage-lock sends is a script (`EVALSHA`, `EVAL` after `NOSCRIPT`), except the
/// uncontended release on Valkey 9, which is `DELIFEQ` itself.
const SAGE_NESTED: &[&str] = &[
    "set", "incr", "get", "pexpire", "pttl", "del", "lindex", "lpop", "rpush", "lrem", "zadd",
    "zrem", "zscore", "exists", "time", "spublish",
];
/// Commands rslock's scripts (unlock, extend) run inside the server; its `SET NX` is sent itself.
const RSLOCK_NESTED: &[&str] = &["get", "del", "pexpire"];
/// `PING` and `SET` run no scripts.
const NO_NESTED: &[&str] = &[];

#[derive(Debug, Clone, Copy)]
struct Plan {
    /// Latency samples per subject.
    samples: usize,
    /// Interleaved rounds of the latency and throughput comparisons.
    rounds: u32,
    /// Measuring time per subject of the throughput and contention scenarios.
    window: Duration,
    renew_locks: usize,
    renew_lease: Duration,
    renew_hold: Duration,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                samples: 1_000,
                rounds: 4,
                window: Duration::from_millis(800),
                renew_locks: 2_000,
                renew_lease: Duration::from_secs(1),
                renew_hold: Duration::from_secs(3),
            }
        } else {
            Plan {
                samples: 6_000,
                rounds: 10,
                window: Duration::from_secs(3),
                renew_locks: 10_000,
                renew_lease: Duration::from_secs(3),
                renew_hold: Duration::from_secs(15),
            }
        }
    }
}

fn main() -> anyhow::Result<()> {
    if let Some(worker) = sage_lock_examples::multiprocess::worker_main() {
        return worker;
    }
    if has_flag("--both") {
        return both_servers();
    }
    // Run on a runtime worker, as a service's request handler would (the thread that calls
    // `block_on` is not a worker, and every reply would have to wake it from another thread).
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async { tokio::spawn(run()).await? })
}

/// `--both`: the whole benchmark on Redis, then on Valkey, in one invocation (JSON files
/// `bench-redis.json` and `bench-valkey.json` next to the `--json` path).
fn both_servers() -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let json_dir = flag_value::<PathBuf>("--json")?
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| workspace_root().join("target"));
    let mut passed = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--both" | "--valkey" => {}
            "--json" => {
                args.next();
            }
            _ => passed.push(arg),
        }
    }
    for (kind, extra) in [("redis", None), ("valkey", Some("--valkey"))] {
        eprintln!("\n=== {kind} ===");
        let status = std::process::Command::new(&exe)
            .args(&passed)
            .args(extra)
            .arg("--json")
            .arg(json_dir.join(format!("bench-{kind}.json")))
            .env_remove("SAGE_LOCK_SERVER")
            .status()?;
        anyhow::ensure!(status.success(), "the {kind} run failed");
    }
    Ok(())
}

async fn run() -> anyhow::Result<()> {
    let quick = has_flag("--quick");
    let keep_awake = has_flag("--keep-awake");
    // `--only a,b`: run only these suites (latency, throughput, primitives, contention,
    // multi-process, renewal), e.g. to profile one of them.
    let only: Option<String> = flag_value::<String>("--only")?;
    let wants = |suite: &str| {
        only.as_deref()
            .is_none_or(|only| only.split(',').any(|s| s == suite))
    };
    let plan = Plan::new(quick);
    let json_path: PathBuf = flag_value::<PathBuf>("--json")?
        .unwrap_or_else(|| workspace_root().join("target").join("bench.json"));
    let server = ThrowawayServer::start()?;
    let client = LockClient::connect(server.url()).await?;
    let fred = client.fred().clone();
    let server_info: String = fred.info(Some(InfoKind::Server)).await?;
    let version = info_field(&server_info, "valkey_version")
        .or_else(|| info_field(&server_info, "redis_version"))
        .unwrap_or("?")
        .to_owned();
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    eprintln!(
        "bench{}{}: {} (version {version}), {cores} cores, client and server on this machine",
        if quick { " --quick" } else { "" },
        if keep_awake { " --keep-awake" } else { "" },
        server.description()
    );
    let started = Instant::now();
    let mut report = Report::default();
    report.detail(
        "environment",
        json!({"server": server.description(), "server_version": version, "cores": cores,
               "quick": quick, "keep_awake": keep_awake,
               "load_average_at_start": load_average()}),
    );
    let locks = client.lock_with::<str>(LockOptions::new().lease(LEASE).namespace("bench"))?;
    let manager = LockManager::new(vec![server.url().to_owned()]);

    // On virtual machines an idle vCPU can take tens of microseconds to wake up, which then
    // dominates every round trip (PING p50 jumps between ~20 and ~60 us from run to run here).
    // --keep-awake runs one lowest-priority busy loop per core during the latency suites so that
    // they measure the software, not the hypervisor.
    let spinners = if keep_awake {
        Some(Spinners::start(cores))
    } else {
        None
    };
    eprintln!("latency: PING, sage-lock, rslock (interleaved), multi-thread runtime ...");
    let latency = latency_suite(&fred, &locks, &manager, &plan).await?;
    let rtt_us = latency.ping.p50_us;
    report_latency(&mut report, &latency, "multi-thread");
    eprintln!("latency: the same on a current-thread runtime ...");
    let url = server.url().to_owned();
    let current =
        tokio::task::spawn_blocking(move || current_thread_latency(&url, &plan)).await??;
    report_latency(&mut report, &current, "current-thread");
    drop(spinners);

    if wants("throughput") {
        eprintln!("throughput: SET, sage-lock, rslock (interleaved) ...");
        let throughput = throughput_suite(&fred, &locks, &manager, &plan).await?;
        report_throughput(&mut report, &throughput);
    }
    if wants("primitives") {
        eprintln!("primitives: mutex, read lock, semaphore ({PRIMITIVE_TASKS} tasks) ...");
        primitives_suite(&mut report, &client, &plan).await?;
    }
    if wants("contention") {
        eprintln!("contention ...");
        contention_suite(&mut report, &client, &locks, &manager, &plan, rtt_us).await?;
    }
    if wants("multi-process") {
        eprintln!("contention in worker processes (1 x 8, 4 x 2 tasks): sage-lock, rslock ...");
        multi_process_suite(&mut report, &fred, server.url(), &plan, rtt_us).await?;
    }
    if wants("renewal") {
        eprintln!(
            "renewal at scale: {} locks, lease {:?}, held {:?} ...",
            plan.renew_locks, plan.renew_lease, plan.renew_hold
        );
        let renewal = renewal_at_scale(&client, &plan).await?;
        report_renewal(&mut report, &renewal, &plan);
    }

    client.quit().await;
    let total = started.elapsed();
    print_table(&report);
    eprintln!("\nfinished in {:.1} s", total.as_secs_f64());
    write_json(&report, &json_path, total)?;
    eprintln!("wrote {}", json_path.display());
    Ok(())
}

// --- latency ------------------------------------------------------------------------------------

#[derive(Debug)]
struct Measured {
    p50_us: f64,
    p99_us: f64,
    ops: u64,
    usage: Usage,
}

#[derive(Debug)]
struct LatencySuite {
    ping: Measured,
    sage: Measured,
    rslock: Measured,
}

/// Sequential round trips of one task: `PING`, `with_lock` (empty body), rslock `lock`+`unlock`.
async fn latency_suite(
    fred: &Client,
    locks: &Locks<str>,
    manager: &LockManager,
    plan: &Plan,
) -> anyhow::Result<LatencySuite> {
    let batch = plan.samples / plan.rounds as usize;
    let mut samples: [Vec<u64>; 3] = Default::default();
    let mut usage: [Usage; 3] = Default::default();
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
                    _ => {
                        let lock = manager
                            .lock(b"rslock:latency".as_slice(), LEASE)
                            .await
                            .map_err(peer_error)?;
                        manager.unlock(&lock).await;
                    }
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
    let [ping, sage, rslock] = samples;
    let [ping_usage, sage_usage, rslock_usage] = usage;
    Ok(LatencySuite {
        ping: Measured::of(ping, ping_usage),
        sage: Measured::of(sage, sage_usage),
        rslock: Measured::of(rslock, rslock_usage),
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
fn current_thread_latency(url: &str, plan: &Plan) -> anyhow::Result<LatencySuite> {
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

fn report_latency(report: &mut Report, suite: &LatencySuite, runtime: &str) {
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
    report.detail(
        &format!("latency, {runtime} runtime"),
        json!({
            "ping": suite.ping.json(NO_NESTED),
            "sage_lock": suite.sage.json(SAGE_NESTED),
            "rslock": suite.rslock.json(RSLOCK_NESTED),
        }),
    );
}

impl Measured {
    fn json(&self, nested: &[&str]) -> serde_json::Value {
        json!({"p50_us": self.p50_us, "p99_us": self.p99_us,
               "usage": self.usage.json(self.ops, nested)})
    }
}

// --- throughput ---------------------------------------------------------------------------------

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
struct ThroughputSuite {
    set: Throughput,
    sage: Throughput,
    rslock: Throughput,
}

/// [`THROUGHPUT_TASKS`] tasks on distinct keys, one shared client: `SET`, `with_lock` (empty
/// body), rslock.
async fn throughput_suite(
    fred: &Client,
    locks: &Locks<str>,
    manager: &LockManager,
    plan: &Plan,
) -> anyhow::Result<ThroughputSuite> {
    let slice = plan.window / plan.rounds.min(3);
    let mut results: [Throughput; 3] = Default::default();
    for _ in 0..plan.rounds.min(3) {
        for (subject, result) in results.iter_mut().enumerate() {
            let probe = Probe::start(fred).await?;
            let ops = match subject {
                0 => set_throughput(fred, slice).await?,
                1 => sage_throughput(locks, slice).await?,
                _ => peer::throughput(manager, slice).await?,
            };
            result.usage.add(probe.stop(fred).await?);
            result.ops += ops;
        }
    }
    let [set, sage, rslock] = results;
    Ok(ThroughputSuite { set, sage, rslock })
}

fn report_throughput(report: &mut Report, suite: &ThroughputSuite) {
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
    report.detail(
        "throughput",
        json!({
            "set": {"ops_per_s": set_rate, "usage": suite.set.usage.json(suite.set.ops, NO_NESTED)},
            "sage_lock": {"cycles_per_s": suite.sage.rate(),
                          "usage": suite.sage.usage.json(suite.sage.ops, SAGE_NESTED)},
            "rslock": {"cycles_per_s": suite.rslock.rate(),
                       "usage": suite.rslock.usage.json(suite.rslock.ops, RSLOCK_NESTED)},
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

// --- primitives ---------------------------------------------------------------------------------

/// The read lock with [`PRIMITIVE_TASKS`] readers on one key, and a semaphore with as many permits
/// on one key, against the uncontended mutex ([`PRIMITIVE_TASKS`] tasks on distinct keys): readers
/// do not exclude each other, so the goal is to be close to the mutex.
async fn primitives_suite(
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

// --- contention ---------------------------------------------------------------------------------

/// How the critical section of the contention scenario spends its millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// Busy-wait exactly 1 ms (holds a runtime worker, like CPU-bound work).
    Spin,
    /// `tokio::time::sleep(1 ms)`, which sleeps up to the next timer tick (≈ 2 ms).
    Sleep,
}

async fn contention_suite(
    report: &mut Report,
    client: &LockClient,
    locks: &Locks<str>,
    manager: &LockManager,
    plan: &Plan,
    rtt_us: f64,
) -> anyhow::Result<()> {
    let ideal = 1e6 / (duration_us(CRITICAL_SECTION) + rtt_us);
    let fred = client.fred();
    let mut details = serde_json::Map::new();

    for body in [Body::Spin, Body::Sleep] {
        let stats_before = client.stats();
        let probe = Probe::start(fred).await?;
        let (sections, held_ns) = sage_contention(locks, plan.window, body).await?;
        let usage = probe.stop(fred).await?;
        let stats = client.stats();
        let acquisitions = to_f64(sections.max(1));
        let rate = to_f64(sections) / usage.elapsed_s;
        let mean_body_us = to_f64(held_ns) / 1000.0 / acquisitions;
        let busy = to_f64(stats.busy_retries - stats_before.busy_retries) / acquisitions;
        let round_trips = usage.round_trips(SAGE_NESTED) / acquisitions;
        let scenario = match body {
            Body::Spin => format!("sage-lock contention, {CONTENDERS} tasks, 1 key"),
            Body::Sleep => "sage-lock contention, sleep(1ms) body".to_owned(),
        };
        match body {
            Body::Spin => report_spin_contention(report, &scenario, rate, ideal, round_trips),
            Body::Sleep => {
                let ideal_here = 1e6 / (mean_body_us + rtt_us);
                report.ratio(
                    &scenario,
                    "critical sections/s / 1/(measured body + RTT)",
                    (rate, "/s"),
                    rate / ideal_here,
                    None,
                );
                report.info("", "round trips per acquisition", round_trips, "");
            }
        }
        report.info("", "busy retries per acquisition", busy, "");
        report.info(
            "",
            "commands incl. inside scripts per acq.",
            usage.commands.total() / acquisitions,
            "",
        );
        report.info("", "measured critical section (mean)", mean_body_us, "us");
        if body == Body::Spin {
            report.info("", "ideal 1/(1 ms + PING RTT)", ideal, "/s");
        }
        details.insert(
            format!("sage_lock_{body:?}").to_lowercase(),
            json!({"critical_sections_per_s": rate, "ideal_per_s": ideal,
                   "busy_retries_per_acquisition": busy, "mean_body_us": mean_body_us,
                   "usage": usage.json(sections, SAGE_NESTED)}),
        );
    }

    for (label, retry_delay) in [
        ("default retry, 3 x 0-200ms", None),
        ("retry 3 x 0-2ms", Some(Duration::from_millis(2))),
    ] {
        let mut manager = manager.clone();
        if let Some(delay) = retry_delay {
            manager.set_retry(3, delay);
        }
        let probe = Probe::start(fred).await?;
        let sections = peer::contention(&manager, plan.window).await?;
        let usage = probe.stop(fred).await?;
        let rate = to_f64(sections) / usage.elapsed_s;
        let round_trips = usage.round_trips(RSLOCK_NESTED) / to_f64(sections.max(1));
        let scenario = format!("rslock contention, {label}");
        report_spin_contention(report, &scenario, rate, ideal, round_trips);
        details.insert(
            format!("rslock, {label}"),
            json!({"critical_sections_per_s": rate, "usage": usage.json(sections, RSLOCK_NESTED)}),
        );
    }
    report.detail("contention", details.into());
    Ok(())
}

/// [`CONTENDERS`] tasks on one key; returns the critical sections run and the nanoseconds spent in them.
async fn sage_contention(
    locks: &Locks<str>,
    window: Duration,
    body: Body,
) -> anyhow::Result<(u64, u64)> {
    let held_ns = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + window;
    let key = match body {
        Body::Spin => "contended-spin",
        Body::Sleep => "contended-sleep",
    };
    let (locks, held) = (locks.clone(), Arc::clone(&held_ns));
    let sections = run_for(CONTENDERS, window, move |_| {
        let (locks, held) = (locks.clone(), Arc::clone(&held));
        async move {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let critical_section = async {
                let start = Instant::now();
                match body {
                    Body::Spin => spin(CRITICAL_SECTION),
                    Body::Sleep => tokio::time::sleep(CRITICAL_SECTION).await,
                }
                held.fetch_add(nanos(start.elapsed()), Ordering::Relaxed);
            };
            match locks.with_lock(key, left, critical_section).await {
                Ok(()) => Ok(true),
                Err(LockError::TimedOut { .. }) => Ok(false),
                Err(error) => Err(error.into()),
            }
        }
    })
    .await?;
    Ok((sections, held_ns.load(Ordering::Relaxed)))
}

// --- multi-process contention ------------------------------------------------------------------

/// One key, 1 ms spinning sections, 2 s waits, in worker processes started together: 1 process
/// of 8 tasks, then 4 processes of 2 tasks; sage-lock and rslock in turn.
async fn multi_process_suite(
    report: &mut Report,
    fred: &Client,
    url: &str,
    plan: &Plan,
    rtt_us: f64,
) -> anyhow::Result<()> {
    let mut details = serde_json::Map::new();
    // (processes, tasks, goal for the share of ideal): the issue's two contended shapes.
    for (processes, tasks, goal) in [(1, 8, 0.95), (4, 2, 0.9)] {
        let detail =
            process_contention(report, fred, url, plan, rtt_us, processes, tasks, goal).await?;
        details.insert(format!("{processes}x{tasks}"), detail);
    }
    report.detail("multi_process_contention", details.into());
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn process_contention(
    report: &mut Report,
    fred: &Client,
    url: &str,
    plan: &Plan,
    rtt_us: f64,
    processes: usize,
    tasks: usize,
    goal: f64,
) -> anyhow::Result<serde_json::Value> {
    use sage_lock_examples::multiprocess::{self, Scenario, Subject};
    let scenario = Scenario {
        processes,
        tasks,
        run: if plan.samples < 6_000 {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(4)
        },
        section: CRITICAL_SECTION,
        wait: Duration::from_secs(2),
    };
    let ideal = scenario.run.as_secs_f64() * 1e6 / (duration_us(CRITICAL_SECTION) + rtt_us);
    let mut details = serde_json::Map::new();
    let mut p99s = Vec::new();
    for (subject, label, nested) in [
        (Subject::SageLock, "sage-lock", SAGE_NESTED),
        (Subject::Rslock, "rslock", RSLOCK_NESTED),
    ] {
        let ns = format!("mp{processes}x{tasks}");
        let running = multiprocess::spawn(subject, url, &ns, scenario)?;
        tokio::time::sleep_until((running.starts_at - Duration::from_millis(50)).into()).await;
        let probe = Probe::start(fred).await?;
        let reports = running.finish().await?;
        let usage = probe.stop(fred).await?;
        let sections: Vec<u64> = reports.iter().map(|r| r.sections).collect();
        let total: u64 = sections.iter().sum();
        let timeouts: u64 = reports.iter().map(|r| r.timeouts).sum();
        let mut waits: Vec<u64> = reports.iter().flat_map(|r| r.waits_us.clone()).collect();
        waits.sort_unstable();
        let p99_ms = to_f64(percentile(&waits, 0.99)) / 1000.0;
        p99s.push(p99_ms);
        let fewest = sections.iter().copied().min().unwrap_or(0);
        let most = sections.iter().copied().max().unwrap_or(0).max(1);
        let acquisitions = to_f64(total.max(1));
        // Acquire-side commands: every command clients sent minus one release per
        // acquisition, plus the release notifications (SPUBLISH inside the release script).
        let commands = (usage.round_trips(nested) - acquisitions
            + usage.commands.calls("spublish"))
            / acquisitions;
        let per_process = sections
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" / ");
        let scenario_name = if processes == 1 {
            format!("{label}, 1 process x {tasks} tasks, 1 key")
        } else {
            format!("{label}, {processes} processes x {tasks} tasks, 1 key")
        };
        report.ratio(
            &scenario_name,
            "critical sections / ideal",
            (to_f64(total), ""),
            to_f64(total) / ideal,
            Some(Goal::AtLeast(goal)),
        );
        if processes > 1 {
            report.ratio(
                "",
                &format!("fewest/most per process ({per_process})"),
                (to_f64(fewest), ""),
                to_f64(fewest) / to_f64(most),
                Some(Goal::AtLeast(0.8)),
            );
        }
        report.ratio(
            "",
            "waits timed out (2 s)",
            (to_f64(timeouts), ""),
            to_f64(timeouts),
            Some(Goal::AtMost(0.0)),
        );
        report.info("", "p99 wait", p99_ms, "ms");
        report.ratio(
            "",
            "server commands per acquisition (notifications incl.)",
            (commands, ""),
            commands,
            Some(Goal::AtMost(3.0)),
        );
        details.insert(
            label.to_owned(),
            json!({"sections_per_process": sections, "timeouts": timeouts,
                   "p99_wait_ms": p99_ms, "ideal_sections": ideal,
                   "commands_per_acquisition": commands,
                   "usage": usage.json(total, nested)}),
        );
    }
    if let [sage, rslock] = p99s[..] {
        report.ratio(
            &format!("p99 wait, {processes} x {tasks} tasks"),
            "sage-lock / rslock",
            (sage, "ms"),
            sage / rslock.max(f64::MIN_POSITIVE),
            Some(Goal::AtMost(1.0)),
        );
    }
    Ok(details.into())
}

#[derive(Debug)]
struct RenewalResult {
    usage: Usage,
    renewals: u64,
    renewal_failures: u64,
    acquire_s: f64,
    losses: u64,
    errors: u64,
}

/// Holds `renew_locks` locks at once for `renew_hold`, measuring what keeping them alive costs.
async fn renewal_at_scale(client: &LockClient, plan: &Plan) -> anyhow::Result<RenewalResult> {
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

    let stats_before = client.stats();
    let probe = Probe::start(&fred).await?;
    tokio::time::sleep(plan.renew_hold).await;
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

fn report_renewal(report: &mut Report, renewal: &RenewalResult, plan: &Plan) {
    let scenario = format!(
        "sage-lock renewal, {} locks, {:?} lease",
        plan.renew_locks, plan.renew_lease
    );
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
        "renewal",
        json!({"locks": plan.renew_locks, "lease_ms": plan.renew_lease.as_millis(),
               "hold_s": plan.renew_hold.as_secs_f64(), "renewals": renewal.renewals,
               "renewal_failures": renewal.renewal_failures,
               "renewal_round_trips_per_tick": per_tick, "acquire_all_s": renewal.acquire_s,
               "losses": renewal.losses, "other_errors": renewal.errors,
               "usage": renewal.usage.json(renewal.renewals, SAGE_NESTED)}),
    );
}

// --- rslock -------------------------------------------------------------------------------------

fn peer_error(error: rslock::LockError) -> anyhow::Error {
    anyhow::anyhow!("rslock: {error}")
}

mod peer {
    use super::{
        Arc, CONTENDERS, CRITICAL_SECTION, Duration, Instant, LEASE, LockManager, THROUGHPUT_TASKS,
        peer_error, run_for, spin,
    };

    pub(super) async fn throughput(manager: &LockManager, window: Duration) -> anyhow::Result<u64> {
        let keys: Arc<Vec<Vec<u8>>> = Arc::new(
            (0..THROUGHPUT_TASKS)
                .map(|i| format!("rslock:tp:{i}").into_bytes())
                .collect(),
        );
        let manager = manager.clone();
        run_for(THROUGHPUT_TASKS, window, move |task| {
            let (manager, keys) = (manager.clone(), Arc::clone(&keys));
            async move {
                let lock = manager
                    .lock(keys[task].as_slice(), LEASE)
                    .await
                    .map_err(peer_error)?;
                manager.unlock(&lock).await;
                Ok(true)
            }
        })
        .await
    }

    /// [`CONTENDERS`] tasks on one key with 1 ms spinning bodies. A busy `lock` (which makes its own retries)
    /// is simply called again, as rslock's `acquire` does.
    pub(super) async fn contention(manager: &LockManager, window: Duration) -> anyhow::Result<u64> {
        let manager = manager.clone();
        let deadline = Instant::now() + window;
        run_for(CONTENDERS, window, move |_| {
            let manager = manager.clone();
            async move {
                if Instant::now() >= deadline {
                    return Ok(false);
                }
                match manager.lock(b"rslock:contended".as_slice(), LEASE).await {
                    Ok(lock) => {
                        spin(CRITICAL_SECTION);
                        manager.unlock(&lock).await;
                        Ok(true)
                    }
                    Err(_) => Ok(false),
                }
            }
        })
        .await
    }
}

/// Lowest-priority busy loops (`nice -n 19`), one per core, stopped on drop.
#[derive(Debug)]
struct Spinners(Vec<std::process::Child>);

impl Spinners {
    fn start(count: usize) -> Spinners {
        let mut children = Vec::new();
        for _ in 0..count {
            match std::process::Command::new("nice")
                .args(["-n", "19", "sh", "-c", "while :; do :; done"])
                .stdin(std::process::Stdio::null())
                .spawn()
            {
                Ok(child) => children.push(child),
                Err(error) => eprintln!("--keep-awake: could not start a busy loop: {error}"),
            }
        }
        Spinners(children)
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// --- measurement helpers ------------------------------------------------------------------------

#[allow(clippy::cast_precision_loss)]
fn to_f64(n: u64) -> f64 {
    n as f64
}

fn duration_us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn spin(duration: Duration) {
    let start = Instant::now();
    while start.elapsed() < duration {
        std::hint::spin_loop();
    }
}

/// Runs `tasks` copies of `cycle` until `window` has passed; returns the cycles that counted.
async fn run_for<F, Fut>(tasks: usize, window: Duration, cycle: F) -> anyhow::Result<u64>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<bool>> + Send,
{
    let cycle = Arc::new(cycle);
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + window;
    let mut handles = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let (cycle, count) = (Arc::clone(&cycle), Arc::clone(&count));
        handles.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                if cycle(task).await? {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for handle in handles {
        handle.await??;
    }
    Ok(count.load(Ordering::Relaxed))
}

/// `INFO commandstats`: calls and microseconds of execution per command.
#[derive(Debug, Clone, Default)]
struct CommandStats(BTreeMap<String, (u64, u64)>);

impl CommandStats {
    async fn read(fred: &Client) -> anyhow::Result<CommandStats> {
        let text: String = fred.info(Some(InfoKind::CommandStats)).await?;
        let mut stats = BTreeMap::new();
        for line in text.lines() {
            let Some((name, fields)) = line.trim().split_once(':') else {
                continue;
            };
            let Some(name) = name.strip_prefix("cmdstat_") else {
                continue;
            };
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            };
            stats.insert(name.to_owned(), (field("calls"), field("usec")));
        }
        Ok(CommandStats(stats))
    }

    /// Calls per command since `before`, without this benchmark's own `INFO` calls.
    fn delta(&self, before: &CommandStats) -> CommandStats {
        CommandStats(
            self.0
                .iter()
                .filter(|(name, _)| name.as_str() != "info")
                .map(|(name, (calls, usec))| {
                    let (old_calls, old_usec) = before.0.get(name).copied().unwrap_or((0, 0));
                    (
                        name.clone(),
                        (
                            calls.saturating_sub(old_calls),
                            usec.saturating_sub(old_usec),
                        ),
                    )
                })
                .filter(|(_, (calls, _))| *calls > 0)
                .collect(),
        )
    }

    fn add(&mut self, other: &CommandStats) {
        for (name, (calls, usec)) in &other.0 {
            let entry = self.0.entry(name.clone()).or_default();
            entry.0 += calls;
            entry.1 += usec;
        }
    }

    fn total(&self) -> f64 {
        to_f64(self.0.values().map(|(calls, _)| calls).sum())
    }

    fn calls(&self, name: &str) -> f64 {
        to_f64(self.0.get(name).map_or(0, |(calls, _)| *calls))
    }

    /// Execution time of the commands clients sent (scripts include what they run inside).
    fn exec_us(&self, nested: &[&str]) -> f64 {
        to_f64(
            self.0
                .iter()
                .filter(|(name, _)| !nested.contains(&name.as_str()))
                .map(|(_, (_, usec))| usec)
                .sum(),
        )
    }

    fn per_op(&self, ops: f64) -> serde_json::Value {
        self.0
            .iter()
            .map(|(name, (calls, usec))| {
                (
                    name.clone(),
                    json!({"calls": to_f64(*calls) / ops, "usec": to_f64(*usec) / ops}),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

/// A snapshot of the server's command counters and CPU, and of this process's CPU.
#[derive(Debug)]
struct Probe {
    commands: CommandStats,
    server_cpu_s: f64,
    client_cpu_s: f64,
    at: Instant,
}

/// What the server and this process did between [`Probe::start`] and [`Probe::stop`].
#[derive(Debug, Default)]
struct Usage {
    /// Calls per command, counting the commands scripts run inside the server too.
    commands: CommandStats,
    server_cpu_s: f64,
    client_cpu_s: f64,
    elapsed_s: f64,
}

impl Probe {
    async fn start(fred: &Client) -> anyhow::Result<Probe> {
        Ok(Probe {
            commands: CommandStats::read(fred).await?,
            server_cpu_s: server_cpu_seconds(fred).await?,
            client_cpu_s: cpu_seconds(),
            at: Instant::now(),
        })
    }

    async fn stop(self, fred: &Client) -> anyhow::Result<Usage> {
        let elapsed_s = self.at.elapsed().as_secs_f64();
        let client_cpu_s = cpu_seconds() - self.client_cpu_s;
        let server_cpu_s = server_cpu_seconds(fred).await? - self.server_cpu_s;
        let commands = CommandStats::read(fred).await?.delta(&self.commands);
        Ok(Usage {
            commands,
            server_cpu_s,
            client_cpu_s,
            elapsed_s,
        })
    }
}

impl Usage {
    fn add(&mut self, other: Usage) {
        self.commands.add(&other.commands);
        self.server_cpu_s += other.server_cpu_s;
        self.client_cpu_s += other.client_cpu_s;
        self.elapsed_s += other.elapsed_s;
    }

    /// Commands clients sent (one round trip each): all calls minus those run inside scripts.
    fn round_trips(&self, nested: &[&str]) -> f64 {
        self.commands.total()
            - nested
                .iter()
                .map(|name| self.commands.calls(name))
                .sum::<f64>()
    }

    fn json(&self, ops: u64, nested: &[&str]) -> serde_json::Value {
        let ops = to_f64(ops.max(1));
        json!({
            "ops": ops,
            "elapsed_s": self.elapsed_s,
            "round_trips_per_op": self.round_trips(nested) / ops,
            "commands_per_op_incl_scripts": self.commands.per_op(ops),
            "client_cpu_us_per_op": self.client_cpu_s * 1e6 / ops,
            "server_cpu_us_per_op": self.server_cpu_s * 1e6 / ops,
            "server_exec_us_per_op": self.commands.exec_us(nested) / ops,
        })
    }
}

fn info_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
}

/// CPU time of this process, in seconds: the sum of its threads' run time from
/// `/proc/self/task/*/schedstat` (nanoseconds), else utime + stime from `/proc/self/stat`
/// (clock ticks, too coarse for short batches). Threads that already ended are not counted,
/// which is fine here: tokio's workers live as long as the runtime.
fn cpu_seconds() -> f64 {
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        let mut nanos = 0_u64;
        let mut any = false;
        for task in tasks.flatten() {
            let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
                continue;
            };
            if let Some(ran) = text
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
            {
                nanos += ran;
                any = true;
            }
        }
        if any {
            return to_f64(nanos) / 1e9;
        }
    }
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may contain spaces) start with field 3 (state).
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime is field 14 and stime field 15: indexes 11 and 12 counting from the state field.
    to_f64(ticks(11) + ticks(12)) / clock_ticks_per_second()
}

fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse::<f64>().ok())
            .filter(|ticks| *ticks > 0.0)
            .unwrap_or(100.0)
    })
}

fn load_average() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg").ok().map(|text| {
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    })
}

/// The server's own CPU time (`INFO cpu`), in seconds.
async fn server_cpu_seconds(fred: &Client) -> anyhow::Result<f64> {
    let text: String = fred.info(Some(InfoKind::Cpu)).await?;
    let field = |name| {
        info_field(&text, name)
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok(field("used_cpu_user") + field("used_cpu_sys"))
}

// --- output -------------------------------------------------------------------------------------

/// One line of the report; an empty scenario continues the one above.
#[derive(Debug, Clone)]
struct Row {
    scenario: String,
    metric: String,
    value: f64,
    unit: &'static str,
    ratio: Option<f64>,
    goal: Option<Goal>,
}

#[derive(Debug, Clone, Copy)]
enum Goal {
    AtMost(f64),
    AtLeast(f64),
}

impl Goal {
    fn met(self, ratio: f64) -> bool {
        match self {
            Goal::AtMost(limit) => ratio <= limit,
            Goal::AtLeast(limit) => ratio >= limit,
        }
    }

    fn text(self) -> String {
        match self {
            Goal::AtMost(limit) => format!("<= {limit}"),
            Goal::AtLeast(limit) => format!(">= {limit}"),
        }
    }
}

#[derive(Debug, Default)]
struct Report {
    rows: Vec<Row>,
    details: serde_json::Map<String, serde_json::Value>,
}

impl Report {
    fn info(&mut self, scenario: &str, metric: &str, value: f64, unit: &'static str) {
        self.rows.push(Row {
            scenario: scenario.to_owned(),
            metric: metric.to_owned(),
            value,
            unit,
            ratio: None,
            goal: None,
        });
    }

    fn ratio(
        &mut self,
        scenario: &str,
        metric: &str,
        (value, unit): (f64, &'static str),
        ratio: f64,
        goal: Option<Goal>,
    ) {
        self.rows.push(Row {
            scenario: scenario.to_owned(),
            metric: metric.to_owned(),
            value,
            unit,
            ratio: Some(ratio),
            goal,
        });
    }

    /// Round trips, client CPU, server CPU and server execution time per operation.
    fn costs(&mut self, scenario: &str, op: &str, usage: &Usage, ops: u64, nested: &[&str]) {
        let ops = to_f64(ops.max(1));
        self.info(
            scenario,
            &format!("round trips per {op}"),
            usage.round_trips(nested) / ops,
            "",
        );
        self.info(
            "",
            &format!("client CPU per {op}"),
            usage.client_cpu_s * 1e6 / ops,
            "us",
        );
        self.info(
            "",
            &format!("server CPU per {op}"),
            usage.server_cpu_s * 1e6 / ops,
            "us",
        );
        self.info(
            "",
            &format!("server command execution per {op}"),
            usage.commands.exec_us(nested) / ops,
            "us",
        );
    }

    fn detail(&mut self, name: &str, value: serde_json::Value) {
        self.details.insert(name.to_owned(), value);
    }
}

fn format_value(value: f64, unit: &str) -> String {
    let number = if value.abs() >= 1000.0 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    };
    if unit.is_empty() {
        number
    } else {
        format!("{number} {unit}")
    }
}

fn print_table(report: &Report) {
    let width = |f: fn(&Row) -> usize| report.rows.iter().map(f).max().unwrap_or(8).max(8);
    let scenario_width = width(|r| r.scenario.len());
    let metric_width = width(|r| r.metric.len());
    println!();
    println!(
        "{:<scenario_width$}  {:<metric_width$}  {:>12}  {:>7}  {:>7}  met?",
        "scenario", "metric", "value", "ratio", "goal"
    );
    println!("{}", "-".repeat(scenario_width + metric_width + 40));
    for row in &report.rows {
        if !row.scenario.is_empty() && !std::ptr::eq(row, &report.rows[0]) {
            println!();
        }
        let ratio = row.ratio.map_or_else(String::new, |r| format!("{r:.2}"));
        let goal = row.goal.map_or_else(String::new, Goal::text);
        let met = match (row.ratio, row.goal) {
            (Some(ratio), Some(goal)) if goal.met(ratio) => "yes",
            (Some(_), Some(_)) => "NO",
            _ => "",
        };
        println!(
            "{:<scenario_width$}  {:<metric_width$}  {:>12}  {ratio:>7}  {goal:>7}  {met}",
            row.scenario,
            row.metric,
            format_value(row.value, row.unit),
        );
    }
}

fn write_json(report: &Report, path: &Path, total: Duration) -> anyhow::Result<()> {
    let mut scenario = String::new();
    let rows: Vec<serde_json::Value> = report
        .rows
        .iter()
        .map(|row| {
            if !row.scenario.is_empty() {
                scenario.clone_from(&row.scenario);
            }
            json!({
                "scenario": scenario,
                "metric": row.metric,
                "value": row.value,
                "unit": row.unit,
                "ratio": row.ratio,
                "goal": row.goal.map(Goal::text),
                "met": match (row.ratio, row.goal) {
                    (Some(ratio), Some(goal)) => Some(goal.met(ratio)),
                    _ => None,
                },
            })
        })
        .collect();
    let document = json!({
        "rows": rows,
        "details": report.details,
        "duration_s": total.as_secs_f64(),
    });
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, serde_json::to_string_pretty(&document)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The two goal rows of the 1 ms-spin contention scenario, the same for every subject.
fn report_spin_contention(
    report: &mut Report,
    scenario: &str,
    rate: f64,
    ideal: f64,
    round_trips: f64,
) {
    report.ratio(
        scenario,
        "critical sections/s (1 ms spin) / ideal",
        (rate, "/s"),
        rate / ideal,
        None,
    );
    report.ratio(
        "",
        "round trips per acquisition",
        (round_trips, ""),
        round_trips,
        Some(Goal::AtMost(4.0)),
    );
}
