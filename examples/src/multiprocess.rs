//! The multi-process contention scenario of the benchmark: several OS processes (the benchmark
//! binary re-executed as workers) take turns on one key, all started at the same wall-clock
//! instant, and each reports how many critical sections it ran, how many waits timed out and
//! how long each wait took.
//!
//! A worker is the benchmark binary run with [`WORKER_FLAG`] first; [`worker_main`] handles that.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use sage_lock::{LockClient, LockError, LockOptions};

/// The first argument that turns the benchmark binary into a worker.
pub const WORKER_FLAG: &str = "--multiprocess-worker";

/// Which library a worker uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// sage-lock's `with_lock`.
    SageLock,
    /// rslock's `lock`, called again while busy until the wait runs out.
    Rslock,
}

impl Subject {
    fn arg(self) -> &'static str {
        match self {
            Subject::SageLock => "sage-lock",
            Subject::Rslock => "rslock",
        }
    }
}

/// One scenario: `processes` × `tasks` on one key, `section` long critical sections (spinning),
/// waits of at most `wait`, for `run`.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// Worker processes.
    pub processes: usize,
    /// Tasks per process.
    pub tasks: usize,
    /// Measuring time.
    pub run: Duration,
    /// Critical section (busy-waiting, like CPU-bound work).
    pub section: Duration,
    /// Longest wait for the lock before it counts as a timeout.
    pub wait: Duration,
}

/// What one worker process reported.
#[derive(Debug, Clone, Default)]
pub struct ProcessReport {
    /// Critical sections run.
    pub sections: u64,
    /// Waits that timed out.
    pub timeouts: u64,
    /// Every completed wait, in microseconds.
    pub waits_us: Vec<u64>,
}

/// Worker processes started for one scenario; [`Running::finish`] collects their reports.
#[derive(Debug)]
pub struct Running {
    children: Vec<tokio::process::Child>,
    subject: Subject,
    /// When the workers begin (they connect before).
    pub starts_at: Instant,
}

/// Starts `scenario`'s workers for `subject` against `url` on `key`; they begin together at
/// [`Running::starts_at`], 1.5 s from now.
///
/// # Errors
/// A worker that could not start.
pub fn spawn(
    subject: Subject,
    url: &str,
    key: &str,
    scenario: Scenario,
) -> anyhow::Result<Running> {
    let exe = std::env::current_exe().context("locating the benchmark binary")?;
    let lead = Duration::from_millis(1500);
    let start_ms = unix_ms()? + u64::try_from(lead.as_millis())?;
    let mut children = Vec::new();
    for _ in 0..scenario.processes {
        let child = tokio::process::Command::new(&exe)
            .args([
                WORKER_FLAG,
                subject.arg(),
                url,
                key,
                &scenario.tasks.to_string(),
                &scenario.run.as_millis().to_string(),
                &scenario.section.as_micros().to_string(),
                &scenario.wait.as_millis().to_string(),
                &start_ms.to_string(),
            ])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting a worker process")?;
        children.push(child);
    }
    Ok(Running {
        children,
        subject,
        starts_at: Instant::now() + lead,
    })
}

impl Running {
    /// Waits for every worker and returns their reports, in start order.
    ///
    /// # Errors
    /// A worker that failed or printed no report.
    pub async fn finish(self) -> anyhow::Result<Vec<ProcessReport>> {
        let mut reports = Vec::new();
        for child in self.children {
            let output = child.wait_with_output().await?;
            let text = String::from_utf8_lossy(&output.stdout);
            if !output.status.success() {
                bail!("a {} worker failed: {text}", self.subject.arg());
            }
            reports.push(parse_report(&text).context("reading a worker's report")?);
        }
        Ok(reports)
    }
}

fn parse_report(text: &str) -> anyhow::Result<ProcessReport> {
    let mut report = ProcessReport::default();
    for field in text.split_whitespace() {
        if let Some(n) = field.strip_prefix("sections=") {
            report.sections = n.parse()?;
        } else if let Some(n) = field.strip_prefix("timeouts=") {
            report.timeouts = n.parse()?;
        } else if let Some(list) = field.strip_prefix("waits_us=") {
            report.waits_us = list
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::parse)
                .collect::<Result<_, _>>()?;
        }
    }
    Ok(report)
}

