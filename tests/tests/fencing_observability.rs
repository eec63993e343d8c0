//! Fencing tokens across processes and pauses, and the tracing events and metrics a service can
//! export, on standalone Redis and Valkey.

mod common;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use harness::ServerKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use sage_lock::fred::interfaces::{KeysInterface, LuaInterface};
use sage_lock::{LockClient, LockError, LockOptions, Locks};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
use tracing_subscriber::layer::SubscriberExt as _;

const STORE: &str = include_str!("../src/lua/fenced_store.lua");

/// Several processes take turns on one key: every acquisition's token is unique, each process
/// sees its own rise, and the run has at most one skip per acquisition (a hand-off that the
/// waiter's own attempt confirms, as a repeated grant, takes one more token: the counter may
/// have been taken by another primitive of the name meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_across_processes() {
    for kind in ServerKind::ALL {
        let url = harness::shared(kind).url();
        let ns = format!("fence-procs-{}", rand::random::<u32>());
        let mut children = Vec::new();
        for _ in 0..3 {
            children.push(
                tokio::process::Command::new(env!("CARGO_BIN_EXE_fence_worker"))
                    .args([&url, &ns, "shared", "15"])
                    .stdout(Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .expect("spawn fence_worker"),
            );
        }
        let mut all = BTreeSet::new();
        for child in children {
            let out = child.wait_with_output().await.expect("worker output");
            assert!(
                out.status.success(),
                "{}: worker failed: {out:?}",
                kind.name()
            );
            let tokens: Vec<u64> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.strip_prefix("token ").and_then(|t| t.parse().ok()))
                .collect();
            assert_eq!(tokens.len(), 15, "{}", kind.name());
            assert!(
                tokens.windows(2).all(|w| w[0] < w[1]),
                "{}: not increasing: {tokens:?}",
                kind.name()
            );
            for token in tokens {
                assert!(
                    all.insert(token),
                    "{}: token {token} handed out twice",
                    kind.name()
                );
            }
        }
        let (first, last) = (
            all.first().copied().unwrap_or(0),
            all.last().copied().unwrap_or(0),
        );
        let span = last - first + 1;
        println!("{}: 45 tokens from {first} to {last}", kind.name());
        assert!(
            (45..=90).contains(&span),
            "{}: 45 tokens spread over {span} numbers",
            kind.name()
        );
    }
}

/// A holder paused (SIGSTOP) past its lease comes back with a token lower than the current
/// holder's; the toy store that checks tokens rejects its late write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_is_fenced_off() {
    for kind in ServerKind::ALL {
        let url = harness::shared(kind).url();
        let ns = format!("fence-pause-{}", rand::random::<u32>());
        let prefix = format!("store-{}", rand::random::<u32>());
        let lease = Duration::from_millis(400);
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fenced_writer"))
            .args([
                &url,
                &ns,
                "acct",
                &lease.as_millis().to_string(),
                &prefix,
                "stale",
            ])
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn fenced_writer");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let line = lines
            .next_line()
            .await
            .expect("read")
            .expect("acquired line");
        let stale: u64 = line
            .strip_prefix("acquired ")
            .and_then(|t| t.parse().ok())
            .expect("token");
        let pid = child.id().expect("pid").to_string();
        signal(&pid, "-STOP");
        tokio::time::sleep(lease * 2).await;

        let client = LockClient::connect(&url).await.expect("connect");
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace(ns.as_str()))
            .expect("opts");
        let store_keys = vec![
            format!("{prefix}:data"),
            format!("{prefix}:highest"),
            format!("{prefix}:rejected"),
        ];
        let fresh = locks
            .with_lock("acct", Duration::from_secs(5), async {
                let token = sage_lock::current_lease().expect("lease").fencing_token();
                let accepted: i64 = client
                    .fred()
                    .eval(
                        STORE,
                        store_keys.clone(),
                        vec![token.to_string(), "fresh".to_owned()],
                    )
                    .await
                    .expect("store write");
                assert_eq!(accepted, 1);
                token
            })
            .await
            .expect("the paused holder's lease expired");
        assert!(
            fresh > stale,
            "{}: new token {fresh} not above the paused holder's {stale}",
            kind.name()
        );

        signal(&pid, "-CONT");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"go\n").await.expect("resume writer");
        drop(stdin);
        let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        let rejected: Option<i64> = client
            .fred()
            .get(format!("{prefix}:rejected"))
            .await
            .expect("GET");
        let data: Option<String> = client
            .fred()
            .get(format!("{prefix}:data"))
            .await
            .expect("GET");
        assert_eq!(
            rejected,
            Some(1),
            "{}: the stale write was not rejected",
            kind.name()
        );
        assert_eq!(
            data.as_deref(),
            Some("fresh"),
            "{}: the stale holder overwrote fresh data",
            kind.name()
        );
    }
}

