//! Test helper process for fairness across processes.
//!
//! - `fair_worker contend <url> <namespace> <key> <tasks> <run-ms> <section-ms> <wait-ms>
//!   <start-unix-ms>`: from the given wall-clock start on, `tasks` tasks take the lock on `key` in
//!   turn for `run-ms`, holding it `section-ms` each time; prints one line
//!   `sections=N timeouts=T p99_wait_us=P max_wait_us=M first_us=F` (F: when this process's
//!   first section began, after the start). An optional last argument names the primitive:
//!   `mutex` (the default), `semaphore` (one permit), `write` or `read` (the read-write lock's
//!   writer or reader), or `pair` (`with_locks` on `key` and `<key>:pair` at once).
//! - `fair_worker wait <url> <namespace> <key> [<wait-ms>]`: prints `waiting`, then waits (up to
//!   `wait-ms`, default 60 s) for the lock and prints `acquired` when it gets it (tests SIGKILL it while it is queued).

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sage_lock::{LockClient, LockError, LockOptions, Locks, RwLocks, Semaphores};

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [
            mode,
            url,
            namespace,
            key,
            tasks,
            run_ms,
            section_ms,
            wait_ms,
            start_ms,
            primitive @ ..,
        ] if mode == "contend" && primitive.len() <= 1 => {
            let subject = match primitive.first().map(String::as_str) {
                None | Some("mutex") => Subject::Mutex(locks(url, namespace).await?),
                Some("semaphore") => Subject::Semaphore(
                    LockClient::connect(url)
                        .await?
                        .semaphore_with(1, options(namespace))?,
                ),
                Some("pair") => Subject::Pair(locks(url, namespace).await?),
                Some("write") => Subject::Write(
                    LockClient::connect(url)
                        .await?
                        .rw_lock_with(options(namespace))?,
                ),
                Some("read") => Subject::Read(
                    LockClient::connect(url)
                        .await?
                        .rw_lock_with(options(namespace))?,
                ),
                Some(other) => return Err(format!("unknown primitive {other:?}").into()),
            };
            contend(
                subject,
                key,
                tasks.parse()?,
                Duration::from_millis(run_ms.parse()?),
                Duration::from_millis(section_ms.parse()?),
                Duration::from_millis(wait_ms.parse()?),
                start_ms.parse()?,
            )
            .await
        }
        [mode, url, namespace, key, wait_ms @ ..] if mode == "wait" && wait_ms.len() <= 1 => {
            let wait = match wait_ms.first() {
                Some(ms) => Duration::from_millis(ms.parse()?),
                None => Duration::from_secs(60),
            };
            let locks = locks(url, namespace).await?;
            println!("waiting");
            let _ = std::io::stdout().flush();
            locks
                .with_lock(key.as_str(), wait, async {
                    println!("acquired");
                    let _ = std::io::stdout().flush();
                })
                .await?;
            Ok(())
        }
        _ => Err(
            "usage: fair_worker contend <url> <namespace> <key> <tasks> <run-ms> \
                  <section-ms> <wait-ms> <start-unix-ms> | wait <url> <namespace> <key> [<wait-ms>]"
                .into(),
        ),
    }
}

async fn locks(url: &str, namespace: &str) -> Result<Locks<str>, Error> {
    let client = LockClient::connect(url).await?;
    Ok(client.lock_with::<str>(options(namespace))?)
}

fn options(namespace: &str) -> LockOptions {
    LockOptions::new()
        .namespace(namespace)
        .lease(Duration::from_secs(5))
}

/// What `contend` takes turns on.
#[derive(Clone)]
enum Subject {
    Mutex(Locks<str>),
    /// Both `key` and `<key>:pair`, with `with_locks`.
    Pair(Locks<str>),
    Semaphore(Semaphores<str>),
    Write(RwLocks<str>),
    Read(RwLocks<str>),
}

impl Subject {
    /// Runs `body` holding `key`, waiting up to `wait`.
    async fn hold<F: Future>(
        &self,
        key: &str,
        wait: Duration,
        body: F,
    ) -> Result<F::Output, LockError> {
        match self {
            Subject::Mutex(locks) => locks.with_lock(key, wait, body).await,
            Subject::Pair(locks) => {
                let second = format!("{key}:pair");
                locks.with_locks(&[key, second.as_str()], wait, body).await
            }
            Subject::Semaphore(sem) => sem.acquire(key, wait, body).await,
            Subject::Write(rw) => rw.write(key, wait, body).await,
            Subject::Read(rw) => rw.read(key, wait, body).await,
        }
    }
}

async fn contend(
    locks: Subject,
    key: &str,
    tasks: usize,
    run: Duration,
    section: Duration,
    wait: Duration,
    start_unix_ms: u64,
) -> Result<(), Error> {
    let now_ms = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())?;
    tokio::time::sleep(Duration::from_millis(start_unix_ms.saturating_sub(now_ms))).await;
    let start = Instant::now();
    let stop = start + run;
    let first = Arc::new(AtomicU64::new(u64::MAX));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (locks, key, first) = (locks.clone(), key.to_owned(), Arc::clone(&first));
        handles.push(tokio::spawn(async move {
            let (mut sections, mut timeouts, mut waits) = (0_u64, 0_u64, Vec::new());
            while Instant::now() < stop {
                let asked = Instant::now();
                let entered = locks
                    .hold(key.as_str(), wait, async {
                        let entered = asked.elapsed();
                        let since_start = u64::try_from(start.elapsed().as_micros()).unwrap_or(0);
                        first.fetch_min(since_start, Ordering::Relaxed);
                        tokio::time::sleep(section).await;
                        entered
                    })
                    .await;
                match entered {
                    Ok(waited) => {
                        sections += 1;
                        waits.push(waited);
                    }
                    Err(LockError::TimedOut { .. }) => timeouts += 1,
                    Err(other) => return Err(other),
                }
            }
            Ok((sections, timeouts, waits))
        }));
    }
    let (mut sections, mut timeouts, mut waits) = (0, 0, Vec::new());
    for handle in handles {
        let (s, t, w) = handle.await??;
        sections += s;
        timeouts += t;
        waits.extend(w);
    }
    waits.sort();
    let p99 = waits
        .get(waits.len().saturating_sub(1) * 99 / 100)
        .copied()
        .unwrap_or_default();
    let max = waits.last().copied().unwrap_or_default();
    println!(
        "sections={sections} timeouts={timeouts} p99_wait_us={} max_wait_us={} first_us={}",
        p99.as_micros(),
        max.as_micros(),
        first.load(Ordering::Relaxed)
    );
    Ok(())
}
