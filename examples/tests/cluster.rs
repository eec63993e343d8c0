//! The demo and the service example on a cluster of the user's (`SAGE_LOCK_URL`): they run to
//! their end (no `CROSSSLOT` error from a multi-key command over several slots) and leave
//! nothing on any node. On a cluster without replicas, where locks wait for a replica's
//! acknowledgement that never comes, the demo says why nothing ran. (Audit 43: before, the demo
//! ended with `CROSSSLOT` after its run and left its keys, every transfer of the service failed
//! with `CROSSSLOT`, and the replica-less demo showed "0 critical sections" without a word.)

use std::process::{Command, Output, Stdio};

use harness::{Cluster, Server, ServerKind};

/// Runs example `bin` with `args` against `url` (as `SAGE_LOCK_URL`).
fn run(bin: &str, args: &[&str], url: &str) -> Output {
    Command::new(bin)
        .args(args)
        .env(sage_lock_examples::URL_VARIABLE, url)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run the example")
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Every key on the nodes listening on `ports`.
fn keys_on(ports: &[u16]) -> Vec<String> {
    ports
        .iter()
        .flat_map(|&port| {
            let reply = harness::cmd_ok(port, &["KEYS", "*"]);
            reply
                .as_array()
                .unwrap_or_default()
                .iter()
                .filter_map(harness::Reply::to_text)
                .map(|key| format!("{port}: {key}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn demo_and_service_run_on_a_cluster_and_leave_nothing() {
    let cluster = Cluster::start(ServerKind::Valkey);
    let url = cluster.url();
    let primaries: Vec<u16> = cluster.nodes[..3].iter().map(Server::port).collect();

    let demo = run(
        env!("CARGO_BIN_EXE_demo"),
        &["--workers", "2", "--keys", "3", "--seconds", "2"],
        &url,
    );
    let shown = text(&demo);
    assert!(demo.status.success(), "demo failed:\n{shown}");
    assert!(shown.contains("CORRECT"), "{shown}");
    assert!(!shown.contains("CROSSSLOT"), "{shown}");
    let left = keys_on(&primaries);
    assert!(left.is_empty(), "the demo left {left:?}\n{shown}");

    let service = run(
        env!("CARGO_BIN_EXE_service"),
        &["--tasks", "4", "--seconds", "1"],
        &url,
    );
    let shown = text(&service);
    assert!(service.status.success(), "service failed:\n{shown}");
    assert!(shown.contains("CONSERVED"), "{shown}");
    assert!(!shown.contains("CROSSSLOT"), "{shown}");
    assert!(shown.contains(" 0 errors"), "{shown}");
    let left = keys_on(&primaries);
    assert!(left.is_empty(), "the service left {left:?}\n{shown}");
}

/// On a cluster without replicas no lock is granted (replica acknowledgement is on by default):
/// the demo says why instead of only "0 critical sections", and still leaves nothing.
#[test]
fn demo_on_a_cluster_without_replicas_says_why_nothing_ran() {
    let node = harness::lone_node_cluster(ServerKind::Valkey);
    let url = format!("redis-cluster://127.0.0.1:{}", node.port());
    let demo = run(
        env!("CARGO_BIN_EXE_demo"),
        &["--workers", "1", "--keys", "1", "--seconds", "1"],
        &url,
    );
    let shown = text(&demo);
    assert!(shown.contains("0 critical sections"), "{shown}");
    assert!(
        shown.contains("replicas acknowledged") && shown.contains("replica"),
        "the demo does not say why nothing ran:\n{shown}"
    );
    assert!(!shown.contains("CROSSSLOT"), "{shown}");
    // Nothing ran, so there is nothing to call correct, and the exit status says so.
    assert!(!shown.contains("CORRECT"), "{shown}");
    assert_eq!(demo.status.code(), Some(2), "{shown}");
    let left = keys_on(&[node.port()]);
    assert!(left.is_empty(), "the demo left {left:?}\n{shown}");
}
