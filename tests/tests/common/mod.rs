//! The behaviour suite shared by every topology's test binary: each function takes a [`Target`]
//! (one running deployment) and asserts one promise of sage-lock against it.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use harness::ServerKind;
use sage_lock::{LockClient, LockError, LockOptions, Locks, LossReason, TimeoutReason};

pub mod primitives;

/// Defines one `#[tokio::test]` per named behaviour of this module, each run against
/// `$target(kind)` for both server kinds.
#[allow(unused_macros)] // not every test binary uses it
macro_rules! behaviour_tests {
    ($target:path; $($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            for kind in harness::ServerKind::ALL {
                common::$name(&$target(kind)).await;
            }
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use behaviour_tests;

/// Defines the whole behaviour suite of this module as tests against `$target(kind)`.
#[allow(unused_macros)] // not every test binary uses it
macro_rules! behaviour_suite {
    ($target:path) => {
        common::behaviour_tests!(
            $target;
            mutual_exclusion,
            timed_out_is_bounded,
            try_lock_busy_and_free,
            renewal_keeps_short_lease,
            loss_when_key_deleted,
            loss_when_key_overwritten,
            cancellation_releases,
            namespaces_isolate,
            not_reentrant,
            body_error_untouched,
            binary_and_unicode_keys,
            fencing_tokens_increase,
            invalid_arguments,
            outlives_the_runtime_that_connected_it,
        );
    };
}
#[allow(unused_imports)]
pub(crate) use behaviour_suite;

/// One deployment under test.
#[derive(Clone, Debug)]
pub struct Target {
    pub kind: ServerKind,
    pub url: String,
    /// A plain URL that is the primary of a replicated deployment (no Sentinel).
    pub replicated: bool,
    /// Admin port of the primary that holds `key`s (standalone/replicated: the only primary).
    pub label: &'static str,
    /// Connect through a caller's fred client speaking RESP3 ([`LockClient::from_fred`], or
    /// the builder's `fred_client` when `replicated`) instead of the URL (RESP2).
    pub resp3: bool,
}

impl Target {
    pub fn standalone(kind: ServerKind) -> Target {
        Target {
            kind,
            url: harness::shared(kind).url(),
            replicated: false,
            label: "standalone",
            resp3: false,
        }
    }

    /// This target, reached through a caller's fred client speaking RESP3.
    pub fn resp3(self) -> Target {
        Target {
            resp3: true,
            label: match self.label {
                "standalone" => "standalone-resp3",
                "replicated" => "replicated-resp3",
                "sentinel" => "sentinel-resp3",
                "cluster" => "cluster-resp3",
                other => other,
            },
            ..self
        }
    }

    /// A caller's fred client for this target's URL, speaking RESP3 (not connected).
    pub fn resp3_fred(&self) -> sage_lock::fred::clients::Client {
        use sage_lock::fred::types::RespVersion;
        use sage_lock::fred::types::config::Config;
        let mut config = Config::from_url(&self.url).expect("a valid URL");
        config.version = RespVersion::RESP3;
        sage_lock::fred::types::Builder::from_config(config)
            .build()
            .expect("a fred client")
    }

    pub async fn client(&self) -> LockClient {
        if self.resp3 {
            let fred = self.resp3_fred();
            if !self.replicated {
                return LockClient::from_fred(fred);
            }
            return LockClient::builder()
                .fred_client(&fred)
                .replicated(true)
                .connect()
                .await
                .unwrap_or_else(|e| panic!("connect to {} {}: {e}", self.kind.name(), self.label));
        }
        LockClient::builder()
            .url(&self.url)
            .replicated(self.replicated)
            .connect()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "connect to {} {} at {}: {e}",
                    self.kind.name(),
                    self.label,
                    self.url
                )
            })
    }

    /// A namespace unique to this test and target.
    pub fn ns(&self, test: &str) -> String {
        format!(
            "{test}-{}-{}-{}",
            self.kind.name(),
            self.label,
            rand::random::<u32>()
        )
    }

    pub async fn locks<K: ?Sized>(
        &self,
        client: &LockClient,
        test: &str,
        lease: Duration,
    ) -> Locks<K> {
        client
            .lock_with::<K>(LockOptions::new().namespace(self.ns(test)).lease(lease))
            .expect("valid options")
    }
}