fn unix_ms() -> anyhow::Result<u64> {
    Ok(u64::try_from(
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis(),
    )?)
}

/// Runs a worker when the command line starts with [`WORKER_FLAG`]: `None` otherwise.
#[must_use]
pub fn worker_main() -> Option<anyhow::Result<()>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some(WORKER_FLAG) {
        return None;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    Some(match runtime {
        Ok(runtime) => runtime.block_on(worker(&args[1..])),
        Err(error) => Err(error.into()),
    })
}

async fn worker(args: &[String]) -> anyhow::Result<()> {
    let [
        subject,
        url,
        key,
        tasks,
        run_ms,
        section_us,
        wait_ms,
        start_ms,
    ] = args
    else {
        bail!(
            "usage: {WORKER_FLAG} <subject> <url> <key> <tasks> <run-ms> <section-us> <wait-ms> <start-unix-ms>"
        );
    };
    let tasks: usize = tasks.parse()?;
    let run = Duration::from_millis(run_ms.parse()?);
    let section = Duration::from_micros(section_us.parse()?);
    let wait = Duration::from_millis(wait_ms.parse()?);
    let start_ms: u64 = start_ms.parse()?;
    let attempt: Arc<dyn Fn() -> Attempt + Send + Sync> = match subject.as_str() {
        "sage-lock" => {
            let client = LockClient::connect(url).await?;
            let locks = client.lock_with::<str>(
                LockOptions::new()
                    .namespace("bench-mp")
                    .lease(Duration::from_secs(10)),
            )?;
            let key = key.clone();
            Arc::new(move || {
                let (locks, key) = (locks.clone(), key.clone());
                Box::pin(async move {
                    match locks
                        .with_lock(key.as_str(), wait, async { spin(section) })
                        .await
                    {
                        Ok(()) => Ok(true),
                        Err(LockError::TimedOut { .. }) => Ok(false),
                        Err(error) => Err(error.into()),
                    }
                })
            })
        }
        "rslock" => {
            let manager = rslock::LockManager::new(vec![url.clone()]);
            let key = format!("rslock-mp:{key}").into_bytes();
            Arc::new(move || {
                let (manager, key) = (manager.clone(), key.clone());
                Box::pin(async move {
                    let asked = Instant::now();
                    while asked.elapsed() < wait {
                        if let Ok(lock) =
                            manager.lock(key.as_slice(), Duration::from_secs(10)).await
                        {
                            spin(section);
                            manager.unlock(&lock).await;
                            return Ok(true);
                        }
                    }
                    Ok(false)
                })
            })
        }
        other => bail!("unknown subject {other:?}"),
    };
    tokio::time::sleep(Duration::from_millis(start_ms.saturating_sub(unix_ms()?))).await;
    let stop = Instant::now() + run;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let attempt = Arc::clone(&attempt);
        handles.push(tokio::spawn(async move {
            let mut report = ProcessReport::default();
            while Instant::now() < stop {
                let asked = Instant::now();
                if attempt().await? {
                    report.sections += 1;
                    report
                        .waits_us
                        .push(u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX));
                } else {
                    report.timeouts += 1;
                }
            }
            anyhow::Ok(report)
        }));
    }
    let mut all = ProcessReport::default();
    for handle in handles {
        let report = handle.await??;
        all.sections += report.sections;
        all.timeouts += report.timeouts;
        all.waits_us.extend(report.waits_us);
    }
    let waits: Vec<String> = all.waits_us.iter().map(u64::to_string).collect();
    println!(
        "sections={} timeouts={} waits_us={}",
        all.sections,
        all.timeouts,
        waits.join(",")
    );
    Ok(())
}

type Attempt = std::pin::Pin<Box<dyn Future<Output = anyhow::Result<bool>> + Send>>;

/// Busy-waits for `duration` (a CPU-bound critical section).
fn spin(duration: Duration) {
    let start = Instant::now();
    while start.elapsed() < duration {
        std::hint::spin_loop();
    }
}
