//! Test helper process for `tests/profiles.rs`: runs one scenario of named lock profiles
//! (`sage_lock::global::set_profiles`, `#[locked(profile = ...)]`, `check_profiles`) against the
//! server at `SAGE_LOCK_TEST_PROFILE_URL`, and exits non-zero if it fails. Profiles can be
//! installed once per process and are read with the process's environment, so each scenario
//! needs a process of its own.
//!
//! Usage: `profile_scenarios <from-toml | bad-env | not-installed>`.

use std::time::{Duration, Instant};

use sage_lock::global::{self, ServiceDefaults};
use sage_lock::{
    LockClient, LockError, LockOptions, Locks, Profiles, TimeoutReason, current_lease, locked,
};

const URL: &str = "SAGE_LOCK_TEST_PROFILE_URL";

/// The profiles as a service would keep them in its configuration file.
const CONFIG: &str = r#"
[lock_profiles.account-updates]
lease = "20s"
wait = "300ms"
namespace = "profile-accounts"

[lock_profiles.reports]
lease = "1m"
wait = "5s"
replica_ack = false
reentrant = true

[lock_profiles.no-wait]
namespace = "profile-no-wait"
"#;

#[derive(Debug, serde::Deserialize)]
struct Config {
    lock_profiles: Profiles,
}

#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

/// The namespace and remaining lease seen inside the body.
type Seen = (String, Duration);

fn seen() -> Seen {
    let lease = current_lease().expect("the body runs inside the lock");
    (lease.namespace().to_owned(), lease.remaining())
}

/// Several keys with a profile: all of them or none, with the profile's namespace and wait.
#[locked(profile = "account-updates", key = ["account:{from}", "account:{to}"])]
async fn move_between(from: u64, to: u64) -> Result<(Seen, Option<u64>), AppError> {
    let lease = current_lease().expect("the body runs inside the lock");
    Ok((seen(), lease.fencing_token_of(&format!("account:{to}"))))
}

/// The same, trying.
#[locked(profile = "account-updates", key = ["account:{from}", "account:{to}"], try_lock)]
async fn move_if_free(from: u64, to: u64) -> Result<Option<Seen>, AppError> {
    Ok(seen())
}

/// Everything from the profile (lease overridden by the environment to 7 s).
#[locked(profile = "account-updates", key = "account:{id}")]
async fn update_account(id: u64) -> Result<Seen, AppError> {
    let _ = id;
    Ok(seen())
}

/// The attribute's namespace and wait override the profile's.
#[locked(
    profile = "account-updates",
    key = "account:{id}",
    namespace = "profile-attr",
    wait = "1s"
)]
async fn update_account_elsewhere(id: u64) -> Result<Seen, AppError> {
    let _ = id;
    Ok(seen())
}

/// The profile's wait is 5 s; the attribute waits 100 ms.
#[locked(
    profile = "reports",
    key = "report:{day}",
    wait = "100ms",
    namespace = "profile-reports"
)]
async fn report_quickly(day: u32) -> Result<Seen, AppError> {
    let _ = day;
    Ok(seen())
}

/// No namespace in the profile: the service default applies. `try_lock` needs no wait.
/// The profile is reentrant: a nested call for the held report runs at once, unless its
/// attribute turns reentrancy off (the attribute wins over the profile).
#[locked(profile = "reports", key = "report:{day}", wait = "200ms")]
async fn report_nested(day: u32) -> Result<(bool, bool), AppError> {
    let reentered = report_reentered(day).await.is_ok();
    let refused = matches!(
        report_strict(day).await,
        Err(AppError::Lock(LockError::TimedOut {
            reason: TimeoutReason::HeldByThisTask,
            ..
        }))
    );
    Ok((reentered, refused))
}

#[locked(profile = "reports", key = "report:{day}", wait = "200ms")]
async fn report_reentered(day: u32) -> Result<(), AppError> {
    Ok(())
}

#[locked(
    profile = "reports",
    key = "report:{day}",
    wait = "200ms",
    reentrant = false
)]
async fn report_strict(day: u32) -> Result<(), AppError> {
    Ok(())
}

#[locked(profile = "reports", key = "report:{day}", try_lock)]
async fn report_if_free(day: u32) -> Result<Option<Seen>, AppError> {
    let _ = day;
    Ok(seen())
}