/// Connects to `url` with a 30 s connect timeout, right after the primary on port `down` went
/// down (before its failover), and prints how long the connect took: it waits for the failover.
///
/// # Panics
/// When no connection comes within the connect timeout.
pub async fn connect_through_failover(kind: ServerKind, url: &str, down: u16) -> LockClient {
    let started = Instant::now();
    let connected = LockClient::builder()
        .url(url)
        .connect_timeout(Duration::from_secs(30))
        .connect()
        .await;
    let took = started.elapsed();
    let client = connected.unwrap_or_else(|error| {
        panic!("{kind}: no connection {took:?} after primary {down} went down: {error}")
    });
    println!("{kind}: connected {took:?} after primary {down} went down");
    client
}

/// Sets `key` to `value` from outside (a raw command through the client's fred connection).
/// A `LockClient` made by `from_fred` from a fred client with the plain (single-server)
/// configuration of `url`, and its lock family in `namespace`.
pub fn plain_fred_locks(url: &str, namespace: &str) -> (LockClient, Locks<str>) {
    let config = sage_lock::fred::prelude::Config::from_url(url).expect("config");
    let fred = sage_lock::fred::prelude::Builder::from_config(config)
        .build()
        .expect("fred client");
    let client = LockClient::from_fred(fred);
    let locks = client
        .lock_with(LockOptions::new().namespace(namespace))
        .expect("locks");
    (client, locks)
}

pub async fn raw_set(client: &LockClient, key: &[u8], value: &str) {
    use sage_lock::fred::interfaces::KeysInterface;
    let key = sage_lock::fred::types::Key::from(key);
    let _: () = client
        .fred()
        .set(key, value, None, None, false)
        .await
        .expect("SET");
}

pub async fn raw_del(client: &LockClient, key: &[u8]) -> i64 {
    use sage_lock::fred::interfaces::KeysInterface;
    client
        .fred()
        .del(sage_lock::fred::types::Key::from(key))
        .await
        .expect("DEL")
}

pub async fn raw_exists(client: &LockClient, key: &[u8]) -> bool {
    use sage_lock::fred::interfaces::KeysInterface;
    let n: i64 = client
        .fred()
        .exists(sage_lock::fred::types::Key::from(key))
        .await
        .expect("EXISTS");
    n == 1
}

pub async fn raw_pttl(client: &LockClient, key: &[u8]) -> i64 {
    use sage_lock::fred::interfaces::KeysInterface;
    client
        .fred()
        .pttl(sage_lock::fred::types::Key::from(key))
        .await
        .expect("PTTL")
}

