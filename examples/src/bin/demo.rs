//! Several processes contend for a few keys; the locks keep every critical section exclusive.
//!
//! ```text
//! cargo run -p sage-lock-examples --release --bin demo [-- --workers 4 --keys 3 --seconds 8 --valkey]
//! ```
//!
//! The parent starts a throwaway server (or uses `SAGE_LOCK_URL`) and re-executes itself as
//! `--workers` worker processes. Each worker sets its service defaults (500 ms lease, the run's
//! namespace) and installs its global client once, then repeatedly picks a key and calls its
//! critical section, an `async fn` annotated with `#[locked(key = "{attempt.key}", wait = "5s")]`,
//! which does a deliberately non-atomic read-modify-write of a per-key counter in Redis
//! (`GET`, some work, `SET`). Some bodies run longer than the lease, so the lock is renewed while
//! they run. Inside every critical section the worker also:
//!
//! - claims a per-key "owner" marker with `SET NX` (and deletes it on exit): finding a marker
//!   already there means two processes are inside at once (an overlap);
//! - checks that the lease's fencing token is larger than the last one stored for the key.
//!
//! Workers report to the parent as JSON lines on stdout. At the end the parent checks that every
//! counter equals the number of increments made to it and that no overlap was seen, and prints
//! `CORRECT`, or exits non-zero when exclusivity was violated.
//!
//! `--break-exclusivity` checks the checker: every worker then locks in a namespace of its own,
//! so the locks exclude nothing, and the run must end in `EXCLUSIVITY VIOLATED`.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use fred::clients::Client;
use fred::interfaces::KeysInterface as _;
use fred::types::{Expiration, SetOptions, Value};
use rand::Rng as _;
use sage_lock::global::{self, ServiceDefaults};
use sage_lock::{LockClient, LockError, current_lease, locked};
use sage_lock_examples::{ThrowawayServer, flag_value, has_flag, percentile};
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// Lease of the demo's locks (the workers' service default): short, so that long bodies need
/// renewals. How long a worker waits for a key is in the `#[locked]` attribute (5 s).
const LEASE: Duration = Duration::from_millis(500);
/// Share of bodies that run longer than the lease.
const LONG_BODY_SHARE: f64 = 0.02;

#[derive(Debug, Clone)]
struct Settings {
    workers: usize,
    keys: usize,
    seconds: f64,
    break_exclusivity: bool,
}

impl Settings {
    fn from_args() -> anyhow::Result<Settings> {
        let settings = Settings {
            workers: flag_value("--workers")?.unwrap_or(4),
            keys: flag_value("--keys")?.unwrap_or(3),
            seconds: flag_value("--seconds")?.unwrap_or(8.0),
            break_exclusivity: has_flag("--break-exclusivity"),
        };
        if settings.workers == 0 || settings.keys == 0 {
            bail!("--workers and --keys must be at least 1");
        }
        if !(settings.seconds > 0.0 && settings.seconds < 3600.0) {
            bail!("--seconds must be between 0 and 3600");
        }
        Ok(settings)
    }
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: could not start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let is_worker = std::env::args().nth(1).is_some_and(|arg| arg == "worker");
    let result = if is_worker {
        runtime.block_on(worker::run()).map(|()| ExitCode::SUCCESS)
    } else {
        runtime.block_on(parent())
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {error:#}");
        ExitCode::FAILURE
    })
}

fn key_name(index: usize) -> String {
    format!("key-{index}")
}

/// The server-side keys of the demo's own data (not the lock keys).
fn data_keys(run: &str, key: &str) -> (String, String, String) {
    (
        format!("demo:{run}:counter:{key}"),
        format!("demo:{run}:owner:{key}"),
        format!("demo:{run}:fence:{key}"),
    )
}

mod worker {
    use super::*;

    /// One attempt at a critical section: which key, and what to do under its lock.
    struct Attempt {
        key: String,
        counter_key: String,
        owner_key: String,
        fence_key: String,
        /// This section's owner marker (`worker-<id>:<op>`).
        marker: String,
        /// How long the read-modify-write takes.
        work: Duration,
        started: Instant,
        /// Whether to describe an overlap / a fencing regression on stderr (the first few only).
        log_overlap: bool,
        log_regression: bool,
    }

