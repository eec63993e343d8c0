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
/// and fails with its output if it fails.
fn run_scenario(scenario: &str, env: &[(&str, String)]) {
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
}

#[test]
fn profiles_from_toml_and_env_with_attribute_overrides() {
    for kind in ServerKind::ALL {
        run_scenario(
            "from-toml",
            &[
                (URL, harness::shared(kind).url()),
                ("SAGE_LOCK_PROFILE_ACCOUNT_UPDATES_LEASE", "7s".to_owned()),
            ],
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
