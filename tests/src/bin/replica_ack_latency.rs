//! How long replica acknowledgement takes: an uncontended `with_lock` cycle with replica
//! acknowledgement on a throwaway primary with one replica, next to a bare `SET` + `WAIT 1`
//! on the same primary, interleaved, with a pause of `--gap-ms` (default 1) after each, as a
//! service's pace leaves the connections idle between locks, on Redis and on Valkey.
//!
//! ```text
//! cargo run -p sage-lock-tests --release --bin replica_ack_latency -- [--seconds S] [--gap-ms MS] [--redis | --valkey]
//! ```
//!
//! Prints, for each, p50 / p99 / p99.9 / max, how many took 20 ms or more, and the median gap
//! between those slow ones. A measurement aid, not a test: it asserts nothing.

use std::time::{Duration, Instant};

use fred::interfaces::{ClientLike as _, KeysInterface as _};
use fred::types::{ClusterHash, CustomCommand};
use harness::{Replicated, ServerKind};
use sage_lock::{LockClient, LockOptions, Locks};

/// A cycle at least this long counts as slow.
const SLOW: Duration = Duration::from_millis(20);

/// Latencies in µs of one kind of cycle, and the instants of the slow ones.
#[derive(Default)]
struct Samples {
    micros: Vec<u64>,
    slow_at: Vec<Instant>,
}

impl Samples {
    fn record(&mut self, started: Instant) {
        let took = started.elapsed();
        self.micros
            .push(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
        if took >= SLOW {
            self.slow_at.push(started);
        }
    }

    fn summary(&mut self) -> String {
        self.micros.sort_unstable();
        let at = |q: f64| {
            let last = self.micros.len().saturating_sub(1);
            let index = ((last as f64) * q).round() as usize;
            self.micros.get(index).copied().unwrap_or(0)
        };
        let mut gaps: Vec<u128> = self
            .slow_at
            .windows(2)
            .map(|pair| pair[1].duration_since(pair[0]).as_millis())
            .collect();
        gaps.sort_unstable();
        let gap = gaps
            .get(gaps.len() / 2)
            .map_or_else(|| "-".to_owned(), |ms| format!("{ms} ms"));
        format!(
            "{} cycles: p50 {} us, p99 {} us, p99.9 {} us, max {:.1} ms; {} of {} ms or more, median gap between them {gap}",
            self.micros.len(),
            at(0.5),
            at(0.99),
            at(0.999),
            at(1.0) as f64 / 1000.0,
            self.slow_at.len(),
            SLOW.as_millis(),
        )
    }
}

fn usage() -> anyhow::Error {
    anyhow::anyhow!(
        "usage: replica_ack_latency [--seconds S] [--gap-ms MS] [--redis | --valkey] (S a whole \
         number of seconds, default 10; MS whole milliseconds, default 1; both servers by \
         default)"
    )
}

async fn measure(kind: ServerKind, run: Duration, gap: Duration) -> anyhow::Result<()> {
    let setup = Replicated::start(kind, 1);
    let client = LockClient::builder()
        .url(&setup.primary_url())
        .replicated(true)
        .connect()
        .await?;
    let locks: Locks<str> = client.lock_with(LockOptions::new().namespace("ack-latency"))?;
    let fred = client.fred().clone();
    let wait = CustomCommand::new_static("WAIT", ClusterHash::FirstKey, true);
    let (mut lock_cycles, mut set_wait) = (Samples::default(), Samples::default());
    let end = Instant::now() + run;
    while Instant::now() < end {
        let started = Instant::now();
        locks
            .with_lock("k", Duration::from_secs(2), async {})
            .await?;
        lock_cycles.record(started);
        tokio::time::sleep(gap).await;

        let started = Instant::now();
        let _: () = fred.set("bare", "v", None, None, false).await?;
        let acked: i64 = fred.custom(wait.clone(), vec![1, 500]).await?;
        anyhow::ensure!(acked == 1, "WAIT 1 500 answered {acked}");
        set_wait.record(started);
        tokio::time::sleep(gap).await;
    }
    client.quit().await;
    fred.quit().await?;
    println!(
        "{kind}, primary + 1 replica, {} ms between cycles:",
        gap.as_millis()
    );
    println!("  with_lock (replica ack): {}", lock_cycles.summary());
    println!("  SET + WAIT 1 500:        {}", set_wait.summary());
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut kinds = vec![ServerKind::Redis, ServerKind::Valkey];
    let (mut seconds, mut gap_ms) = (10, 1);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|s| s.parse::<u64>().ok())
                    .filter(|s| *s > 0)
                    .ok_or_else(usage)?;
            }
            "--gap-ms" => {
                gap_ms = args
                    .next()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(usage)?;
            }
            "--help" | "-h" => {
                println!("{}", usage());
                return Ok(());
            }
            "--redis" => kinds = vec![ServerKind::Redis],
            "--valkey" => kinds = vec![ServerKind::Valkey],
            _ => return Err(usage()),
        }
    }
    for kind in kinds {
        measure(
            kind,
            Duration::from_secs(seconds),
            Duration::from_millis(gap_ms),
        )
        .await?;
    }
    Ok(())
}