    /// What a critical section got done so far. Written through `&mut` as the body goes, so the
    /// caller still knows after a lost lock, when the body is dropped midway.
    #[derive(Default)]
    struct Progress {
        waited: Option<Duration>,
        marker_set: bool,
        incremented: bool,
    }

    /// What one critical section saw.
    struct Section {
        overlap: bool,
        fence_regression: bool,
    }

    /// The error of a critical section: the lock's (what `#[locked]` needs `From` for), or the
    /// body's own.
    enum SectionError {
        Lock(LockError),
        Body(anyhow::Error),
    }

    impl From<LockError> for SectionError {
        fn from(error: LockError) -> Self {
            SectionError::Lock(error)
        }
    }

    impl From<anyhow::Error> for SectionError {
        fn from(error: anyhow::Error) -> Self {
            SectionError::Body(error)
        }
    }

    impl From<fred::error::Error> for SectionError {
        fn from(error: fred::error::Error) -> Self {
            SectionError::Body(error.into())
        }
    }

    /// The critical section. It runs only while this process holds the lock on `attempt.key`,
    /// through the global client with the lease and namespace of the service defaults that
    /// [`run`] set; it waits up to 5 s for the lock, and the lock is renewed while it runs.
    #[locked(key = "{attempt.key}", wait = "5s")]
    async fn critical_section(
        fred: &Client,
        attempt: &Attempt,
        progress: &mut Progress,
    ) -> Result<Section, SectionError> {
        progress.waited = Some(attempt.started.elapsed());
        let lease = current_lease().context("no lease inside the body")?;
        let key = &attempt.key;

        // Enter: claim the owner marker. Already present = someone else is inside.
        let claimed: Value = fred
            .set(
                &attempt.owner_key,
                attempt.marker.as_str(),
                Some(Expiration::PX(60_000)),
                Some(SetOptions::NX),
                false,
            )
            .await?;
        progress.marker_set = !claimed.is_null();
        let overlap = !progress.marker_set;
        if overlap && attempt.log_overlap {
            let other: Option<String> = fred.get(&attempt.owner_key).await?;
            eprintln!(
                "{}: OVERLAP on {key}: {} is inside too",
                attempt.marker,
                other.as_deref().unwrap_or("someone")
            );
        }

        // Fencing tokens must strictly increase per key.
        let token = lease.fencing_token();
        let last: Option<u64> = fred.get(&attempt.fence_key).await?;
        let fence_regression = last.is_some_and(|last| token <= last);
        if fence_regression && attempt.log_regression {
            eprintln!(
                "{}: fencing token {token} on {key} is not above {last:?}",
                attempt.marker
            );
        }
        let () = fred
            .set(&attempt.fence_key, token, None, None, false)
            .await?;

        // The deliberately racy read-modify-write the lock protects.
        let value: Option<u64> = fred.get(&attempt.counter_key).await?;
        tokio::time::sleep(attempt.work).await;
        let () = fred
            .set(
                &attempt.counter_key,
                value.unwrap_or(0) + 1,
                None,
                None,
                false,
            )
            .await?;
        progress.incremented = true;

        if progress.marker_set {
            let _: i64 = fred.del(&attempt.owner_key).await?;
            progress.marker_set = false;
        }
        Ok(Section {
            overlap,
            fence_regression,
        })
    }

