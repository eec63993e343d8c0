//! A job scheduled on every instance runs exactly once per tick: ShedLock's pattern, with
//! `try_with_lock` and a minimum hold.
//!
//! ```text
//! cargo run -p sage-lock-examples --bin scheduled [-- --instances 3 --ticks 3 --interval-ms 10000 --valkey]
//! ```
//!
//! The parent starts a throwaway server (or uses `SAGE_LOCK_URL`) and re-executes itself as
//! `--instances` instance processes, the way a service runs on several machines. Every instance
//! wakes at each tick of the same schedule (every `--interval-ms`, with a random delay of up to a
//! tenth of the interval, as clocks and schedulers differ) and calls the job under
//! `try_with_lock` with `hold_at_least` set to half the interval (`--hold-ms`):
//!
//! - the first instance to wake runs the job; the job is quick, but the key stays held for the
//!   minimum hold, so the instances that wake a little later find it busy and skip the tick;
//! - the key is free again well before the next tick.
//!
//! Half the interval tolerates an instance waking up to half an interval late (or early) in
//! both directions. With `#[locked]` the same job is
//! `#[locked(key = "nightly-report", try_lock, hold_at_least = "5s")]`.
//!
//! Instances print `tick K ran|skipped instance I` lines; the parent prints one row per tick and
//! exits non-zero unless every tick ran exactly once.
//!
//! Instance mode (what the parent runs, also used by the tests):
//! `scheduled --instance I --url URL --namespace NS --start-ms UNIX_MS --interval-ms MS --ticks N`.

use std::collections::BTreeMap;
use std::num::{NonZeroU64, NonZeroUsize};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use rand::Rng as _;
use sage_lock::{LockClient, LockOptions, current_lease};
use sage_lock_examples::{ThrowawayServer, Usage, flag_value, has_flag};
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// The schedule every instance follows.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    /// Wall-clock time of tick 0, in ms since the Unix epoch.
    start_ms: u64,
    interval: Duration,
    ticks: u64,
    hold_at_least: Duration,
}

impl Schedule {
    fn from_args(start_ms: u64) -> anyhow::Result<Schedule> {
        let interval = Duration::from_millis(flag_value("--interval-ms")?.unwrap_or(10_000));
        if interval < Duration::from_millis(200) {
            bail!("--interval-ms must be at least 200");
        }
        if interval > Duration::from_secs(86_400) {
            bail!("--interval-ms must be at most 86400000 (a day): the demo waits for its ticks");
        }
        let hold_at_least = flag_value("--hold-ms")?.map_or(interval / 2, Duration::from_millis);
        if hold_at_least > Duration::from_secs(365 * 86_400) {
            bail!("--hold-ms must be at most 31536000000 (one year, the longest minimum hold)");
        }
        Ok(Schedule {
            start_ms: flag_value("--start-ms")?.unwrap_or(start_ms),
            interval,
            ticks: flag_value::<NonZeroU64>("--ticks")?.map_or(3, NonZeroU64::get),
            hold_at_least,
        })
    }

    fn args(&self) -> Vec<String> {
        vec![
            "--start-ms".into(),
            self.start_ms.to_string(),
            "--interval-ms".into(),
            self.interval.as_millis().to_string(),
            "--hold-ms".into(),
            self.hold_at_least.as_millis().to_string(),
            "--ticks".into(),
            self.ticks.to_string(),
        ]
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

/// What this binary's command line may hold.
const USAGE: Usage<'static> = Usage {
    flags: &["--valkey", "--watch-parent"],
    valued: &[
        "--interval-ms",
        "--hold-ms",
        "--start-ms",
        "--ticks",
        "--instance",
        "--url",
        "--namespace",
        "--instances",
    ],
    text: "usage: cargo run -p sage-lock-examples --bin scheduled -- [--instances N] [--ticks N] [--interval-ms MS] [--hold-ms MS] [--valkey]",
};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    sage_lock_examples::finish(run().await)
}

