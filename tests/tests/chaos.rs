//! The short chaos profile: the `chaos` binary (seeded fault injection plus history checker) on
//! every topology and both servers, a few seconds each with fixed seeds. Each run must report
//! 0 violations, 0 leaked keys and 0 leaked connections. Runs one at a time (2-core machines).
//! On each topology one server kind runs the mutex alone, the other every primitive
//! (`--primitives all`: several keys, the read-write lock, the semaphore).

use std::process::Command;
use std::sync::Mutex;

/// Seconds of nemesis per run.
const SECONDS: &str = "8";

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The numbers of the summary line `chaos: F faults, N critical sections, V violations,
/// L late loss reports, K leaked keys, C leaked connections`.
fn summary(stdout: &str) -> Option<[u64; 6]> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("chaos: ") && l.ends_with("leaked connections"))?;
    let numbers: Vec<u64> = line
        .trim_start_matches("chaos: ")
        .split(", ")
        .map(|part| part.split(' ').next()?.parse().ok())
        .collect::<Option<_>>()?;
    numbers.try_into().ok()
}

fn run(topology: &str, server: &str, seed: u64, extra: &[&str]) {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let output = Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args(["--topology", topology, "--server", server])
        .args(["--seconds", SECONDS, "--seed", &seed.to_string()])
        .args(extra)
        .output()
        .expect("run the chaos binary");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    let Some([faults, sections, violations, _late, keys, connections]) = summary(&stdout) else {
        panic!(
            "{topology}/{server}: no summary line ({}):\n{stdout}\n{stderr}",
            output.status
        );
    };
    assert!(
        faults > 0,
        "{topology}/{server}: no fault was injected:\n{stdout}"
    );
    assert!(
        sections > 0,
        "{topology}/{server}: no critical section ran:\n{stdout}"
    );
    assert_eq!(
        (violations, keys, connections),
        (0, 0, 0),
        "{topology}/{server}: violations or leaks:\n{stdout}\n{stderr}"
    );
    assert!(
        output.status.success(),
        "{topology}/{server}: exit {}:\n{stdout}\n{stderr}",
        output.status
    );
}

#[test]
fn summary_line_parses() {
    let line = "chaos: 15 faults, 316 critical sections, 0 violations, 2 late loss reports, \
                0 leaked keys, 1 leaked connections";
    assert_eq!(summary(line), Some([15, 316, 0, 2, 0, 1]));
    assert_eq!(summary("chaos: nothing"), None);
}

#[test]
fn standalone_redis() {
    run("standalone", "redis", 1, &[]);
}

#[test]
fn standalone_valkey() {
    run("standalone", "valkey", 2, &["--primitives", "all"]);
}

#[test]
fn replicated_redis() {
    run("replicated", "redis", 3, &["--primitives", "all"]);
}

#[test]
fn replicated_valkey() {
    run("replicated", "valkey", 4, &[]);
}

#[test]
fn sentinel_redis() {
    run("sentinel", "redis", 5, &[]);
}

#[test]
fn sentinel_valkey() {
    run("sentinel", "valkey", 6, &["--primitives", "all"]);
}

#[test]
fn cluster_redis() {
    run("cluster", "redis", 7, &["--primitives", "all"]);
}

#[test]
fn cluster_valkey() {
    run("cluster", "valkey", 8, &[]);
}