    pub(super) async fn run() -> anyhow::Result<()> {
        let url: String = flag_value("--url")?.context("worker needs --url")?;
        let run: String = flag_value("--run")?.context("worker needs --run")?;
        let id: usize = flag_value("--id")?.context("worker needs --id")?;
        let keys: usize = flag_value("--keys")?.context("worker needs --keys")?;
        let seconds: f64 = flag_value("--seconds")?.context("worker needs --seconds")?;
        // --break-exclusivity: a namespace per worker, so that the locks exclude nothing.
        let namespace = if has_flag("--break-exclusivity") {
            format!("demo-{run}-worker-{id}")
        } else {
            format!("demo-{run}")
        };
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .init();

        // The parent holds our stdin open while it lives: end when it goes away, however it ends.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            eprintln!("worker {id}: the parent process went away; stopping");
            std::process::exit(3);
        });

        // The lock configuration of this process, once: `#[locked]` functions that name no
        // lease, namespace or client get these. (The namespace is computed at run time here,
        // which an attribute argument cannot be.)
        global::set_defaults(ServiceDefaults::new().lease(LEASE).namespace(namespace))?;
        let client = LockClient::connect(&url).await?;
        global::install(client.clone())?;
        let fred = client.fred().clone();
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);

        let mut ops = 0_u64;
        let mut overlaps = 0_u64;
        let mut fence_regressions = 0_u64;
        let mut long_bodies = 0_u64;
        let mut errors = 0_u64;
        let mut increments: BTreeMap<String, u64> = BTreeMap::new();
        let mut waits_us: Vec<u64> = Vec::new();
        let mut last_report = Instant::now();

        while Instant::now() < deadline {
            let key = key_name(rand::rng().random_range(0..keys));
            let long = rand::rng().random_bool(LONG_BODY_SHARE);
            let work = if long {
                Duration::from_millis(rand::rng().random_range(550..900))
            } else {
                Duration::from_micros(rand::rng().random_range(0..4_000))
            };
            let (counter_key, owner_key, fence_key) = data_keys(&run, &key);
            let attempt = Attempt {
                key,
                counter_key,
                owner_key,
                fence_key,
                marker: format!("worker-{id}:{ops}"),
                work,
                started: Instant::now(),
                log_overlap: overlaps < 3,
                log_regression: fence_regressions < 3,
            };
            let mut progress = Progress::default();
            let outcome = critical_section(&fred, &attempt, &mut progress).await;
            let key = &attempt.key;
            // A body cut short (lost lock) may still have written the counter: count the
            // increment whenever its SET returned, whatever the outcome.
            if progress.incremented {
                *increments.entry(key.clone()).or_default() += 1;
            }
            match outcome {
                Ok(section) => {
                    ops += 1;
                    overlaps += u64::from(section.overlap);
                    fence_regressions += u64::from(section.fence_regression);
                    long_bodies += u64::from(long);
                }
                Err(SectionError::Body(error)) => {
                    errors += 1;
                    eprintln!("worker {id}: body failed on {key}: {error:#}");
                }
                Err(SectionError::Lock(LockError::TimedOut { .. })) => {}
                Err(SectionError::Lock(error @ LockError::LockLost { .. })) => {
                    eprintln!("worker {id}: {error}");
                }
                Err(SectionError::Lock(error)) => {
                    errors += 1;
                    eprintln!("worker {id}: {error}");
                }
            }
            if progress.marker_set {
                // The body was dropped (lock lost) while it held the marker: remove ours only.
                let current: Option<String> = fred.get(&attempt.owner_key).await.unwrap_or(None);
                if current.as_deref() == Some(attempt.marker.as_str()) {
                    let _: Result<i64, _> = fred.del(&attempt.owner_key).await;
                }
            }
            if let Some(waited) = progress.waited {
                waits_us.push(u64::try_from(waited.as_micros()).unwrap_or(u64::MAX));
            }
            if last_report.elapsed() >= Duration::from_millis(100) {
                last_report = Instant::now();
                emit(&json!({"kind": "progress", "worker": id, "ops": ops, "overlaps": overlaps}));
            }
        }

        let stats = client.stats();
        emit(&json!({
            "kind": "done",
            "worker": id,
            "ops": ops,
            "overlaps": overlaps,
            "fence_regressions": fence_regressions,
            "long_bodies": long_bodies,
            "errors": errors,
            "increments": increments,
            "waits_us": waits_us,
            "busy_retries": stats.busy_retries,
            "renewals": stats.renewals,
            "losses": stats.losses,
            "timeouts": stats.timeouts,
            "acquisitions": stats.acquisitions,
        }));
        client.quit().await;
        Ok(())
    }

    fn emit(line: &serde_json::Value) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// What the parent knows about one worker.
#[derive(Debug, Default, Clone)]
struct WorkerView {
    ops: u64,
    overlaps: u64,
    done: Option<serde_json::Value>,
    exited: Option<String>,
}

