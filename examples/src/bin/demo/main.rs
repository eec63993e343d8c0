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

mod check;
mod output;
mod worker;

use std::io::IsTerminal as _;
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use sage_lock_examples::{ThrowawayServer, Usage, flag_value, has_flag};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::check::Check;
use crate::output::{draw_bar, print_summary, progress_text};

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
            bail!(
                "--seconds must be more than 0 and less than 3600, got {}",
                settings.seconds
            );
        }
        Ok(settings)
    }
}

/// What the demo's command line may hold.
const USAGE: Usage<'static> = Usage {
    flags: &["--valkey", "--break-exclusivity"],
    valued: &["--workers", "--keys", "--seconds"],
    text: "usage: cargo run -p sage-lock-examples --release --bin demo -- [--workers N] \
           [--keys N] [--seconds S] [--valkey] [--break-exclusivity]",
};

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
        match USAGE.check_command_line() {
            Ok(true) => runtime.block_on(parent()),
            Ok(false) => Ok(ExitCode::SUCCESS),
            Err(error) => Err(error),
        }
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {}", sage_lock_examples::report(&error));
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
    let mut interrupt = std::pin::pin!(server.interrupted());
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
        let tick = Duration::from_millis(if tty { 100 } else { 250 });
        tokio::select! {
            () = tokio::time::sleep(tick) => {}
            () = &mut interrupt => {
                // Ctrl-C: stop the workers (dropping their tasks kills them), give their last
                // commands time to land, and take the run's data off the server.
                for reader in &readers {
                    reader.abort();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                if tty {
                    eprintln!();
                }
                match check::clean_up(&server, &run, &settings).await {
                    Ok(()) => eprintln!("interrupted: workers stopped, the run's data removed"),
                    Err(error) => eprintln!(
                        "interrupted: workers stopped; could not remove the run's data \
                         (keys demo:{run}:*): {}",
                        sage_lock_examples::report(&error)
                    ),
                }
                return Ok(ExitCode::from(130));
            }
        }
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
    if failures.is_empty() && views.iter().all(|v| v.ops == 0) {
        eprintln!(
            "\nno critical section ran: every acquisition timed out (the workers' errors above \
             say why). On a cluster, or a primary with replicas, a lock waits by default for a \
             replica to acknowledge it, so a primary without one grants nothing: give each \
             primary a replica (a service on such a deployment turns acknowledgement off: \
             LockOptions::replica_acknowledgement(false), or in its service defaults)."
        );
        return Ok(ExitCode::from(2));
    }
    if !failures.is_empty() || views.iter().any(|v| v.done.is_none()) {
        eprintln!("\nsome workers failed: {}", failures.join("; "));
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}
