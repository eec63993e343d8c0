//! A worker process: the `#[locked]` critical section, the loop calling it, and its JSON-line reports.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use fred::clients::Client;
use fred::interfaces::KeysInterface as _;
use fred::types::{Expiration, SetOptions, Value};
use rand::Rng as _;
use sage_lock::global::{self, ServiceDefaults};
use sage_lock::{LockClient, LockError, TimeoutReason, current_lease, locked};
use sage_lock_examples::{flag_value, has_flag};
use serde_json::json;

use crate::{LEASE, LONG_BODY_SHARE, data_keys, key_name};

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
    let mut told_timeout = false;
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
            Err(SectionError::Lock(LockError::TimedOut {
                reason: TimeoutReason::Busy,
                ..
            })) => {}
            Err(SectionError::Lock(error @ LockError::TimedOut { .. })) => {
                // Not another holder's doing (e.g. no replica acknowledged the grant, as on a
                // cluster without replicas): say why, once, rather than only show no progress.
                if !told_timeout {
                    told_timeout = true;
                    eprintln!("worker {id}: {error}");
                }
            }
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