async fn parent() -> anyhow::Result<ExitCode> {
    let settings = Settings::from_args()?;
    let server = ThrowawayServer::start()?;
    let run = format!("{:08x}", rand::random::<u32>());
    eprintln!(
        "sage-lock demo: {} worker processes, {} keys, {}s, lease {LEASE:?}\nserver: {}",
        settings.workers,
        settings.keys,
        settings.seconds,
        server.description()
    );
    if settings.break_exclusivity {
        eprintln!(
            "--break-exclusivity: every worker locks in its own namespace; expect a violation"
        );
    }

    let exe = std::env::current_exe().context("finding this program's path")?;
    let views = Arc::new(Mutex::new(vec![WorkerView::default(); settings.workers]));
    let mut readers = Vec::new();
    for id in 0..settings.workers {
        let mut command = tokio::process::Command::new(&exe);
        command.arg("worker");
        if settings.break_exclusivity {
            command.arg("--break-exclusivity");
        }
        let mut child = command
            .args(["--url", server.url(), "--run", &run])
            .args(["--id", &id.to_string()])
            .args(["--keys", &settings.keys.to_string()])
            .args(["--seconds", &settings.seconds.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting worker {id}"))?;
        let stdout = child.stdout.take().context("worker stdout")?;
        // Held until the worker exits: its closing tells the worker that this process is gone.
        let stdin = child.stdin.take();
        let views = Arc::clone(&views);
        readers.push(tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                let mut views = views.lock().unwrap_or_else(PoisonError::into_inner);
                let view = &mut views[id];
                view.ops = message["ops"].as_u64().unwrap_or(view.ops);
                view.overlaps = message["overlaps"].as_u64().unwrap_or(view.overlaps);
                if message["kind"] == "done" {
                    view.done = Some(message);
                }
            }
            let status = child.wait().await;
            drop(stdin);
            let mut views = views.lock().unwrap_or_else(PoisonError::into_inner);
            views[id].exited = Some(match status {
                Ok(status) if status.success() => String::new(),
                Ok(status) => format!("worker {id} exited with {status}"),
                Err(error) => format!("worker {id}: {error}"),
            });
        }));
    }

    let started = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last_line = Instant::now();
    loop {
        let finished = readers.iter().all(tokio::task::JoinHandle::is_finished);
        let snapshot = views.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if tty {
            draw_bar(&snapshot, started.elapsed(), settings.seconds, finished);
        } else if finished || last_line.elapsed() >= Duration::from_secs(2) {
            last_line = Instant::now();
            eprintln!("{}", progress_text(&snapshot, started.elapsed()));
        }
        if finished {
            break;
        }
        tokio::time::sleep(Duration::from_millis(if tty { 100 } else { 250 })).await;
    }
    if tty {
        eprintln!();
    }

    let views = views.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let failures: Vec<String> = views
        .iter()
        .filter_map(|v| v.exited.clone().filter(|e| !e.is_empty()))
        .collect();
    let check = Check::new(&server, &run, &settings, &views).await?;
    print_summary(&views, &check);
    if !check.exclusive() {
        eprintln!(
            "\nEXCLUSIVITY VIOLATED: {} overlaps, {} lost updates, {} fencing regressions",
            check.overlaps, check.lost_updates, check.fence_regressions
        );
        return Ok(ExitCode::from(1));
    }
    if !failures.is_empty() || views.iter().any(|v| v.done.is_none()) {
        eprintln!("\nsome workers failed: {}", failures.join("; "));
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}

fn progress_text(views: &[WorkerView], elapsed: Duration) -> String {
    let total: u64 = views.iter().map(|v| v.ops).sum();
    let overlaps: u64 = views.iter().map(|v| v.overlaps).sum();
    let per_worker: Vec<String> = views
        .iter()
        .enumerate()
        .map(|(i, v)| format!("w{i} {}", v.ops))
        .collect();
    format!(
        "{:5.1}s  {total} critical sections  ({})  overlaps {overlaps}",
        elapsed.as_secs_f64(),
        per_worker.join(" · ")
    )
}

