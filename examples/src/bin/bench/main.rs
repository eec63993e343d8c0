//! Benchmark: sage-lock against the server's own limits and against `rslock`, in one run.
//!
//! ```text
//! cargo run -p sage-lock-examples --release --bin bench [-- --quick] [--json PATH] [--valkey] [--keep-awake] [--only SUITES]
//! ```
//!
//! Starts its own throwaway server (or uses `SAGE_LOCK_URL`; not with `--valkey` or `--both`,
//! which name the servers to measure and start throwaway ones) and measures, reporting ratios:
//!
//! - the server's limits: `PING` round trip (1 task, sequential) and `SET` throughput (64 tasks on
//!   one shared fred client);
//! - uncontended acquire + release latency (`with_lock`, empty body) against 2 × `PING`, on a
//!   multi-thread and on a current-thread runtime;
//! - throughput of 8 tasks on distinct keys against `SET` throughput and rslock's;
//! - contention: 8 tasks in the bench process on one key with 1 ms critical sections against the ideal
//!   1 / (1 ms + RTT), and round trips per acquisition;
//! - multi-process contention: 1 process × 8 tasks and 4 processes × 2 tasks on one key, started
//!   together, against the same ideal and against the ideal with the round trip a release pays
//!   here (`PING` sent right after a 1 ms spin, when the server has idled);
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
//! (default `<workspace>/target/bench.json`). On `SAGE_LOCK_URL`'s server it removes its keys
//! when it ends (see [`BENCH_KEYS`]).

mod contention;
mod latency;
mod measure;
mod peer;
mod primitives;
mod renewal;
mod report;
mod throughput;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fred::interfaces::ClientLike as _;
use fred::types::InfoKind;
use rslock::LockManager;
use sage_lock::{LockClient, LockOptions};
use sage_lock_examples::{
    ServerKind, ThrowawayServer, URL_VARIABLE, Usage, flag_value, has_flag, workspace_root,
};
use serde_json::json;

use crate::contention::{contention_suite, multi_process_suite};
use crate::latency::{current_thread_latency, latency_suite, report_latency};
use crate::measure::{Spinners, info_field, load_average};
use crate::primitives::primitives_suite;
use crate::renewal::{renewal_at_scale, report_renewal};
use crate::report::{Report, print_table, write_json};
use crate::throughput::{report_throughput, throughput_suite};

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

/// Every key the benchmark writes, as `SCAN` patterns: its locks' (namespaces `bench`,
/// `bench-primitives`, `bench-renew`, `bench-mp`: each key's fencing counter and grant marker
/// stay), the floors' and `SET`'s (`{bench:floor:N}...`, `bench:*`) and rslock's. Removed at the
/// end from a server of the user's (`SAGE_LOCK_URL`).
const BENCH_KEYS: [&str; 7] = [
    "{bench:*",
    "{bench-primitives:*",
    "{bench-renew:*",
    "{bench-mp:*",
    "bench:*",
    "rslock:*",
    "rslock-mp:*",
];

/// Commands sage-lock's scripts run inside the server (`INFO commandstats` counts them too).
/// Every command sage-lock sends is a script (`EVALSHA`, `EVAL` after `NOSCRIPT`), except the
/// uncontended release on Valkey 9, which is `DELIFEQ` itself.
const SAGE_NESTED: &[&str] = &[
    "set",
    "incr",
    "get",
    "pexpire",
    "pttl",
    "del",
    "lindex",
    "lpop",
    "rpush",
    "lrem",
    "zadd",
    "zrem",
    "zscore",
    "exists",
    "time",
    "spublish",
    "zcard",
    "zcount",
    "zrange",
    "zremrangebyscore",
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

/// The suites `--only` may name (the latency suites always run: the others' ratios use them).
const SUITES: [&str; 6] = [
    "latency",
    "throughput",
    "primitives",
    "contention",
    "multi-process",
    "renewal",
];

/// What this benchmark's command line may hold.
const USAGE: Usage<'static> = Usage {
    flags: &["--quick", "--valkey", "--both", "--keep-awake"],
    valued: &["--json", "--only"],
    text: "usage: cargo run -p sage-lock-examples --release --bin bench -- [--quick] \
           [--json PATH] [--valkey | --both] [--keep-awake] [--only SUITES]\n  SUITES: a \
           comma-separated list of latency, throughput, primitives, contention, multi-process, \
           renewal (the latency suites always run)",
};