/// Many tasks increment a counter with a non-atomic read-modify-write under one lock; the final
/// count is exact and no two bodies ever overlap.
pub async fn mutual_exclusion(target: &Target) {
    let client = target.client().await;
    let locks: Locks<str> = target.locks(&client, "mutex", Duration::from_secs(5)).await;
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let (tasks, rounds) = (24, 10);
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (locks, counter, inside, overlaps) = (
            locks.clone(),
            counter.clone(),
            inside.clone(),
            overlaps.clone(),
        );
        handles.push(tokio::spawn(async move {
            for _ in 0..rounds {
                locks
                    .with_lock("counter", Duration::from_secs(30), async {
                        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        let value = counter.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        tokio::time::sleep(Duration::from_micros(200)).await;
                        counter.store(value + 1, Ordering::SeqCst);
                        inside.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                    .expect("acquire under contention");
            }
        }));
    }
    for handle in handles {
        handle.await.expect("task");
    }
    assert_eq!(
        counter.load(Ordering::SeqCst),
        tasks * rounds,
        "lost updates: exclusivity violated"
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two bodies overlapped");
    let stats = client.stats();
    assert_eq!(stats.acquisitions, tasks * rounds);
    assert!(
        stats.busy_retries > 0,
        "24 tasks on one key must have contended: {stats:?}"
    );
}

/// A held lock makes a waiter time out after its wait (plus at most the cleanup second), without
/// running its body.
pub async fn timed_out_is_bounded(target: &Target) {
    let client = target.client().await;
    let locks: Locks<str> = target
        .locks(&client, "timeout", Duration::from_secs(5))
        .await;
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let holder = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .with_lock("busy", Duration::from_secs(5), async {
                    let _ = held_tx.send(());
                    tokio::time::sleep(Duration::from_secs(2)).await;
                })
                .await
        })
    };
    held_rx.await.expect("holder started");
    let ran = AtomicBool::new(false);
    let started = Instant::now();
    let wait = Duration::from_millis(400);
    let result = locks
        .with_lock("busy", wait, async { ran.store(true, Ordering::SeqCst) })
        .await;
    let elapsed = started.elapsed();
    match result {
        Err(LockError::TimedOut {
            reason: TimeoutReason::Busy,
            waited,
            ref key,
            ..
        }) => {
            assert_eq!(key, "busy");
            assert!(waited >= wait, "gave up early: {waited:?}");
        }
        other => panic!("expected TimedOut(Busy), got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst), "body ran without the lock");
    assert!(
        elapsed >= wait && elapsed < wait + Duration::from_millis(1500),
        "took {elapsed:?}"
    );
    holder
        .await
        .expect("holder task")
        .expect("holder kept its lock");
}

/// `try_with_lock` on a busy lock: `Ok(None)` at once, body not run; on a free lock: `Some`.
pub async fn try_lock_busy_and_free(target: &Target) {
    let client = target.client().await;
    let locks: Locks<str> = target.locks(&client, "try", Duration::from_secs(5)).await;
    let outer = locks
        .with_lock("k", Duration::from_secs(2), async {
            let ran = AtomicBool::new(false);
            let started = Instant::now();
            let inner = locks
                .try_with_lock("k", async { ran.store(true, Ordering::SeqCst) })
                .await;
            assert!(matches!(inner, Ok(None)), "busy try_lock gave {inner:?}");
            assert!(!ran.load(Ordering::SeqCst), "busy try_lock ran its body");
            assert!(started.elapsed() < Duration::from_secs(1));
            7
        })
        .await;
    assert_eq!(outer.expect("outer lock"), 7);
    let free = locks
        .try_with_lock("k", async { 8 })
        .await
        .expect("free try_lock");
    assert_eq!(free, Some(8));
}

/// A short lease (100 ms on a standalone server) survives a 1.2 s body through renewal; the key
/// is gone after release.
///
/// Where every renewal also waits for replicas, the lease is 300 ms, as in
/// `primitives_renew_short_leases`: a 100 ms lease leaves a renewal's `WAIT` about 40 ms, and on a
/// 2-core machine running this binary's tests and a dozen servers at once both replicas
/// sometimes take longer than that, and then the retries' shorter `WAIT`s as well (seen in about
/// 1 run in 40 through Sentinel: `LockLost(NotAcknowledged { acknowledged: 0, required: 2 })` after
/// 506 ms).
pub async fn renewal_keeps_short_lease(target: &Target) {
    let client = target.client().await;
    let lease = if target.label == "standalone" {
        Duration::from_millis(100)
    } else {
        Duration::from_millis(300)
    };
    let locks: Locks<str> = target.locks(&client, "renew", lease).await;
    let server_key = LockClient::server_key(locks.namespace(), "long");
    let before = client.stats().renewals;
    let seen_ttls = locks
        .with_lock("long", Duration::from_secs(2), async {
            let mut ttls = Vec::new();
            for _ in 0..12 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                ttls.push(raw_pttl(&client, &server_key).await);
                let lease = sage_lock::current_lease().expect("lease in body");
                assert!(lease.is_valid(), "usable lease ran out while renewing");
            }
            ttls
        })
        .await
        .expect("body ran to completion under renewal");
    assert!(
        seen_ttls.iter().all(|ttl| *ttl > 0),
        "key expired mid-body: {seen_ttls:?}"
    );
    assert!(
        client.stats().renewals - before >= 8,
        "too few renewals: {:?}",
        client.stats()
    );
    assert!(
        !raw_exists(&client, &server_key).await,
        "release left the key behind"
    );
}