fn draw_bar(views: &[WorkerView], elapsed: Duration, seconds: f64, finished: bool) {
    const WIDTH: usize = 30;
    let fraction = if finished {
        1.0
    } else {
        (elapsed.as_secs_f64() / seconds).clamp(0.0, 1.0)
    };
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let filled = ((WIDTH as f64) * fraction).round() as usize;
    let bar = format!("{}{}", "█".repeat(filled), "░".repeat(WIDTH - filled));
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r\x1b[2K\x1b[36m{bar}\x1b[0m {}",
        progress_text(views, elapsed)
    );
    let _ = err.flush();
}

/// The end-of-run correctness check.
#[derive(Debug, Default)]
struct Check {
    /// key -> (counter in Redis, increments reported by workers)
    counters: BTreeMap<String, (u64, u64)>,
    overlaps: u64,
    lost_updates: u64,
    fence_regressions: u64,
}

impl Check {
    async fn new(
        server: &ThrowawayServer,
        run: &str,
        settings: &Settings,
        views: &[WorkerView],
    ) -> anyhow::Result<Check> {
        let client = LockClient::connect(server.url()).await?;
        let mut check = Check::default();
        for index in 0..settings.keys {
            let key = key_name(index);
            let (counter_key, owner_key, fence_key) = data_keys(run, &key);
            let stored: Option<u64> = client.fred().get(&counter_key).await?;
            let reported: u64 = views
                .iter()
                .filter_map(|v| v.done.as_ref())
                .filter_map(|d| d["increments"][&key].as_u64())
                .sum();
            let stored = stored.unwrap_or(0);
            check.lost_updates += reported.abs_diff(stored);
            check.counters.insert(key, (stored, reported));
            let _: i64 = client
                .fred()
                .del(vec![counter_key, owner_key, fence_key])
                .await?;
        }
        for done in views.iter().filter_map(|v| v.done.as_ref()) {
            check.overlaps += done["overlaps"].as_u64().unwrap_or(0);
            check.fence_regressions += done["fence_regressions"].as_u64().unwrap_or(0);
        }
        client.quit().await;
        Ok(check)
    }

    fn exclusive(&self) -> bool {
        self.overlaps == 0 && self.lost_updates == 0 && self.fence_regressions == 0
    }
}

#[allow(clippy::cast_precision_loss)]
fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

fn print_summary(views: &[WorkerView], check: &Check) {
    let field = |done: &serde_json::Value, name: &str| done[name].as_u64().unwrap_or(0);
    println!();
    println!(
        "{:<8} {:>8} {:>12} {:>12} {:>13} {:>9} {:>7} {:>9} {:>9}",
        "worker",
        "ops",
        "p50 wait ms",
        "p99 wait ms",
        "busy retries",
        "renewals",
        "losses",
        "timeouts",
        "overlaps"
    );
    let mut all_waits = Vec::new();
    let mut totals = [0_u64; 6];
    for (id, view) in views.iter().enumerate() {
        let Some(done) = &view.done else {
            println!("w{id:<7} (no report)");
            continue;
        };
        let mut waits: Vec<u64> = done["waits_us"]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
            .unwrap_or_default();
        waits.sort_unstable();
        let row = [
            field(done, "ops"),
            field(done, "busy_retries"),
            field(done, "renewals"),
            field(done, "losses"),
            field(done, "timeouts"),
            field(done, "overlaps"),
        ];
        for (total, value) in totals.iter_mut().zip(row) {
            *total += value;
        }
        println!(
            "w{id:<7} {:>8} {:>12.2} {:>12.2} {:>13} {:>9} {:>7} {:>9} {:>9}",
            row[0],
            ms(percentile(&waits, 0.50)),
            ms(percentile(&waits, 0.99)),
            row[1],
            row[2],
            row[3],
            row[4],
            row[5]
        );
        all_waits.extend(waits);
    }
    all_waits.sort_unstable();
    println!(
        "{:<8} {:>8} {:>12.2} {:>12.2} {:>13} {:>9} {:>7} {:>9} {:>9}",
        "total",
        totals[0],
        ms(percentile(&all_waits, 0.50)),
        ms(percentile(&all_waits, 0.99)),
        totals[1],
        totals[2],
        totals[3],
        totals[4],
        totals[5]
    );
    println!();
    println!("{:<8} {:>14} {:>14}  check", "key", "counter", "increments");
    for (key, (stored, reported)) in &check.counters {
        let verdict = if stored == reported { "ok" } else { "MISMATCH" };
        println!("{key:<8} {stored:>14} {reported:>14}  {verdict}");
    }
    println!();
    if check.exclusive() {
        println!(
            "CORRECT: every counter equals its increments, 0 overlaps, fencing tokens strictly increasing"
        );
    }
}
