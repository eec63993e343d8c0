//! Test helper process for `tests/macro_global.rs`: runs one scenario of `#[locked]` with the
//! process-wide client of `sage_lock::global` (installed, or connected lazily from
//! `SAGE_LOCK_URL`) and exits non-zero if it fails. The global client and defaults can be set only
//! once per process, so each scenario needs a process of its own.
//!
//! Usage: `global_scenarios <from-url | installed | without-client | bad-url | runtimes>`.

use std::time::Duration;

use sage_lock::global::{self, ServiceDefaults};
use sage_lock::{LockClient, LockError, LockOptions, Locks, current_lease, locked};

const URL_FOR_INSTALL: &str = "SAGE_LOCK_TEST_INSTALL_URL";

#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

type Seen = (String, String);

fn seen() -> Seen {
    let lease = current_lease().expect("the body runs inside the lock");
    (lease.namespace().to_owned(), lease.key().to_owned())
}

#[locked(key = "global:{id}", try_lock, namespace = "macro-global")]
async fn global_try(id: u64) -> Result<Option<Seen>, AppError> {
    Ok(seen())
}

#[locked(key = "global:{id}", wait = "2s", namespace = "macro-global")]
async fn global_wait(id: u64) -> anyhow::Result<Seen> {
    Ok(seen())
}

/// No namespace or lease: the service-wide defaults apply.
#[locked(key = "defaults:{id}", try_lock)]
async fn with_defaults(id: u64) -> Result<Option<(Seen, Duration)>, AppError> {
    let lease = current_lease().expect("inside the lock");
    Ok((seen(), lease.remaining()))
}

// ---------------------------------------------------------------------------------------------
// Scenarios.

async fn connects_from_sage_lock_url() {
    let url = std::env::var(global::URL_VARIABLE).expect("SAGE_LOCK_URL is set by the parent");
    assert!(global::installed().is_none());
    let hand_client = LockClient::connect(&url).await.expect("connect");
    let hand: Locks<String> = hand_client
        .lock_with(LockOptions::new().namespace("macro-global"))
        .expect("options");

    // The first annotated call connects the global client from SAGE_LOCK_URL.
    let (namespace, key) = global_wait(41)
        .await
        .expect("global client from SAGE_LOCK_URL");
    assert_eq!(
        (namespace.as_str(), key.as_str()),
        ("macro-global", "global:41")
    );
    assert!(global::installed().is_some(), "connected once and kept");

    // It is the server behind SAGE_LOCK_URL: a lock held there by hand is busy for the macro.
    let (release, holder) = harness::hold_by_hand(&hand, "global:42").await;
    assert!(global_try(42).await.expect("try").is_none());
    let _ = release.send(());
    holder.await.expect("holder");
    let seen = global_try(42)
        .await
        .expect("try")
        .expect("free after release");
    assert_eq!(seen, ("macro-global".to_owned(), "global:42".to_owned()));

    // Built-in defaults: namespace "lock", lease 30 s.
    let ((namespace, key), remaining) = with_defaults(1).await.expect("defaults").expect("free");
    assert_eq!((namespace.as_str(), key.as_str()), ("lock", "defaults:1"));
    assert!(remaining > Duration::from_secs(20), "{remaining:?}");

    // Installing after the lazy connect is refused: the first client stays.
    assert!(global::install(hand_client).is_err());

    // Defaults set after a call used the built-in ones are refused: a later call in another
    // namespace would not exclude the holders of the first (a holder here keeps its lock).
    let (release, holder) = harness::hold_by_hand(
        &global::client()
            .await
            .expect("global client")
            .lock_with::<String>(LockOptions::new().namespace("lock"))
            .expect("options"),
        "defaults:2",
    )
    .await;
    match global::set_defaults(ServiceDefaults::new().namespace("late")) {
        Err(error @ LockError::InvalidArgument { .. }) => {
            let message = error.to_string();
            assert!(
                message.contains("already") && message.contains("start-up"),
                "{message}"
            );
        }
        other => panic!("set_defaults after first use must be refused, got {other:?}"),
    }
    assert!(
        with_defaults(2).await.expect("try").is_none(),
        "the defaults in use stay: the lock held in namespace lock is busy"
    );
    let _ = release.send(());
    holder.await.expect("holder");
}

