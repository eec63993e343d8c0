//! Profiling aid: the gap between consecutive critical sections on one contended key (from one
//! section's end to the next one's start, in one process), next to the server's PING round trip.
//!
//! ```text
//! cargo run -p sage-lock-examples --release --bin handoff -- [--valkey] [--tasks N] [--seconds N] [--body spin|sleep]
//! ```
//!
//! A hand-off costs at least one round trip (the release) plus waking the next owner; the gap's
//! distribution shows how much more it costs.

use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use fred::interfaces::ClientLike as _;
use sage_lock::{LockClient, LockOptions};
use sage_lock_examples::{ThrowawayServer, Usage, flag_value, percentile};

/// One critical section: when it started and ended, and which task ran it.
type Section = (Instant, Instant, usize);

/// What this binary's command line may hold.
const USAGE: Usage<'static> = Usage {
    flags: &["--valkey"],
    valued: &["--tasks", "--seconds", "--body"],
    text: "usage: cargo run -p sage-lock-examples --release --bin handoff -- [--valkey] [--tasks N] [--seconds N] [--body spin|sleep]",
};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    sage_lock_examples::finish(run().await)
}

async fn run() -> anyhow::Result<()> {
    if !USAGE.check_command_line()? {
        return Ok(());
    }
    let tasks = flag_value::<NonZeroUsize>("--tasks")?.map_or(8, NonZeroUsize::get);
    let seconds = flag_value::<NonZeroU64>("--seconds")?.map_or(3, NonZeroU64::get);
    let sleep = match flag_value::<String>("--body")?.as_deref() {
        None | Some("spin") => false,
        Some("sleep") => true,
        Some(other) => anyhow::bail!("--body {other}: use spin or sleep"),
    };
    let server = ThrowawayServer::start()?;
    let client = LockClient::connect(server.url()).await?;
    let mut pings = Vec::new();
    for _ in 0..2000 {
        let start = Instant::now();
        let _: String = client.fred().ping(None).await?;
        pings.push(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    pings.sort_unstable();
    let ping_us = percentile(&pings, 0.5) as f64 / 1000.0;

    let locks = client.lock_with::<str>(LockOptions::new().lease(Duration::from_secs(10)))?;
    let sections: Arc<Mutex<Vec<Section>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (locks, sections) = (locks.clone(), Arc::clone(&sections));
        handles.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let sections = Arc::clone(&sections);
                let body = async move {
                    let start = Instant::now();
                    if sleep {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    } else {
                        while start.elapsed() < Duration::from_millis(1) {
                            std::hint::spin_loop();
                        }
                    }
                    let end = Instant::now();
                    sections
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((start, end, task));
                };
                locks
                    .with_lock("handoff", Duration::from_secs(2), body)
                    .await?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for handle in handles {
        handle.await??;
    }
    let mut sections = sections
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    sections.sort_by_key(|section| section.0);
    let mut gaps: Vec<u64> = sections
        .windows(2)
        .map(|pair| {
            let gap = pair[1].0.saturating_duration_since(pair[0].1);
            u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX)
        })
        .collect();
    let same_task = sections.windows(2).filter(|p| p[0].2 == p[1].2).count();
    gaps.sort_unstable();
    let gap_us = |q: f64| percentile(&gaps, q) as f64 / 1000.0;
    println!(
        "{} sections in {seconds} s ({tasks} tasks, {} body); PING p50 {ping_us:.1} us",
        sections.len(),
        if sleep { "sleep" } else { "spin" },
    );
    println!(
        "gap between sections: p10 {:.0} us, p50 {:.0} us ({:.1} x PING), p90 {:.0} us, p99 {:.0} us; \
         same task twice in a row: {same_task}",
        gap_us(0.10),
        gap_us(0.50),
        gap_us(0.50) / ping_us,
        gap_us(0.90),
        gap_us(0.99),
    );
    let stats = client.stats();
    println!(
        "acquisitions {}, of which hand-offs {} ({:.0} %), busy retries {}",
        stats.acquisitions,
        stats.handoffs,
        100.0 * stats.handoffs as f64 / stats.acquisitions.max(1) as f64,
        stats.busy_retries,
    );
    client.quit().await;
    Ok(())
}
