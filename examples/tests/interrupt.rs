//! The demo and the service example on a server of the user's (`SAGE_LOCK_URL`), interrupted
//! with Ctrl-C (SIGINT) mid-run: they stop their workers, remove their own keys from the server
//! (data and locks: nothing of theirs is left), and exit with 130, as a shell expects of an
//! interrupted program. A service run to its end leaves nothing either.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fred::interfaces::ClientLike as _;
use fred::types::{ClusterHash, CustomCommand};
use sage_lock::LockClient;
use sage_lock_examples::{ServerKind, ThrowawayServer};

/// Every key on the (throwaway, test-only) server matching `pattern`.
async fn keys(client: &LockClient, pattern: &str) -> Vec<String> {
    let command = CustomCommand::new_static("KEYS", ClusterHash::Random, false);
    client
        .fred()
        .custom(command, vec![pattern.to_owned()])
        .await
        .expect("KEYS")
}

/// Runs `bin` against `server`, waits until its data keys (`pattern`) appear, sends SIGINT, and
/// returns its exit code, stderr and every key left on the server (its own throwaway one).
fn interrupt(
    bin: &str,
    args: &[&str],
    server: &ThrowawayServer,
    pattern: &str,
) -> (Option<i32>, String, Vec<String>) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let client = runtime
        .block_on(LockClient::connect(server.url()))
        .expect("connect");
    let child = Command::new(bin)
        .args(args)
        .env(sage_lock_examples::URL_VARIABLE, server.url())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the example");
    let started = Instant::now();
    while runtime.block_on(keys(&client, pattern)).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{bin}: no data keys after 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Mid-run: let it work a little longer.
    std::thread::sleep(Duration::from_millis(500));
    let signalled = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(signalled.success(), "kill -INT failed");
    let output = child.wait_with_output().expect("wait for the example");
    // Give killed workers' last commands time to land before looking.
    std::thread::sleep(Duration::from_millis(300));
    let left = runtime.block_on(keys(&client, "*"));
    runtime.block_on(client.quit());
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        left,
    )
}

#[test]
fn an_interrupted_demo_removes_its_data() {
    for kind in [ServerKind::Redis, ServerKind::Valkey] {
        let server = ThrowawayServer::start_kind(kind).expect("start a server");
        let (code, stderr, left) = interrupt(
            env!("CARGO_BIN_EXE_demo"),
            &["--workers", "2", "--keys", "2", "--seconds", "60"],
            &server,
            "demo:*",
        );
        assert_eq!(code, Some(130), "{kind}: {stderr}");
        assert!(left.is_empty(), "{kind}: left on the server: {left:?}");
        assert!(stderr.contains("interrupted"), "{kind}: {stderr}");
    }
}

#[test]
fn an_interrupted_service_removes_its_data() {
    for kind in [ServerKind::Redis, ServerKind::Valkey] {
        let server = ThrowawayServer::start_kind(kind).expect("start a server");
        let (code, stderr, left) = interrupt(
            env!("CARGO_BIN_EXE_service"),
            &["--seconds", "60"],
            &server,
            "bank:*",
        );
        assert_eq!(code, Some(130), "{kind}: {stderr}");
        assert!(left.is_empty(), "{kind}: left on the server: {left:?}");
        assert!(stderr.contains("interrupted"), "{kind}: {stderr}");
    }
}

/// A service run to its end, on a server of the user's: its data and its locks' keys (in the
/// run's own namespaces) are gone afterwards (before, the locks' fencing counters and grant
/// times stayed, in the fixed namespaces `accounts` and `journal`: an audit).
#[test]
fn a_service_run_leaves_nothing_on_the_server() {
    let server = ThrowawayServer::start_kind(ServerKind::Redis).expect("start a server");
    let output = Command::new(env!("CARGO_BIN_EXE_service"))
        .args(["--seconds", "1"])
        .env(sage_lock_examples::URL_VARIABLE, server.url())
        .stdin(Stdio::null())
        .output()
        .expect("run the service example");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("CONSERVED"),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let client = runtime
        .block_on(LockClient::connect(server.url()))
        .expect("connect");
    let left = runtime.block_on(keys(&client, "*"));
    runtime.block_on(client.quit());
    assert!(left.is_empty(), "left on the server: {left:?}");
}