/// A `SAGE_LOCK_URL` that is malformed (with a password in it) or empty: the error names the
/// variable and hides the password.
async fn a_bad_sage_lock_url() {
    let url = std::env::var(global::URL_VARIABLE).expect("SAGE_LOCK_URL is set by the parent");
    let error = global_try(1)
        .await
        .map(|_| ())
        .expect_err("a bad SAGE_LOCK_URL cannot connect");
    let AppError::Lock(error) = error;
    let message = error.to_string();
    assert!(message.contains("SAGE_LOCK_URL"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
    // The first call needing the client connects it: its error names that call's lock, so a
    // service log says which function hit it (audit 35).
    assert!(
        message.contains(r#"lock "global:1" in namespace "macro-global""#),
        "{message}"
    );
    if url.trim().is_empty() {
        assert!(message.contains("empty"), "{message}");
    }
}

async fn installed_client_and_defaults() {
    let url = std::env::var(URL_FOR_INSTALL).expect("set by the parent");
    global::set_defaults(
        ServiceDefaults::new()
            .namespace("macro-global-defaults")
            .lease(Duration::from_secs(10)),
    )
    .expect("set the defaults once");
    let client = LockClient::connect(&url).await.expect("connect");
    global::install(client.clone()).expect("install once");
    assert!(
        global::install(client.clone()).is_err(),
        "a second install is an error"
    );

    // Unset arguments take the service defaults; explicit ones win.
    let ((namespace, key), remaining) = with_defaults(5).await.expect("defaults").expect("free");
    assert_eq!(
        (namespace.as_str(), key.as_str()),
        ("macro-global-defaults", "defaults:5")
    );
    assert!(remaining <= Duration::from_secs(10), "{remaining:?}");
    let seen = global_try(5).await.expect("try").expect("free");
    assert_eq!(seen.0, "macro-global");

    // The installed client's server is the one locked.
    let hand: Locks<String> = client
        .lock_with(LockOptions::new().namespace("macro-global-defaults"))
        .expect("options");
    let (release, holder) = harness::hold_by_hand(&hand, "defaults:6").await;
    assert!(with_defaults(6).await.expect("try").is_none());
    let _ = release.send(());
    holder.await.expect("holder");

    // quit() on the installed client is final for the process: a later install says so,
    // rather than only "already installed" (audit 35).
    client.quit().await;
    let replacement = LockClient::connect(&url).await.expect("connect");
    let refused = global::install(replacement.clone()).expect_err("installed once");
    let message = refused.to_string();
    assert!(
        message.contains("quit()") && message.contains("for the rest of the process"),
        "{message}"
    );
    replacement.quit().await;
}

async fn without_a_global_client() {
    assert!(
        std::env::var(global::URL_VARIABLE).is_err(),
        "removed by the parent"
    );
    match global_try(1).await {
        Err(AppError::Lock(error @ LockError::InvalidArgument { .. })) => {
            let message = error.to_string();
            assert!(message.contains("SAGE_LOCK_URL"), "{message}");
            assert!(message.contains("install"), "{message}");
            assert!(message.contains(r#"lock "global:1""#), "{message}");
        }
        other => panic!("expected InvalidArgument through From<LockError>, got {other:?}"),
    }
    let error = global_wait(1).await.expect_err("no global client");
    assert!(error.downcast_ref::<LockError>().is_some(), "{error}");
}

/// The global client outlives the runtime that connected it: each `#[tokio::test]` has a runtime
/// of its own, and a test binary's tests share the process-wide client (the second call used to
/// fail with "Failed to send command to router").
fn one_runtime_per_test() {
    for round in 0..3u64 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let started = std::time::Instant::now();
        let result = runtime.block_on(global_wait(100 + round));
        println!("round {round}: {result:?} after {:?}", started.elapsed());
        let (namespace, key) = result.expect("the global client works on every runtime");
        assert_eq!(namespace, "macro-global");
        assert_eq!(key, format!("global:{}", 100 + round));
    }
}

fn main() {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    if scenario == "runtimes" {
        one_runtime_per_test();
        println!("scenario {scenario} passed");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        match scenario.as_str() {
            "from-url" => connects_from_sage_lock_url().await,
            "installed" => installed_client_and_defaults().await,
            "without-client" => without_a_global_client().await,
            "bad-url" => a_bad_sage_lock_url().await,
            other => panic!(
                "unknown scenario {other:?}: from-url | installed | without-client | bad-url | runtimes"
            ),
        }
    });
    println!("scenario {scenario} passed");
}
