//! Named lock profiles: loaded from TOML, overridden from the environment, used by
//! `#[locked(profile = ...)]` with the attribute's arguments winning, unknown profiles and missing
//! waits as clear errors, and `check_profiles` listing what is not configured.
//!
//! Profiles are installed once per process and read the process's environment, so each scenario
//! runs in its own process, `src/bin/profile_scenarios.rs`, started here with the environment it
//! needs (nothing here changes this process's environment, so no test races another).

use std::process::Command;

use harness::ServerKind;

const URL: &str = "SAGE_LOCK_TEST_PROFILE_URL";

/// Runs `scenario` in a fresh process with only the `SAGE_LOCK_PROFILE_*` variables in `env`,
/// and fails with its output if it fails; returns what it logged (warnings, on stderr).
fn run_scenario(scenario: &str, env: &[(&str, String)]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_profile_scenarios"));
    command.arg(scenario).env_remove(URL);
    for (name, _) in std::env::vars() {
        if name.starts_with("SAGE_LOCK_") {
            command.env_remove(name);
        }
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("run the scenario process");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("passed"),
        "scenario {scenario} failed ({:?}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn profiles_from_toml_and_env_with_attribute_overrides() {
    for kind in ServerKind::ALL {
        let logged = run_scenario(
            "from-toml",
            &[
                (URL, harness::shared(kind).url()),
                ("SAGE_LOCK_PROFILE_ACCOUNT_UPDATES_LEASE", "7s".to_owned()),
            ],
        );
        // The override matches an installed profile; the refused second `set_profiles` (with
        // no profiles) logs nothing either. It logged that the environment variable overrode no
        // installed lock profile ("overrides nothing" now), and only then failed.
        assert!(
            !logged.contains("environment variable overrides nothing"),
            "{}: {logged}",
            kind.name()
        );
    }
}

#[test]
fn bad_environment_override_names_the_variable() {
    run_scenario(
        "bad-env",
        &[("SAGE_LOCK_PROFILE_REPORTS_WAIT", "5".to_owned())],
    );
}

#[test]
fn check_profiles_lists_every_missing_profile() {
    for kind in ServerKind::ALL {
        run_scenario("not-installed", &[(URL, harness::shared(kind).url())]);
    }
}

/// The run-time duration parser and the macro's are one file, kept identical.
#[test]
fn duration_grammar() {
    assert_eq!(
        include_str!("../../sage-lock/src/duration.rs"),
        include_str!("../../sage-lock-macros/src/duration.rs"),
        "sage-lock/src/duration.rs and sage-lock-macros/src/duration.rs must stay identical"
    );
}

/// The service example's profiles file is valid and names the profiles its annotations use.
#[test]
fn service_example_profiles_file_is_valid() {
    #[derive(serde::Deserialize)]
    struct Config {
        lock_profiles: sage_lock::Profiles,
    }
    let config: Config = toml::from_str(include_str!("../../examples/service-profiles.toml"))
        .expect("examples/service-profiles.toml is valid");
    let names: Vec<&str> = config.lock_profiles.names().collect();
    assert_eq!(names, ["accounts", "journal"]);
    for (name, profile) in config.lock_profiles.iter() {
        assert!(profile.wait.is_some(), "{name} sets a wait");
    }
}

/// A profile's minimum hold and reentrancy reach the lock: the key outlives the body for the
/// rest of the minimum hold, and a nested call for the held key runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_hold_at_least_and_reentrant_apply() {
    use std::time::{Duration, Instant};

    #[derive(serde::Deserialize)]
    struct Config {
        lock_profiles: sage_lock::Profiles,
    }
    let config: Config = toml::from_str(
        r#"
        [lock_profiles.nightly]
        namespace = "profile-hold"
        lease = "5s"
        hold_at_least = "1500ms"
        reentrant = true
        "#,
    )
    .expect("valid profiles");
    let profile = config.lock_profiles.get("nightly").expect("profile");
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let client = sage_lock::LockClient::connect(&server.url())
            .await
            .expect("connect");
        let key = format!("job-{}", rand::random::<u32>());
        let locks = client
            .lock_with::<str>(profile.options())
            .expect("profile options");
        let started = Instant::now();
        let nested = locks
            .with_lock(&key, Duration::from_secs(2), async {
                // Reentrant: the held lock's body runs at once, under the same fencing token.
                let outer = sage_lock::current_lease().map(|l| l.fencing_token());
                let inner = locks
                    .with_lock(&key, Duration::from_millis(100), async {
                        sage_lock::current_lease().map(|l| l.fencing_token())
                    })
                    .await
                    .expect("nested call under the held lock");
                (outer, inner)
            })
            .await
            .expect("outer call");
        assert_eq!(nested.0, nested.1, "{}: same lease inside", kind.name());
        assert!(
            locks.is_locked(&key).await.expect("is_locked"),
            "{}: the minimum hold keeps the key after the body",
            kind.name()
        );
        let busy = locks.try_with_lock(&key, async {}).await.expect("try");
        assert!(
            busy.is_none(),
            "{}: still held for the minimum hold",
            kind.name()
        );
        // Free once the minimum hold has passed.
        let freed = loop {
            if !locks.is_locked(&key).await.expect("is_locked") {
                break started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            freed >= Duration::from_millis(1400) && freed < Duration::from_secs(4),
            "{}: freed after {freed:?}",
            kind.name()
        );
        client.quit().await;
    }
}