/// Deleting the key from outside -> `LockLost(NotOwner)` and the body is cancelled.
pub async fn loss_when_key_deleted(target: &Target) {
    loss_case(target, "lost-del", false).await;
}

/// Overwriting the key from outside (another owner) -> `LockLost(NotOwner)`; the other owner's
/// value is left alone.
pub async fn loss_when_key_overwritten(target: &Target) {
    loss_case(target, "lost-set", true).await;
}

async fn loss_case(target: &Target, test: &str, overwrite: bool) {
    let client = target.client().await;
    let locks: Locks<str> = target
        .locks(&client, test, Duration::from_millis(300))
        .await;
    let server_key = LockClient::server_key(locks.namespace(), "victim");
    let finished = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let result = locks
        .with_lock("victim", Duration::from_secs(2), {
            let (client, finished, server_key) =
                (client.clone(), finished.clone(), server_key.clone());
            async move {
                if overwrite {
                    raw_set(&client, &server_key, "someone-else").await;
                } else {
                    raw_del(&client, &server_key).await;
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
                finished.store(true, Ordering::SeqCst);
            }
        })
        .await;
    match result {
        Err(LockError::LockLost {
            reason: LossReason::NotOwner,
            ..
        }) => {}
        other => panic!("expected LockLost(NotOwner), got {other:?}"),
    }
    // Detected at the next renewal (a third of the lease), not after the body.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "loss detected late: {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!finished.load(Ordering::SeqCst), "body was not cancelled");
    if overwrite {
        use sage_lock::fred::interfaces::KeysInterface;
        let value: Option<String> = client
            .fred()
            .get(sage_lock::fred::types::Key::from(&server_key[..]))
            .await
            .expect("GET");
        assert_eq!(
            value.as_deref(),
            Some("someone-else"),
            "cleanup deleted another owner's key"
        );
    }
    assert!(client.stats().losses >= 1);
}

/// Dropping the `with_lock` future (here through `tokio::time::timeout`) releases the lock.
pub async fn cancellation_releases(target: &Target) {
    let client = target.client().await;
    let locks: Locks<str> = target
        .locks(&client, "cancel", Duration::from_secs(20))
        .await;
    let server_key = LockClient::server_key(locks.namespace(), "c");
    let outcome = tokio::time::timeout(
        Duration::from_millis(300),
        locks.with_lock(
            "c",
            Duration::from_secs(2),
            tokio::time::sleep(Duration::from_secs(60)),
        ),
    )
    .await;
    assert!(outcome.is_err(), "the body should still have been running");
    let deadline = Instant::now() + Duration::from_secs(2);
    while raw_exists(&client, &server_key).await {
        assert!(
            Instant::now() < deadline,
            "lock not released after cancellation"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // And it is acquirable at once, long before its 20 s lease would have expired.
    let again = locks
        .try_with_lock("c", async { 1 })
        .await
        .expect("try after cancel");
    assert_eq!(again, Some(1));
}

/// The same key in two namespaces is two locks.
pub async fn namespaces_isolate(target: &Target) {
    let client = target.client().await;
    let a: Locks<str> = target.locks(&client, "ns-a", Duration::from_secs(5)).await;
    let b: Locks<str> = target.locks(&client, "ns-b", Duration::from_secs(5)).await;
    let inner = a
        .with_lock("shared-name", Duration::from_secs(2), async {
            b.try_with_lock("shared-name", async { 2 }).await
        })
        .await
        .expect("outer");
    assert_eq!(inner.expect("inner"), Some(2));
}

/// Locks are not reentrant: the same key inside its own scope contends with the outer scope.
pub async fn not_reentrant(target: &Target) {
    let client = target.client().await;
    let locks: Locks<str> = target
        .locks(&client, "reentrant", Duration::from_secs(5))
        .await;
    let inner = locks
        .with_lock("r", Duration::from_secs(2), async {
            locks
                .with_lock("r", Duration::from_millis(200), async { "inner ran" })
                .await
        })
        .await
        .expect("outer");
    assert!(
        matches!(inner, Err(LockError::TimedOut { .. })),
        "inner got {inner:?}"
    );
}

/// A body's own error is returned untouched, and the lock is released afterwards.
pub async fn body_error_untouched(target: &Target) {
    let client = target.client().await;
    let locks: Locks<str> = target
        .locks(&client, "body-err", Duration::from_secs(5))
        .await;
    let out: Result<Result<(), String>, LockError> = locks
        .with_lock("e", Duration::from_secs(2), async {
            Err("domain failure".to_owned())
        })
        .await;
    assert_eq!(
        out.expect("lock itself fine"),
        Err("domain failure".to_owned())
    );
    assert!(!raw_exists(&client, &LockClient::server_key(locks.namespace(), "e")).await);
}

/// Binary, unicode and brace-containing keys lock independently and release cleanly.
pub async fn binary_and_unicode_keys(target: &Target) {
    let client = target.client().await;
    let ns = target.ns("bytes");
    let bytes: Locks<[u8]> = client
        .lock_with(LockOptions::new().namespace(ns.as_str()))
        .expect("opts");
    let text: Locks<str> = client
        .lock_with(LockOptions::new().namespace(ns.as_str()))
        .expect("opts");
    let keys: [&[u8]; 4] = [
        b"\x00\xff\xfe binary",
        "ключ-🔒".as_bytes(),
        b"{braces}:and}{more",
        b"",
    ];
    for key in keys {
        let other = bytes
            .try_with_lock(key, async { bytes.try_with_lock(key, async {}).await })
            .await;
        assert!(
            matches!(other, Ok(Some(Ok(None)))),
            "key {key:?}: {other:?}"
        );
        assert!(!raw_exists(&client, &LockClient::server_key(&ns, key)).await);
    }
    // A UTF-8 string key and its bytes name the same lock.
    let same = text
        .with_lock("ключ-🔒", Duration::from_secs(1), async {
            bytes.try_with_lock("ключ-🔒".as_bytes(), async {}).await
        })
        .await
        .expect("outer");
    assert!(matches!(same, Ok(None)));
}

/// Fencing tokens strictly increase per key; `current_lease()` exposes them inside the body only.
pub async fn fencing_tokens_increase(target: &Target) {
    let client = target.client().await;
    let locks: Locks<str> = target.locks(&client, "fence", Duration::from_secs(5)).await;
    assert!(sage_lock::current_lease().is_none());
    let mut last = 0;
    for _ in 0..5 {
        let token = locks
            .with_lock("f", Duration::from_secs(1), async {
                let lease = sage_lock::current_lease().expect("lease in body");
                assert_eq!(lease.key(), "f");
                assert!(lease.remaining() > Duration::from_secs(4));
                lease.fencing_token()
            })
            .await
            .expect("acquire");
        assert!(token > last, "fencing token {token} not above {last}");
        last = token;
    }
}

/// Invalid arguments are rejected before anything is sent, with messages that name the fix.
pub async fn invalid_arguments(target: &Target) {
    let client = target.client().await;
    let short = client.lock_with::<str>(LockOptions::new().lease(Duration::from_millis(29)));
    let Err(LockError::InvalidArgument {
        argument: "lease",
        message,
    }) = short
    else {
        panic!("lease 29ms accepted: {short:?}");
    };
    assert!(message.contains("30ms"), "{message}");
    let empty = client.lock_with::<str>(LockOptions::new().namespace(""));
    assert!(
        matches!(
            empty,
            Err(LockError::InvalidArgument {
                argument: "namespace",
                ..
            })
        ),
        "{empty:?}"
    );
    let locks = client.lock::<str>();
    let zero = locks.with_lock("z", Duration::ZERO, async {}).await;
    assert!(
        matches!(
            zero,
            Err(LockError::InvalidArgument {
                argument: "wait_timeout",
                ..
            })
        ),
        "{zero:?}"
    );
    assert!(
        client
            .lock_with::<str>(LockOptions::new().lease(Duration::from_millis(30)))
            .is_ok()
    );
    // Absurdly large values are not errors (nor panics): they mean "wait as long as it takes".
    let forever = locks.with_lock("forever", Duration::MAX, async { 1 }).await;
    assert_eq!(forever.expect("Duration::MAX wait"), 1);
}

/// A client kept across runtimes (a `static`, or the global client of `#[locked]`, used by
/// several `#[tokio::test]`s, each with a runtime of its own): after the runtime that connected
/// it shut down, it works on the next one (it failed with "Failed to send command to router"),
/// its locks are renewed, and its waiters are still woken by release notifications, not left
/// to their 500 ms poll. Runs its runtimes on a blocking thread of the test's own.
pub async fn outlives_the_runtime_that_connected_it(target: &Target) {
    let target = target.clone();
    tokio::task::spawn_blocking(move || outlive_runtimes(&target))
        .await
        .expect("the runtimes' thread");
}

fn outlive_runtimes(target: &Target) {
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    }
    let name = format!("{} {}", target.kind.name(), target.label);
    let ns = target.ns("runtimes");
    let options = || {
        LockOptions::new()
            .namespace(ns.as_str())
            .lease(Duration::from_secs(5))
    };
    let client = runtime().block_on(target.client());
    for round in 0..3 {
        runtime().block_on(async {
            let locks: Locks<str> = client.lock_with(options()).expect("opts");
            let first = tokio::time::timeout(
                Duration::from_secs(10),
                locks.with_lock("k", Duration::from_secs(2), async {}),
            )
            .await
            .unwrap_or_else(|_| panic!("{name} round {round}: no answer in 10 s"));
            assert!(first.is_ok(), "{name} round {round}: {first:?}");
            if round > 0 {
                // The renewer started on the runtime before is gone with it.
                let short: Locks<str> = client
                    .lock_with(
                        LockOptions::new()
                            .namespace(ns.as_str())
                            .lease(Duration::from_millis(400)),
                    )
                    .expect("opts");
                let held = short
                    .with_lock("renewed", Duration::from_secs(2), async {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    })
                    .await;
                assert!(
                    held.is_ok(),
                    "{name} round {round}: a 400 ms lease held for 1 s: {held:?}"
                );
            }
            // Another client (another process) holds; this client's waiter queues on the
            // server and subscribes; the release hands over and notifies it.
            let other = target.client().await;
            let holder: Locks<str> = other.lock_with(options()).expect("opts");
            let (held, is_held) = tokio::sync::oneshot::channel();
            let holding = tokio::spawn(async move {
                holder
                    .with_lock("contended", Duration::from_secs(2), async {
                        let _ = held.send(());
                        // Released 100 ms in: a waiter that misses its notification finds the
                        // lock at its next poll, ~500 ms in.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Instant::now()
                    })
                    .await
            });
            is_held.await.expect("the holder took the lock");
            let took = locks
                .with_lock("contended", Duration::from_secs(5), async {
                    Instant::now()
                })
                .await
                .unwrap_or_else(|e| panic!("{name} round {round}: waiter: {e}"));
            let released = holding
                .await
                .expect("holder task")
                .unwrap_or_else(|e| panic!("{name} round {round}: holder: {e}"));
            let gap = took.saturating_duration_since(released);
            println!("{name} round {round}: the waiter took the lock {gap:?} after the release");
            assert!(
                gap < Duration::from_millis(250),
                "{name} round {round}: the waiter took the lock {gap:?} after the release \
                 (not woken by its notification)"
            );
            other.quit().await;
        });
    }
    runtime().block_on(client.quit());
}

/// How long after `holder` releases `key` (held 100 ms) `waiter`, waiting meanwhile, enters.
pub async fn handoff_gap(holder: &Locks<str>, waiter: &Locks<str>, key: &str) -> Duration {
    let (held_tx, held) = tokio::sync::oneshot::channel::<()>();
    let holding = {
        let holder = holder.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            holder
                .with_lock(key.as_str(), Duration::from_secs(5), async {
                    let _ = held_tx.send(());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Instant::now()
                })
                .await
                .expect("holder")
        })
    };
    held.await.expect("the holder entered");
    let entered = waiter
        .with_lock(key, Duration::from_secs(5), async { Instant::now() })
        .await
        .expect("waiter");
    let released = holding.await.expect("holder task");
    entered.saturating_duration_since(released)
}
