//! `#[locked]` without `client = ...` uses the process-wide client of `sage_lock::global`: the one
//! installed with `global::install`, else one connected lazily from `SAGE_LOCK_URL`; unset
//! arguments take the service-wide defaults of `global::set_defaults`.
//!
//! The global client and defaults can be set only once per process (and the environment cannot
//! be changed without `unsafe`), so each scenario runs in its own process,
//! `src/bin/global_scenarios.rs`, started here with the environment it needs.

use std::process::Command;

use harness::ServerKind;

const URL_VARIABLE: &str = sage_lock::global::URL_VARIABLE;
const URL_FOR_INSTALL: &str = "SAGE_LOCK_TEST_INSTALL_URL";

/// Runs `scenario` in a fresh process with `env` set (and `SAGE_LOCK_URL` removed unless given),
/// and fails with its output if it fails.
fn run_scenario(scenario: &str, env: &[(&str, String)]) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_global_scenarios"));
    command
        .arg(scenario)
        .env_remove(URL_VARIABLE)
        .env_remove(URL_FOR_INSTALL);
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
fn global_client_from_sage_lock_url() {
    for kind in ServerKind::ALL {
        run_scenario("from-url", &[(URL_VARIABLE, harness::shared(kind).url())]);
    }
}

/// Connected lazily in one runtime, the global client serves the next ones (each
/// `#[tokio::test]` runs on a runtime of its own).
#[test]
fn global_client_serves_one_runtime_after_another() {
    for kind in ServerKind::ALL {
        run_scenario("runtimes", &[(URL_VARIABLE, harness::shared(kind).url())]);
    }
}

#[test]
fn global_client_installed_with_service_defaults() {
    for kind in ServerKind::ALL {
        run_scenario(
            "installed",
            &[(URL_FOR_INSTALL, harness::shared(kind).url())],
        );
    }
}

#[test]
fn no_global_client_is_a_clear_error() {
    run_scenario("without-client", &[]);
}

/// A malformed `SAGE_LOCK_URL` (a password in it), an empty one or one where no server is: the
/// error names the variable and the lock of the call that connects, and never prints the
/// password.
#[test]
fn a_bad_sage_lock_url_is_named_without_its_password() {
    // Nothing listens there once the listener is dropped.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    for url in [
        "redis:/user:hunter2@127.0.0.1:6379".to_owned(),
        String::new(),
        "redis://127.0.0.1:1?sentinelPassword=hunter2".to_owned(),
        format!("redis://user:hunter2@127.0.0.1:{closed}"),
    ] {
        run_scenario("bad-url", &[(URL_VARIABLE, url)]);
    }
}