fn signal(pid: &str, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, pid])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig} {pid}");
}

/// Captured tracing events: (level, message, fields of the event and its spans).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<String>>>);

struct CaptureLayer(Captured);

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl<S> tracing_subscriber::Layer<S> for CaptureLayer
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields(String::new());
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if !event.metadata().target().starts_with("sage_lock") {
            return;
        }
        let mut fields = Fields(format!("{}", event.metadata().level()));
        event.record(&mut fields);
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                if let Some(span_fields) = span.extensions().get::<Fields>() {
                    fields.0.push_str(&span_fields.0);
                }
            }
        }
        if let Ok(mut events) = (self.0).0.lock() {
            events.push(fields.0);
        }
    }
}

fn observers() -> &'static (Captured, Snapshotter) {
    static OBSERVERS: OnceLock<(Captured, Snapshotter)> = OnceLock::new();
    OBSERVERS.get_or_init(|| {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::registry()
            .with(CaptureLayer(captured.clone()))
            .with(tracing_subscriber::filter::LevelFilter::TRACE);
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("one global recorder");
        (captured, snapshotter)
    })
}

type Sample = (
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
);

/// Sum of `name` for `namespace` in one snapshot (taking a snapshot resets the recorder).
fn counter(snapshot: &[Sample], name: &str, namespace: &str) -> u64 {
    snapshot
        .iter()
        .filter(|(key, _, _, _)| {
            key.key().name() == name
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "namespace" && l.value() == namespace)
        })
        .map(|(_, _, _, value)| match value {
            DebugValue::Counter(n) => *n,
            DebugValue::Histogram(samples) => samples.len() as u64,
            DebugValue::Gauge(_) => 0,
        })
        .sum()
}

