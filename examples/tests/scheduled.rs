//! The `scheduled` example as three OS processes on Redis and Valkey: a job scheduled every
//! second on every instance runs exactly once per tick (try_lock + hold_at_least).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use sage_lock_examples::{ServerKind, ThrowawayServer};

const INSTANCES: usize = 3;
const TICKS: u64 = 5;
const INTERVAL_MS: u64 = 1_000;

fn now_ms() -> u64 {
    let elapsed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    u64::try_from(elapsed.as_millis()).expect("ms fit u64")
}

#[test]
fn three_instances_run_once_per_tick() {
    for kind in [ServerKind::Redis, ServerKind::Valkey] {
        let server = ThrowawayServer::start_kind(kind).expect("start a server");
        // Tick 0 two seconds from now: time for the processes to start and connect.
        let start_ms = now_ms() + 2_000;
        let namespace = format!("scheduled-test-{start_ms}");
        let children: Vec<_> = (0..INSTANCES)
            .map(|instance| {
                Command::new(env!("CARGO_BIN_EXE_scheduled"))
                    .args(["--instance", &instance.to_string(), "--url", server.url()])
                    .args(["--namespace", &namespace])
                    .args(["--start-ms", &start_ms.to_string()])
                    .args(["--interval-ms", &INTERVAL_MS.to_string()])
                    .args(["--ticks", &TICKS.to_string()])
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("start an instance")
            })
            .collect();
        let mut ran: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        let mut skipped: BTreeMap<u64, usize> = BTreeMap::new();
        for child in children {
            let output = child.wait_with_output().expect("instance output");
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            assert!(output.status.success(), "{kind}: instance failed: {stdout}");
            for line in stdout.lines() {
                let words: Vec<&str> = line.split_whitespace().collect();
                match words.as_slice() {
                    ["tick", tick, "ran", "instance", instance, ..] => ran
                        .entry(tick.parse().expect("tick"))
                        .or_default()
                        .push((*instance).to_owned()),
                    ["tick", tick, "skipped", ..] => {
                        *skipped.entry(tick.parse().expect("tick")).or_default() += 1;
                    }
                    _ => panic!("{kind}: unexpected line {line:?}"),
                }
            }
        }
        for tick in 0..TICKS {
            let runs = ran.get(&tick).map_or(0, Vec::len);
            assert_eq!(runs, 1, "{kind}: tick {tick} ran on {:?}", ran.get(&tick));
            assert_eq!(
                skipped.get(&tick).copied().unwrap_or(0),
                INSTANCES - 1,
                "{kind}: tick {tick}: every other instance tried and skipped"
            );
        }
    }
}

/// An interval or minimum hold out of range is refused once, by the parent, before any server or
/// instance starts (before, each of the three instances printed the library's error).
#[test]
fn out_of_range_durations_are_refused_once() {
    for (flag, value) in [
        ("--interval-ms", "18446744073709551615"),
        ("--hold-ms", "18446744073709551615"),
        ("--interval-ms", "100"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_scheduled"))
            .args([flag, value])
            .output()
            .expect("run scheduled");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value}: {stderr}");
        assert_eq!(
            stderr.matches("error:").count(),
            1,
            "{flag} {value}: {stderr}"
        );
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
        assert!(out.stdout.is_empty(), "{flag} {value}: started anyway");
    }
}