fn main() -> anyhow::Result<()> {
    if let Some(worker) = sage_lock_examples::multiprocess::worker_main() {
        return worker;
    }
    if !USAGE.check_command_line()? {
        return Ok(());
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
/// `bench-redis.json` and `bench-valkey.json` next to the `--json` path), each on a throwaway
/// server of its own: `SAGE_LOCK_URL` is ignored (its server is of one kind only).
fn both_servers() -> anyhow::Result<()> {
    if url_is_set() {
        eprintln!(
            "--both: measuring a throwaway redis-server, then a throwaway valkey-server; \
             {URL_VARIABLE} is ignored (unset --both to measure its server)"
        );
    }
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
            .env_remove(URL_VARIABLE)
            .status()?;
        anyhow::ensure!(status.success(), "the {kind} run failed");
    }
    Ok(())
}

async fn run() -> anyhow::Result<()> {
    // `--only a,b`: run only these suites (latency, throughput, primitives, contention,
    // multi-process, renewal), e.g. to profile one of them.
    let only: Option<String> = flag_value::<String>("--only")?;
    if let Some(unknown) = only
        .as_deref()
        .and_then(|only| only.split(',').find(|suite| !SUITES.contains(suite)))
    {
        anyhow::bail!("--only: unknown suite `{unknown}`\n{}", USAGE.text);
    }
    let json_path: PathBuf = flag_value::<PathBuf>("--json")?
        .unwrap_or_else(|| workspace_root().join("target").join("bench.json"));
    let server = bench_server()?;
    let mut interrupted = false;
    let measured = tokio::select! {
        measured = measure(&server, only.as_deref(), &json_path) => measured,
        // Ctrl-C on the user's server (a throwaway one stops, and this process exits, by
        // itself): stop measuring (worker processes are killed with their handles), clean up.
        () = server.interrupted() => {
            interrupted = true;
            Ok(())
        }
    };
    if !server.is_private() {
        // The user's server: take the benchmark's keys off it, whether or not it finished.
        if let Err(error) = remove_keys(server.url()).await {
            eprintln!(
                "could not remove the benchmark's keys ({}) from the server: {}",
                BENCH_KEYS.join(" "),
                sage_lock_examples::report(&error)
            );
        }
    }
    if interrupted {
        eprintln!("interrupted");
        // As a shell expects of an interrupted program (nothing is left to drop: the server
        // is the user's, the measuring clients and worker processes are gone).
        std::process::exit(130);
    }
    measured
}

fn url_is_set() -> bool {
    std::env::var_os(URL_VARIABLE).is_some_and(|url| !url.is_empty())
}

/// The server to measure: with `--valkey` a throwaway `valkey-server` (the flag names the
/// server, so `SAGE_LOCK_URL` is ignored, saying so), else `SAGE_LOCK_URL`'s server, else a
/// throwaway `redis-server`.
fn bench_server() -> anyhow::Result<ThrowawayServer> {
    if has_flag("--valkey") {
        if url_is_set() {
            eprintln!(
                "--valkey: measuring a throwaway valkey-server; {URL_VARIABLE} is ignored (unset \
                 --valkey to measure its server)"
            );
        }
        return ThrowawayServer::start_kind(ServerKind::Valkey);
    }
    ThrowawayServer::start()
}

/// Deletes every key the benchmark wrote ([`BENCH_KEYS`]) from the server at `url`.
async fn remove_keys(url: &str) -> anyhow::Result<()> {
    let client = LockClient::connect(url).await?;
    let mut removed = 0;
    let mut result = Ok(());
    for pattern in BENCH_KEYS {
        match sage_lock_examples::cleanup::delete_matching(client.fred(), pattern).await {
            Ok(count) => removed += count,
            Err(error) => {
                result = Err(error.into());
                break;
            }
        }
    }
    client.quit().await;
    if result.is_ok() {
        eprintln!("removed the benchmark's {removed} keys from the server");
    }
    result
}

/// Every suite `only` allows (all when `None`), against `server`; the report to stdout and
/// `json_path`.
async fn measure(
    server: &ThrowawayServer,
    only: Option<&str>,
    json_path: &Path,
) -> anyhow::Result<()> {
    let quick = has_flag("--quick");
    let keep_awake = has_flag("--keep-awake");
    let wants = |suite: &str| only.is_none_or(|only| only.split(',').any(|s| s == suite));
    let plan = Plan::new(quick);
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
    eprintln!(
        "latency: PING, sage-lock, rslock, bare fred (interleaved), multi-thread runtime ..."
    );
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
        eprintln!("throughput: SET, sage-lock, rslock, bare fred (interleaved) ...");
        let throughput = throughput_suite(&fred, &locks, &manager, &plan).await?;
        report_throughput(&mut report, &throughput);
    }
    if wants("primitives") {
        eprintln!("primitives: mutex, read lock, semaphore ({PRIMITIVE_TASKS} tasks) ...");
        primitives_suite(&mut report, &client, &fred, &plan).await?;
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
        report_renewal(&mut report, &renewal, &plan, None);
        eprintln!(
            "renewal at scale again, one call per tick: renewal_batch_limit({}) ...",
            plan.renew_locks
        );
        let one_call = LockClient::builder()
            .url(server.url())
            .renewal_batch_limit(plan.renew_locks)
            .connect()
            .await?;
        let renewal = renewal_at_scale(&one_call, &plan).await?;
        report_renewal(&mut report, &renewal, &plan, Some(plan.renew_locks));
        one_call.quit().await;
    }

    client.quit().await;
    let total = started.elapsed();
    print_table(&report);
    eprintln!("\nfinished in {:.1} s", total.as_secs_f64());
    write_json(&report, json_path, total)?;
    eprintln!("wrote {}", json_path.display());
    Ok(())
}