/// A profile without a wait, in waiting mode: an error at run time.
#[locked(profile = "no-wait", key = "job")]
async fn without_wait() -> Result<(), AppError> {
    Ok(())
}

/// A profile that is not configured.
#[locked(profile = "missing-profile", key = "job", try_lock)]
async fn unknown_profile() -> Result<Option<()>, AppError> {
    Ok(())
}

/// The message of an `InvalidArgument`, or a panic.
fn invalid(result: Result<impl std::fmt::Debug, AppError>) -> (&'static str, String) {
    match result {
        Err(AppError::Lock(LockError::InvalidArgument { argument, message })) => {
            (argument, message)
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

async fn client() -> LockClient {
    let url = std::env::var(URL).expect("set by the parent");
    let client = LockClient::connect(&url).await.expect("connect");
    global::install(client.clone()).expect("install once");
    client
}

async fn from_toml() {
    let client = client().await;
    global::set_defaults(ServiceDefaults::new().namespace("profile-defaults"))
        .expect("set the defaults once");
    let config: Config = toml::from_str(CONFIG).expect("valid configuration");
    assert_eq!(config.lock_profiles.len(), 3);
    global::set_profiles(config.lock_profiles.clone()).expect("install the profiles");

    // Installed with the environment's overrides: lease 7 s for account-updates (the parent sets
    // SAGE_LOCK_PROFILE_ACCOUNT_UPDATES_LEASE=7s), the rest as configured.
    let installed = global::profile("account-updates").expect("installed");
    assert_eq!(installed.lease, Some(Duration::from_secs(7)));
    assert_eq!(installed.wait, Some(Duration::from_millis(300)));
    assert_eq!(
        global::profile("reports").expect("installed"),
        config.lock_profiles.get("reports").expect("configured")
    );

    // Lease from the environment, namespace from the file.
    let (namespace, remaining) = update_account(1).await.expect("free");
    assert_eq!(namespace, "profile-accounts");
    assert!(
        remaining <= Duration::from_secs(7) && remaining > Duration::from_secs(5),
        "{remaining:?}"
    );
    // The attribute's namespace wins over the profile's.
    let (namespace, remaining) = update_account_elsewhere(1).await.expect("free");
    assert_eq!(namespace, "profile-attr");
    assert!(remaining > Duration::from_secs(5), "{remaining:?}");
    // No namespace in the profile: the service default.
    let (namespace, remaining) = report_if_free(1).await.expect("try").expect("free");
    assert_eq!(namespace, "profile-defaults");
    assert!(remaining > Duration::from_secs(50), "{remaining:?}");

    // The profile's reentrancy, and the attribute's `reentrant = false` winning over it.
    assert_eq!(report_nested(9).await.expect("outer call"), (true, true));

    // The profile's wait (300 ms) applies while the lock is held by hand.
    let hand: Locks<String> = client
        .lock_with(LockOptions::new().namespace("profile-accounts"))
        .expect("options");
    let (release, holder) = harness::hold_by_hand(&hand, "account:2").await;
    let start = Instant::now();
    match update_account(2).await {
        Err(AppError::Lock(LockError::TimedOut {
            reason: TimeoutReason::Busy,
            waited,
            ..
        })) => assert!(waited >= Duration::from_millis(290), "{waited:?}"),
        other => panic!("expected TimedOut(Busy), got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    let _ = release.send(());
    holder.await.expect("holder");

    // The attribute's wait (100 ms) wins over the profile's (5 s).
    let hand: Locks<String> = client
        .lock_with(LockOptions::new().namespace("profile-reports"))
        .expect("options");
    let (release, holder) = harness::hold_by_hand(&hand, "report:3").await;
    let start = Instant::now();
    match report_quickly(3).await {
        Err(AppError::Lock(LockError::TimedOut { .. })) => {}
        other => panic!("expected TimedOut, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    let _ = release.send(());
    holder.await.expect("holder");

    // Several keys with the profile: its namespace, lease and wait (300 ms) apply to them all.
    let ((namespace, remaining), token) = move_between(6, 7).await.expect("both free");
    assert_eq!(namespace, "profile-accounts");
    assert!(
        remaining <= Duration::from_secs(7) && remaining > Duration::from_secs(5),
        "{remaining:?}"
    );
    assert!(token.is_some_and(|token| token > 0), "{token:?}");
    let accounts: Locks<String> = client
        .lock_with(LockOptions::new().namespace("profile-accounts"))
        .expect("options");
    let (release, holder) = harness::hold_by_hand(&accounts, "account:7").await;
    let start = Instant::now();
    match move_between(6, 7).await {
        Err(AppError::Lock(LockError::TimedOut {
            reason: TimeoutReason::Busy,
            waited,
            ..
        })) => assert!(waited >= Duration::from_millis(290), "{waited:?}"),
        other => panic!("expected TimedOut(Busy) for a held key, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!(
        move_if_free(7, 6).await.expect("try").is_none(),
        "one key held: busy"
    );
    let _ = release.send(());
    holder.await.expect("holder");
    let (namespace, _) = move_if_free(7, 6)
        .await
        .expect("try")
        .expect("both free again");
    assert_eq!(namespace, "profile-accounts");

    // A profile without a wait, in waiting mode.
    let (argument, message) = invalid(without_wait().await);
    assert_eq!(argument, "wait");
    assert!(
        message.contains("\"no-wait\"") && message.contains("SAGE_LOCK_PROFILE_NO_WAIT_WAIT"),
        "{message}"
    );
    // An unknown profile at run time names it and what is installed.
    let (argument, message) = invalid(unknown_profile().await);
    assert_eq!(argument, "profile");
    assert!(
        message.contains("\"missing-profile\"") && message.contains("\"account-updates\""),
        "{message}"
    );

    // check_profiles lists the one missing profile with its function, and nothing installed.
    let error = global::check_profiles().expect_err("missing-profile is not configured");
    let message = error.to_string();
    assert!(
        message.contains("1 lock profile used by #[locked] is not configured")
            && message.contains(
                "\"missing-profile\" (used by unknown_profile at tests/src/bin/profile_scenarios.rs:"
            ),
        "{message}"
    );
    assert!(!message.contains("\"reports\" (used"), "{message}");
    // ... and the installed profile without the wait a waiting function needs (audit 35: it
    // passed the start-up check, then failed every call).
    assert!(
        message.contains("has no wait")
            && message.contains("\"no-wait\" (used by without_wait at")
            && message.contains("SAGE_LOCK_PROFILE_NO_WAIT_WAIT"),
        "{message}"
    );

    // Installed once.
    let again = global::set_profiles(Profiles::new());
    assert!(
        matches!(&again, Err(LockError::InvalidArgument { message, .. }) if message.contains("once")),
        "{again:?}"
    );
}

fn bad_env() {
    let config: Config = toml::from_str(CONFIG).expect("valid configuration");
    // The parent sets SAGE_LOCK_PROFILE_REPORTS_WAIT=5 (no unit).
    let error = global::set_profiles(config.lock_profiles).expect_err("bad override");
    let message = error.to_string();
    assert!(
        message.contains("SAGE_LOCK_PROFILE_REPORTS_WAIT=\"5\"") && message.contains("\"5s\""),
        "{message}"
    );
    assert!(global::profiles().is_none(), "nothing installed");
}

async fn not_installed() {
    let _client = client().await;
    let error = global::check_profiles().expect_err("nothing installed");
    let message = error.to_string();
    for name in ["account-updates", "reports", "no-wait", "missing-profile"] {
        assert!(message.contains(&format!("{name:?} (used by")), "{message}");
    }
    assert!(
        message.contains("4 lock profiles used by #[locked] are not"),
        "{message}"
    );
    assert!(message.contains("no profiles are installed"), "{message}");
    let (argument, message) = invalid(update_account(1).await);
    assert_eq!(argument, "profile");
    assert!(message.contains("set_profiles"), "{message}");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // Warnings go to stderr, which the parent test reads.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let scenario = std::env::args().nth(1).unwrap_or_default();
    match scenario.as_str() {
        "from-toml" => from_toml().await,
        "bad-env" => bad_env(),
        "not-installed" => not_installed().await,
        other => panic!("unknown scenario {other:?}: from-toml | bad-env | not-installed"),
    }
    println!("scenario {scenario} passed");
}
