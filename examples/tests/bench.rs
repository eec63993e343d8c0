//! The benchmark with `SAGE_LOCK_URL` set: `--valkey` and `--both` name the servers to measure,
//! so they start throwaway ones of their own (each half of `--both` on its own kind) instead of
//! measuring the URL's server under another name; a run on the URL's server leaves none of its
//! keys there. (Audit 43: before, `--valkey` and both halves of `--both` measured the URL's
//! server, whose Redis figures went to `bench-valkey.json`, and the run left its locks'
//! `{bench:*}` and `{bench-primitives:*}` keys on it.)

use std::io::{BufRead as _, BufReader};
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};

use fred::interfaces::ClientLike as _;
use fred::types::{ClusterHash, CustomCommand};
use sage_lock::LockClient;
use sage_lock_examples::{ServerKind, ThrowawayServer};

/// Starts the bench with `args` and `SAGE_LOCK_URL=url` in a process group of its own, reads its
/// stderr up to the first line naming the server it measures (`bench...: SERVER (version ...)`),
/// stops the whole group, and returns the lines read.
fn server_lines(args: &[&str], url: &str) -> Vec<String> {
    let dir = std::env::temp_dir().join(format!("bench-test-{}", std::process::id()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .arg("--json")
        .arg(dir.join("bench.json"))
        .env(sage_lock_examples::URL_VARIABLE, url)
        .env_remove("SAGE_LOCK_SERVER")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("start the bench");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        let done = line.starts_with("bench") && line.contains("(version ");
        lines.push(line);
        if done {
            break;
        }
    }
    let group = format!("-{}", child.id());
    let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    lines
}

#[test]
fn valkey_flag_measures_a_throwaway_valkey_not_the_url() {
    let server = ThrowawayServer::start_kind(ServerKind::Redis).expect("start a server");
    let lines = server_lines(&["--quick", "--valkey"], server.url());
    let shown = lines.join("\n");
    let header = lines.last().map_or("", String::as_str);
    assert!(
        header.contains("valkey-server") && !header.contains("existing server"),
        "--valkey did not measure a Valkey of its own:\n{shown}"
    );
    assert!(
        shown.contains(sage_lock_examples::URL_VARIABLE),
        "it does not say that SAGE_LOCK_URL is ignored:\n{shown}"
    );
}

#[test]
fn both_flag_measures_a_throwaway_redis_first_not_the_url() {
    let server = ThrowawayServer::start_kind(ServerKind::Redis).expect("start a server");
    let lines = server_lines(&["--quick", "--both"], server.url());
    let shown = lines.join("\n");
    let header = lines.last().map_or("", String::as_str);
    assert!(
        header.contains("redis-server") && !header.contains("existing server"),
        "the Redis half of --both did not measure a Redis of its own:\n{shown}"
    );
}

/// Every key on the (throwaway, test-only) server.
async fn all_keys(client: &LockClient) -> Vec<String> {
    let command = CustomCommand::new_static("KEYS", ClusterHash::Random, false);
    client
        .fred()
        .custom(command, vec!["*".to_owned()])
        .await
        .expect("KEYS")
}

#[test]
fn a_bench_run_on_the_users_server_leaves_nothing() {
    let server = ThrowawayServer::start_kind(ServerKind::Redis).expect("start a server");
    let dir = std::env::temp_dir().join(format!("bench-test-left-{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--quick", "--only", "primitives", "--json"])
        .arg(dir.join("bench.json"))
        .env(sage_lock_examples::URL_VARIABLE, server.url())
        .env_remove("SAGE_LOCK_SERVER")
        .stdin(Stdio::null())
        .output()
        .expect("run the bench");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let client = runtime
        .block_on(LockClient::connect(server.url()))
        .expect("connect");
    let left = runtime.block_on(all_keys(&client));
    runtime.block_on(client.quit());
    assert!(left.is_empty(), "the bench left {left:?}\n{stderr}");
}
