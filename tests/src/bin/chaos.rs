//! The seeded fault-injection suite (see `harness::chaos` and the README's "Fault injection").
//!
//! ```text
//! cargo run -p sage-lock-tests --release --bin chaos -- \
//!     --topology standalone|replicated|sentinel|cluster --server redis|valkey --seconds N --seed S \
//!     [--lease-ms MS] [--without FAULT,FAULT..] [--primitives mutex,multi,rwlock,semaphore|all]
//! ```
//!
//! `--primitives` (default `mutex`) picks what the workers lock: the mutex, several mutex keys at
//! once (`multi`), the read-write lock and the semaphore, each call picking one at random.
//!
//! Prints `chaos: F faults, N critical sections, V violations, L late loss reports, K leaked keys,
//! C leaked connections` and exits non-zero on any violation, late loss report or leak. Started
//! with `--worker ...` it is one of the worker processes the coordinator spawns.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use harness::ServerKind;
use harness::chaos::faults::FaultKind;
use harness::chaos::run::{RunArgs, coordinate};
use harness::chaos::worker::{self, WorkerArgs};
use harness::chaos::{Primitive, Topology};

const USAGE: &str = "usage: chaos --topology standalone|replicated|sentinel|cluster \
                     --server redis|valkey --seconds N --seed S [--lease-ms MS] [--without FAULT,FAULT..] \
                     [--primitives mutex,multi,rwlock,semaphore|all]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = if args.first().map(String::as_str) == Some("--worker") {
        run_worker(&args[1..]).map(|()| 0)
    } else {
        run_coordinator(&args)
    };
    match result {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: {e}");
            ExitCode::from(2)
        }
    }
}

/// `--name value` pairs.
fn options(args: &[String]) -> Result<HashMap<String, String>, String> {
    let mut map = HashMap::new();
    let mut iter = args.iter();
    while let Some(name) = iter.next() {
        let Some(name) = name.strip_prefix("--") else {
            return Err(format!("unexpected argument {name:?}; {USAGE}"));
        };
        let value = iter
            .next()
            .ok_or_else(|| format!("--{name} needs a value; {USAGE}"))?;
        map.insert(name.to_owned(), value.clone());
    }
    Ok(map)
}

fn get<'a>(map: &'a HashMap<String, String>, name: &str) -> Result<&'a str, String> {
    map.get(name)
        .map(String::as_str)
        .ok_or_else(|| format!("missing --{name}; {USAGE}"))
}

fn number<T: std::str::FromStr>(map: &HashMap<String, String>, name: &str) -> Result<T, String> {
    let text = get(map, name)?;
    text.parse()
        .map_err(|_| format!("--{name} {text:?} is not a valid number; {USAGE}"))
}

fn run_coordinator(args: &[String]) -> Result<i32, String> {
    let map = options(args)?;
    let known = [
        "topology",
        "server",
        "seconds",
        "seed",
        "lease-ms",
        "without",
        "primitives",
    ];
    if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(format!("unknown option --{unknown}; {USAGE}"));
    }
    let kind = match get(&map, "server")? {
        "redis" => ServerKind::Redis,
        "valkey" => ServerKind::Valkey,
        other => return Err(format!("unknown --server {other:?}: use redis or valkey")),
    };
    let lease_ms: u64 = if map.contains_key("lease-ms") {
        number(&map, "lease-ms")?
    } else {
        600
    };
    if lease_ms < 100 {
        return Err(format!(
            "--lease-ms {lease_ms} is too short: use at least 100"
        ));
    }
    let without = match map.get("without") {
        Some(list) => list
            .split(',')
            .map(|name| FaultKind::parse(name.trim()))
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let primitives = match map.get("primitives") {
        Some(list) => Primitive::parse_list(list)?,
        None => vec![Primitive::Mutex],
    };
    let exe = std::env::current_exe().map_err(|e| format!("finding the chaos executable: {e}"))?;
    coordinate(&RunArgs {
        topology: Topology::parse(get(&map, "topology")?)?,
        kind,
        seconds: number(&map, "seconds")?,
        seed: number(&map, "seed")?,
        lease: Duration::from_millis(lease_ms),
        exe,
        without,
        primitives,
    })
}

fn run_worker(args: &[String]) -> Result<(), String> {
    let map = options(args)?;
    let args = WorkerArgs {
        url: get(&map, "url")?.to_owned(),
        replicated: get(&map, "replicated")? == "1",
        store_port: number(&map, "store-port")?,
        history: PathBuf::from(get(&map, "history")?),
        lease: Duration::from_millis(number(&map, "lease-ms")?),
        seed: number(&map, "seed")?,
        slot: number(&map, "slot")?,
        primitives: Primitive::parse_list(get(&map, "primitives")?)?,
    };
    // `RUST_LOG` (e.g. `sage_lock=debug`), inherited from the coordinator, logs to the worker's
    // stderr file.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("worker runtime: {e}"))?;
    runtime.block_on(worker::run(args))
}
