//! Profiling aid: the uncontended lock cycle alone, next to the same two round trips made with
//! fred directly, so `perf record -g` sees nothing else.
//!
//! ```text
//! cargo run -p sage-lock-examples --release --bin cycle -- [--valkey] [--seconds N] [--tasks N] [--subject sage|floor|fred|fred5|rslock]
//! ```
//!
//! Prints cycles/s and this process's CPU time per cycle for each subject. `floor` sends
//! sage-lock's own two commands with bare fred ([`sage_lock_examples::floor`]): the difference
//! to `sage` is sage-lock's own client work.

use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::interfaces::LuaInterface as _;
use sage_lock::{LockClient, LockOptions};
use sage_lock_examples::floor::Floor;
use sage_lock_examples::{ThrowawayServer, Usage, flag_value};

/// What this binary's command line may hold.
const USAGE: Usage<'static> = Usage {
    flags: &["--valkey"],
    valued: &["--seconds", "--tasks", "--subject"],
    text: "usage: cargo run -p sage-lock-examples --release --bin cycle -- [--valkey] [--seconds N] [--tasks N] [--subject sage|floor|fred|fred5|rslock]",
};

/// What `--subject` may name (all of them, in this order, without it).
const SUBJECTS: [&str; 5] = ["fred", "fred5", "floor", "rslock", "sage"];

#[tokio::main]
async fn main() -> std::process::ExitCode {
    sage_lock_examples::finish(run().await)
}

async fn run() -> anyhow::Result<()> {
    if !USAGE.check_command_line()? {
        return Ok(());
    }
    let seconds = flag_value::<NonZeroU64>("--seconds")?.map_or(5, NonZeroU64::get);
    let tasks = flag_value::<NonZeroUsize>("--tasks")?.map_or(64, NonZeroUsize::get);
    let subject: Option<String> = flag_value("--subject")?;
    if let Some(subject) = subject.as_deref()
        && !SUBJECTS.contains(&subject)
    {
        anyhow::bail!(
            "--subject {subject}: unknown; one of {}",
            SUBJECTS.join(", ")
        );
    }
    let server = ThrowawayServer::start()?;
    let client = LockClient::connect(server.url()).await?;
    let window = Duration::from_secs(seconds);
    for name in SUBJECTS {
        if subject.as_deref().is_some_and(|s| s != name) {
            continue;
        }
        let cpu_before = process_cpu();
        let started = Instant::now();
        let cycles = match name {
            "fred" => fred_cycles(client.fred(), tasks, window, false).await?,
            "fred5" => fred_cycles(client.fred(), tasks, window, true).await?,
            "floor" => floor_cycles(client.fred(), tasks, window).await?,
            "rslock" => rslock_cycles(server.url(), tasks, window).await?,
            _ => sage_cycles(&client, tasks, window).await?,
        };
        let elapsed = started.elapsed().as_secs_f64();
        let cpu = process_cpu() - cpu_before;
        println!(
            "{name}: {:.0} cycles/s, client CPU {:.2} us/cycle ({tasks} tasks, {seconds} s)",
            cycles as f64 / elapsed,
            cpu * 1e6 / cycles as f64
        );
    }
    client.quit().await;
    Ok(())
}

/// Runs `cycle` on one task per entry of `states` (each with its own state) until `window`
/// ends; returns the cycles completed.
async fn count_cycles<S, F, Fut>(states: Vec<S>, window: Duration, cycle: F) -> anyhow::Result<u64>
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let cycle = Arc::new(cycle);
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + window;
    let mut handles = Vec::new();
    for state in states {
        let (cycle, count, state) = (cycle.clone(), count.clone(), Arc::new(state));
        handles.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                cycle(Arc::clone(&state)).await?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for handle in handles {
        handle.await??;
    }
    Ok(count.load(Ordering::Relaxed))
}

/// Two `EVALSHA` round trips per cycle (a one-call script each): fred's own cost for a cycle.
async fn fred_cycles(
    fred: &Client,
    tasks: usize,
    window: Duration,
    wide: bool,
) -> anyhow::Result<u64> {
    let set: String = fred
        .script_load("return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 10000)")
        .await?;
    let del: String = fred
        .script_load("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0")
        .await?;
    let states = (0..tasks)
        .map(|task| {
            let key = format!("{{cycle:fred:{task}}}");
            let keys: Vec<String> = if wide {
                ["", ":fence", ":queue", ":waiters", ":since"]
                    .iter()
                    .map(|s| format!("{key}{s}"))
                    .collect()
            } else {
                vec![key]
            };
            let args: Vec<&str> = if wide {
                vec!["0123456789abcdef0123456789abcdef", "10000", "2000"]
            } else {
                vec!["t"]
            };
            (fred.clone(), set.clone(), del.clone(), keys, args)
        })
        .collect();
    count_cycles(states, window, |state| async move {
        let (fred, set, del, keys, args) = &*state;
        let _: fred::types::Value = fred.evalsha(set, keys.clone(), args.clone()).await?;
        let _: fred::types::Value = fred.evalsha(del, keys.clone(), args.clone()).await?;
        Ok(())
    })
    .await
}

/// sage-lock's two uncontended commands on bare fred.
async fn floor_cycles(fred: &Client, tasks: usize, window: Duration) -> anyhow::Result<u64> {
    let floor = Arc::new(Floor::prepare(fred, tasks).await?);
    let states = (0..tasks).map(|task| (Arc::clone(&floor), task)).collect();
    count_cycles(states, window, |state| async move {
        let (floor, task) = &*state;
        floor.sage_commands(*task).await
    })
    .await
}

/// rslock's `lock` + `unlock` (its own redis-rs connection): the peer's cost for a cycle.
async fn rslock_cycles(url: &str, tasks: usize, window: Duration) -> anyhow::Result<u64> {
    let manager = rslock::LockManager::new(vec![url.to_owned()]);
    let states = (0..tasks)
        .map(|task| (manager.clone(), format!("cycle:rslock:{task}").into_bytes()))
        .collect();
    count_cycles(states, window, |state| async move {
        let (manager, key) = &*state;
        let lock = manager
            .lock(key.as_slice(), Duration::from_secs(10))
            .await
            .map_err(|error| anyhow::anyhow!("rslock: {error}"))?;
        manager.unlock(&lock).await;
        Ok(())
    })
    .await
}

async fn sage_cycles(client: &LockClient, tasks: usize, window: Duration) -> anyhow::Result<u64> {
    let locks = client.lock_with::<str>(LockOptions::new().lease(Duration::from_secs(10)))?;
    let states = (0..tasks)
        .map(|task| (locks.clone(), format!("cycle:sage:{task}")))
        .collect();
    count_cycles(states, window, |state| async move {
        let (locks, key) = &*state;
        locks
            .with_lock(key.as_str(), Duration::from_secs(10), async {})
            .await?;
        Ok(())
    })
    .await
}

/// This process's CPU time (user + system), in seconds.
fn process_cpu() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}
