//! Measurement helpers: server command counters and CPU, this process's CPU, task loops, busy loops.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::interfaces::ClientLike as _;
use fred::types::InfoKind;
use serde_json::json;

/// Lowest-priority busy loops (`nice -n 19`), one per core, stopped on drop.
#[derive(Debug)]
pub(crate) struct Spinners(Vec<std::process::Child>);

impl Spinners {
    pub(crate) fn start(count: usize) -> Spinners {
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

#[allow(clippy::cast_precision_loss)]
pub(crate) fn to_f64(n: u64) -> f64 {
    n as f64
}

pub(crate) fn duration_us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

pub(crate) fn spin(duration: Duration) {
    let start = Instant::now();
    while start.elapsed() < duration {
        std::hint::spin_loop();
    }
}

/// The round trip a hand-off pays on this machine: `PING` p50 (µs) sent right after a 1 ms
/// spinning body, as a release is. The server has idled for that millisecond and one core was
/// busy, so on a VM this includes waking an idle vCPU, which an isolated `PING` loop (or
/// `--keep-awake`) does not.
pub(crate) async fn ping_after_spin(fred: &Client, samples: usize) -> anyhow::Result<f64> {
    let mut rtts = Vec::with_capacity(samples);
    for _ in 0..samples {
        spin(Duration::from_millis(1));
        let start = Instant::now();
        let _: String = fred.ping(None).await?;
        rtts.push(nanos(start.elapsed()));
    }
    rtts.sort_unstable();
    Ok(to_f64(sage_lock_examples::percentile(&rtts, 0.5)) / 1000.0)
}

/// Runs `tasks` copies of `cycle` until `window` has passed; returns the cycles that counted.
pub(crate) async fn run_for<F, Fut>(tasks: usize, window: Duration, cycle: F) -> anyhow::Result<u64>
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
pub(crate) struct CommandStats(pub(crate) BTreeMap<String, (u64, u64)>);

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

    pub(crate) fn total(&self) -> f64 {
        to_f64(self.0.values().map(|(calls, _)| calls).sum())
    }

    pub(crate) fn calls(&self, name: &str) -> f64 {
        to_f64(self.0.get(name).map_or(0, |(calls, _)| *calls))
    }

    /// Execution time of the commands clients sent (scripts include what they run inside).
    pub(crate) fn exec_us(&self, nested: &[&str]) -> f64 {
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
pub(crate) struct Probe {
    commands: CommandStats,
    server_cpu_s: f64,
    client_cpu_s: f64,
    at: Instant,
}

/// What the server and this process did between [`Probe::start`] and [`Probe::stop`].
#[derive(Debug, Default)]
pub(crate) struct Usage {
    /// Calls per command, counting the commands scripts run inside the server too.
    pub(crate) commands: CommandStats,
    pub(crate) server_cpu_s: f64,
    pub(crate) client_cpu_s: f64,
    pub(crate) elapsed_s: f64,
}

impl Probe {
    pub(crate) async fn start(fred: &Client) -> anyhow::Result<Probe> {
        Ok(Probe {
            commands: CommandStats::read(fred).await?,
            server_cpu_s: server_cpu_seconds(fred).await?,
            client_cpu_s: cpu_seconds(),
            at: Instant::now(),
        })
    }

    pub(crate) async fn stop(self, fred: &Client) -> anyhow::Result<Usage> {
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
    pub(crate) fn add(&mut self, other: Usage) {
        self.commands.add(&other.commands);
        self.server_cpu_s += other.server_cpu_s;
        self.client_cpu_s += other.client_cpu_s;
        self.elapsed_s += other.elapsed_s;
    }

    /// Commands clients sent (one round trip each): all calls minus those run inside scripts.
    pub(crate) fn round_trips(&self, nested: &[&str]) -> f64 {
        self.commands.total()
            - nested
                .iter()
                .map(|name| self.commands.calls(name))
                .sum::<f64>()
    }

    pub(crate) fn json(&self, ops: u64, nested: &[&str]) -> serde_json::Value {
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

pub(crate) fn info_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
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

pub(crate) fn load_average() -> Option<String> {
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