/// The value of `name` for `namespace` whose `reason` label is `reason`.
fn labelled(snapshot: &[Sample], name: &str, namespace: &str, reason: &str) -> u64 {
    snapshot
        .iter()
        .filter(|(key, _, _, _)| {
            let labels = || key.key().labels();
            key.key().name() == name
                && labels().any(|l| l.key() == "namespace" && l.value() == namespace)
                && labels().any(|l| l.key() == "reason" && l.value() == reason)
        })
        .map(|(_, _, _, value)| match value {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

/// Acquire, busy retry, renew, release, timeout, loss and a hand-off on the server each emit a
/// tracing event carrying the key and namespace (README, Observability: `lock not acquired yet;
/// waiting` among them), and count in the metrics facade (`sage_lock_handoffs_total` among them)
/// and in `LockClient::stats`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_metrics_fire() {
    let (captured, snapshotter) = observers();
    for kind in ServerKind::ALL {
        let client = LockClient::connect(&harness::shared(kind).url())
            .await
            .expect("connect");
        let ns = format!("observed-{}", rand::random::<u32>());
        let locks: Locks<str> = client
            .lock_with(
                LockOptions::new()
                    .namespace(ns.as_str())
                    .lease(Duration::from_millis(90)),
            )
            .expect("opts");
        // acquire + renewals + release
        locks
            .with_lock(
                "obs",
                Duration::from_secs(1),
                tokio::time::sleep(Duration::from_millis(200)),
            )
            .await
            .expect("lock");
        // busy retries + timeout: from another task (one nested in the holder's own task fails
        // at once, see `reentrancy`)
        let timed_out = locks
            .with_lock("obs", Duration::from_secs(1), async {
                let other_task = locks.clone();
                tokio::spawn(async move {
                    other_task
                        .with_lock("obs", Duration::from_millis(100), async {})
                        .await
                })
                .await
                .expect("waiting task")
            })
            .await
            .expect("outer");
        assert!(matches!(timed_out, Err(LockError::TimedOut { .. })));
        // a timeout of another reason: nested in the holder's own task, reported at once
        let nested = locks
            .with_lock("obs", Duration::from_secs(1), async {
                locks
                    .with_lock("obs", Duration::from_secs(1), async {})
                    .await
            })
            .await
            .expect("outer");
        assert!(
            matches!(
                nested,
                Err(LockError::TimedOut {
                    reason: sage_lock::TimeoutReason::HeldByThisTask,
                    ..
                })
            ),
            "{nested:?}"
        );
        // loss
        let server_key = LockClient::server_key(&ns, "obs");
        let lost = locks
            .with_lock("obs", Duration::from_secs(1), async {
                let _: i64 = client
                    .fred()
                    .del(sage_lock::fred::types::Key::from(&server_key[..]))
                    .await
                    .expect("DEL");
                tokio::time::sleep(Duration::from_secs(2)).await;
            })
            .await;
        assert!(matches!(lost, Err(LockError::LockLost { .. })), "{lost:?}");
        // a cancelled call (its future dropped mid-body): released in the background, with its
        // `lock released` event and its hold time, as a body that ends
        let dropped_ns = format!("{ns}-dropped");
        let dropped: Locks<str> = client
            .lock_with(LockOptions::new().namespace(dropped_ns.as_str()))
            .expect("opts");
        let cancelled = tokio::time::timeout(
            Duration::from_millis(150),
            dropped.with_lock(
                "cancelled",
                Duration::from_secs(1),
                tokio::time::sleep(Duration::from_secs(5)),
            ),
        )
        .await;
        assert!(cancelled.is_err(), "{cancelled:?}");
        let dropped_key = LockClient::server_key(&dropped_ns, "cancelled");
        let since = std::time::Instant::now();
        while common::raw_exists(&client, &dropped_key).await {
            assert!(since.elapsed() < Duration::from_secs(2), "never released");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // hand-off: a waiter on another client (another process) queues, and the release hands
        // it the lock on the server
        let other = LockClient::connect(&harness::shared(kind).url())
            .await
            .expect("connect");
        // A long lease, so that the waiter polls only every 500 ms (a poll bounded by a short
        // lease could find its grant before the message does).
        let long = || {
            LockOptions::new()
                .namespace(ns.as_str())
                .lease(Duration::from_secs(5))
        };
        let other_locks: Locks<str> = other.lock_with(long()).expect("opts");
        let holder: Locks<str> = client.lock_with(long()).expect("opts");
        let queue = format!("{{{ns}:handoff}}:queue");
        let mut waiter = None;
        holder
            .with_lock("handoff", Duration::from_secs(1), async {
                waiter = Some(tokio::spawn(async move {
                    other_locks
                        .with_lock("handoff", Duration::from_secs(5), async {})
                        .await
                }));
                let queued = std::time::Instant::now();
                while harness::shared(kind)
                    .cmd(&["LLEN", &queue])
                    .ok()
                    .and_then(|r| r.as_int())
                    .unwrap_or(0)
                    < 1
                {
                    assert!(queued.elapsed() < Duration::from_secs(5), "never queued");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                // Past the attempt that follows subscribing, well before the next poll (500 ms).
                tokio::time::sleep(Duration::from_millis(200)).await;
            })
            .await
            .expect("holder");
        waiter
            .expect("the holder spawned the waiter")
            .await
            .expect("waiter task")
            .expect("waiter");
        assert_eq!(other.stats().handoffs, 1, "{:?}", other.stats());
        other.quit().await;
        let flaky = transient_failures_are_retried(kind, &ns).await;

        let events: Vec<String> = captured.0.lock().map(|e| e.clone()).unwrap_or_default();
        let mine: Vec<&String> = events.iter().filter(|e| e.contains(&ns)).collect();
        assert!(
            mine.iter().any(|e| e.contains("renewal failed, retrying")
                && e.contains("key=flaky")
                && e.contains("no reply before the deadline")
                && !e.contains("lease ran out")),
            "{}: no `renewal failed, retrying` event naming the key and the attempt's timeout \
             (and not a loss) among {mine:#?}",
            kind.name()
        );
        for wanted in [
            "lock acquired",
            "lease renewed",
            "lock released",
            "timed out",
            "lock lost",
            "lock not acquired yet; waiting",
        ] {
            assert!(
                mine.iter()
                    .any(|e| e.contains(wanted) && e.contains("key=obs")),
                "{}: no `{wanted}` event with key and namespace among {mine:#?}",
                kind.name()
            );
        }
        assert!(
            mine.iter()
                .any(|e| e.contains("lock released") && e.contains("key=cancelled")),
            "{}: no `lock released` event for the cancelled call among {mine:#?}",
            kind.name()
        );
        let snapshot: Vec<Sample> = snapshotter.snapshot().into_vec();
        for metric in ["sage_lock_releases_total", "sage_lock_hold_seconds"] {
            let value = counter(&snapshot, metric, &dropped_ns);
            assert_eq!(value, 1, "{}: {metric} of the cancelled call", kind.name());
        }
        for (metric, at_least) in [
            ("sage_lock_acquisitions_total", 5),
            ("sage_lock_busy_retries_total", 1),
            ("sage_lock_handoffs_total", 1),
            ("sage_lock_timeouts_total", 2),
            ("sage_lock_renewals_total", 2),
            ("sage_lock_losses_total", 1),
            ("sage_lock_transient_retries_total", 1),
            ("sage_lock_renewal_failures_total", 1),
            ("sage_lock_releases_total", 2),
            ("sage_lock_wait_seconds", 3),
            ("sage_lock_hold_seconds", 3),
        ] {
            let value = counter(&snapshot, metric, &ns);
            assert!(
                value >= at_least,
                "{}: {metric} = {value}, expected >= {at_least}",
                kind.name()
            );
        }
        // Each timeout under its reason, so contention and outages can be told apart.
        for (reason, count) in [("busy", 1), ("held_by_this_task", 1), ("unavailable", 0)] {
            let value = labelled(&snapshot, "sage_lock_timeouts_total", &ns, reason);
            assert_eq!(
                value,
                count,
                "{}: sage_lock_timeouts_total{{reason={reason}}}",
                kind.name()
            );
        }
        let stats = client.stats();
        assert_eq!(
            (stats.acquisitions, stats.timeouts, stats.losses),
            (6, 2, 1),
            "{stats:?}"
        );
        assert!(stats.renewals >= 2 && stats.busy_retries >= 1, "{stats:?}");
        assert!(
            flaky.transient_retries >= 1 && flaky.renewal_failures >= 1,
            "{}: {flaky:?}",
            kind.name()
        );
    }
}

/// On a server of its own that stops answering for a while (SIGSTOP): an acquisition made
/// while it is stopped is retried until it answers again, and a renewal that times out is
/// retried and keeps the lease. Returns that client's counters.
async fn transient_failures_are_retried(kind: ServerKind, ns: &str) -> sage_lock::LockStats {
    let server = harness::Server::start(kind);
    let client = LockClient::builder()
        .url(&server.url())
        .command_timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect");
    let locks: Locks<str> = client
        .lock_with(
            LockOptions::new()
                .namespace(ns)
                .lease(Duration::from_millis(1500)),
        )
        .expect("opts");
    server.pause();
    let acquiring = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .with_lock("flaky", Duration::from_secs(5), async {})
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.resume();
    acquiring
        .await
        .expect("acquiring task")
        .expect("acquired once the server answered again");
    // The first renewal is due 500 ms in (a third of the lease); the server is stopped from
    // 300 ms to 900 ms, so it times out (200 ms) and is retried well inside the usable lease.
    let held = locks
        .with_lock("flaky", Duration::from_secs(2), async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            server.pause();
            tokio::time::sleep(Duration::from_millis(600)).await;
            server.resume();
            tokio::time::sleep(Duration::from_millis(1500)).await;
        })
        .await;
    server.resume();
    assert!(
        held.is_ok(),
        "{}: the lease was lost over a 600 ms stall: {held:?}",
        kind.name()
    );
    let stats = client.stats();
    client.quit().await;
    stats
}

/// A server that is down for a whole wait, or for part of it: the attempts that waited for the
/// connection to come back count as transient failures, so an outage shows in
/// `sage_lock_transient_retries_total` and not only as timeouts (which contention also gives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_counts_as_transient_failures() {
    for kind in ServerKind::ALL {
        let server = harness::Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("outage-counted"))
            .expect("opts");
        server.kill();
        let error = locks
            .with_lock("down", Duration::from_millis(800), async {})
            .await
            .expect_err("no server: the wait runs out");
        assert!(
            matches!(
                error,
                LockError::TimedOut {
                    reason: sage_lock::TimeoutReason::Unavailable(_),
                    ..
                }
            ),
            "{}: {error}",
            kind.name()
        );
        let down = client.stats();
        assert_eq!(down.timeouts, 1, "{}: {down:?}", kind.name());
        assert!(
            down.transient_retries >= 1,
            "{}: a wait spent on a server that is down counted no transient failure: {down:?}",
            kind.name()
        );

        // Down when the acquisition starts, back half a second later: acquired, and counted.
        let acquiring = {
            let locks = locks.clone();
            tokio::spawn(async move {
                locks
                    .with_lock("back", Duration::from_secs(10), async {})
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        server.restart();
        acquiring
            .await
            .expect("acquiring task")
            .expect("acquired once the server is back");
        let back = client.stats();
        assert!(
            back.transient_retries > down.transient_retries,
            "{}: a wait that outlasted an outage counted no transient failure: {back:?}",
            kind.name()
        );
        client.quit().await;
    }
}
