//! Test helper process: holds a primitive `<rounds>` times (or, for `read-stream`, for
//! `<rounds>` milliseconds), checking the primitive's invariant inside each body against shared
//! counters on the server (updated atomically, so overlaps with other processes are seen), and
//! prints `done <holds> violations <n> waited_max_ms <ms>`.
//!
//! Usage: `primitive_worker <url> <namespace> <mode> <rounds>` where mode is `read`, `write`,
//! `read-stream`, `sem:<permits>`, `multi-ab` or `multi-ba`.

use std::time::{Duration, Instant};

use sage_lock::fred::interfaces::LuaInterface;
use sage_lock::{LockClient, LockOptions};

/// Adds `ARGV[1]` to counter `KEYS[1]` and returns every counter `KEYS[..]` after the change.
const COUNT: &str = r"
redis.call('INCRBY', KEYS[1], ARGV[1])
local out = {}
for i = 1, #KEYS do
  out[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
end
return out
";

/// The shared counters of a test: what holders are inside right now.
struct Counters {
    client: LockClient,
    namespace: String,
}

impl Counters {
    /// Adds `delta` to counter `own` and returns `(own, other)` after it.
    async fn add(&self, own: &str, other: &str, delta: i64) -> Result<(i64, i64), String> {
        let keys = vec![
            format!("{{inv-{}}}:{own}", self.namespace),
            format!("{{inv-{}}}:{other}", self.namespace),
        ];
        let counts: Vec<i64> = self
            .client
            .fred()
            .eval(COUNT, keys, vec![delta])
            .await
            .map_err(|e| e.to_string())?;
        match counts.as_slice() {
            [own, other] => Ok((*own, *other)),
            _ => Err(format!("unexpected counters {counts:?}")),
        }
    }

    /// Enters as `own` (leaving on drop of the body), and says whether the invariant held:
    /// `own` at most `own_limit` and `other` at most `other_limit`.
    async fn inside(&self, own: &str, other: &str, own_limit: i64, other_limit: i64) -> bool {
        let ok = match self.add(own, other, 1).await {
            Ok((mine, theirs)) => mine <= own_limit && theirs <= other_limit,
            Err(error) => {
                eprintln!("counter: {error}");
                false
            }
        };
        tokio::time::sleep(Duration::from_millis(3)).await;
        if let Err(error) = self.add(own, other, -1).await {
            eprintln!("counter: {error}");
        }
        ok
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, namespace, mode, rounds] = args.as_slice() else {
        return Err("usage: primitive_worker <url> <namespace> <mode> <rounds>".into());
    };
    let rounds: u64 = rounds.parse()?;
    let client = LockClient::connect(url).await?;
    let options = || LockOptions::new().namespace(namespace.as_str());
    let counters = Counters {
        client: client.clone(),
        namespace: namespace.clone(),
    };
    let wait = Duration::from_secs(10);
    let (mut holds, mut violations, mut waited_max) = (0_u64, 0_u64, Duration::ZERO);
    let mut record = |ok: bool, waited: Duration| {
        holds += 1;
        violations += u64::from(!ok);
        waited_max = waited_max.max(waited);
    };
    match mode.as_str() {
        "read" | "write" | "read-stream" => {
            let rw = client.rw_lock_with::<str>(options())?;
            let stream_until = Instant::now() + Duration::from_millis(rounds);
            let mut round = 0;
            loop {
                let streaming = mode == "read-stream";
                if (streaming && Instant::now() >= stream_until) || (!streaming && round >= rounds)
                {
                    break;
                }
                round += 1;
                let started = Instant::now();
                let ok = if mode == "write" {
                    rw.write("doc", wait, async { counters.inside("w", "r", 1, 0).await })
                        .await?
                } else {
                    rw.read("doc", wait, async {
                        counters.inside("r", "w", i64::MAX, 0).await
                    })
                    .await?
                };
                record(ok, started.elapsed());
            }
        }
        "multi-ab" | "multi-ba" => {
            let locks = client.lock_with::<str>(options())?;
            let keys: [&str; 3] = if mode == "multi-ab" {
                ["a", "b", "c"]
            } else {
                ["c", "b", "a"]
            };
            for _ in 0..rounds {
                let started = Instant::now();
                let ok = locks
                    .with_locks(&keys, wait, async {
                        counters.inside("m", "none", 1, 0).await
                    })
                    .await?;
                record(ok, started.elapsed());
            }
        }
        sem => {
            let permits: u32 = sem
                .strip_prefix("sem:")
                .ok_or("mode: read, write, read-stream, sem:<n>, multi-ab or multi-ba")?
                .parse()?;
            let semaphore = client.semaphore_with::<str>(permits, options())?;
            for _ in 0..rounds {
                let started = Instant::now();
                let ok = semaphore
                    .acquire("pool", wait, async {
                        counters.inside("s", "none", i64::from(permits), 0).await
                    })
                    .await?;
                record(ok, started.elapsed());
            }
        }
    }
    println!(
        "done {holds} violations {violations} waited_max_ms {}",
        waited_max.as_millis()
    );
    Ok(())
}