async fn run() -> anyhow::Result<ExitCode> {
    if !USAGE.check_command_line()? {
        return Ok(ExitCode::SUCCESS);
    }
    match flag_value::<usize>("--instance")? {
        Some(instance) => instance_main(instance).await.map(|()| ExitCode::SUCCESS),
        None => parent_main().await,
    }
}

/// One instance: wakes at every tick and runs the job if no other instance did.
async fn instance_main(instance: usize) -> anyhow::Result<()> {
    let url: String = flag_value("--url")?.context("--url is required with --instance")?;
    let namespace: String = flag_value("--namespace")?.unwrap_or_else(|| "scheduled".into());
    let schedule = Schedule::from_args(now_ms())?;
    // Started by the parent (`--watch-parent`), which holds our stdin open while it lives:
    // stop when it goes away, however it ends (killed, interrupted), instead of running on
    // alone. An instance started otherwise (by hand, by a test) runs its ticks.
    if has_flag("--watch-parent") {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            eprintln!("instance {instance}: the parent process went away; stopping");
            std::process::exit(3);
        });
    }
    let client = LockClient::connect(&url).await?;
    let jobs = client.lock_with::<str>(
        LockOptions::new()
            .namespace(namespace)
            .lease(Duration::from_secs(30))
            .hold_at_least(schedule.hold_at_least),
    )?;
    let interval_ms = u64::try_from(schedule.interval.as_millis())?;
    for tick in 0..schedule.ticks {
        let jitter = rand::rng().random_range(0..=interval_ms / 10);
        let wake_at = schedule.start_ms + tick * interval_ms + jitter;
        tokio::time::sleep(Duration::from_millis(wake_at.saturating_sub(now_ms()))).await;
        let ran = jobs
            .try_with_lock("nightly-report", async {
                // The job: quick, but the lock stays held for the minimum hold.
                tokio::time::sleep(Duration::from_millis(20)).await;
                current_lease().map_or(0, |lease| lease.fencing_token())
            })
            .await?;
        match ran {
            Some(fence) => println!("tick {tick} ran instance {instance} fence {fence}"),
            None => println!("tick {tick} skipped instance {instance}"),
        }
    }
    client.quit().await;
    Ok(())
}

/// Starts the instances and checks that every tick ran exactly once.
async fn parent_main() -> anyhow::Result<ExitCode> {
    let server = ThrowawayServer::start()?;
    let instances = flag_value::<NonZeroUsize>("--instances")?.map_or(3, NonZeroUsize::get);
    // Tick 0 a second from now: time for the instances to start and connect.
    let schedule = Schedule::from_args(now_ms() + 1_000)?;
    println!(
        "{instances} instances, a tick every {:?} ({} ticks), minimum hold {:?}, on {}",
        schedule.interval,
        schedule.ticks,
        schedule.hold_at_least,
        server.description()
    );
    let namespace = format!("scheduled-{}", schedule.start_ms);
    let exe = std::env::current_exe().context("finding this program's path")?;
    let mut children = Vec::new();
    for instance in 0..instances {
        let mut command = tokio::process::Command::new(&exe);
        command
            .args(["--instance", &instance.to_string(), "--url", server.url()])
            .args(["--namespace", &namespace, "--watch-parent"])
            .args(schedule.args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        children.push(command.spawn().context("starting an instance")?);
    }
    let mut runs: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for child in &mut children {
        let stdout = child.stdout.take().context("instance stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        while let Some(line) = lines.next_line().await? {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["tick", tick, "ran", "instance", instance, ..] = words.as_slice() {
                runs.entry(tick.parse()?)
                    .or_default()
                    .push((*instance).to_owned());
            }
        }
    }
    for mut child in children {
        let status = child.wait().await?;
        if !status.success() {
            bail!("an instance failed: {status}");
        }
    }
    println!("{:>5}  ran on instance(s)", "tick");
    let mut correct = true;
    for tick in 0..schedule.ticks {
        let ran = runs.get(&tick).cloned().unwrap_or_default();
        correct &= ran.len() == 1;
        println!("{tick:>5}  {}", ran.join(", "));
    }
    if correct {
        println!("CORRECT: every tick ran exactly once");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("WRONG: some tick did not run exactly once");
        Ok(ExitCode::FAILURE)
    }
}
