//! The coordinator: deploy, spawn workers, run the nemesis, let things settle, stop the workers,
//! measure leaks, check, print the summary line.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::checker::{self, ProcessHistory};
use super::deploy::Deployment;
use super::faults::{self, FaultKind};
use super::fleet::{Fleet, Spawn};
use super::nemesis::Nemesis;
use super::{Primitive, Topology, history, locked_keys, store, store_keys};
use crate::ServerKind;

/// Worker processes per run.
pub const WORKERS: u32 = 4;
/// RSS growth of one worker between the first and the last sample that counts as a leak.
const RSS_GROWTH_KIB: u64 = 32 * 1024;

/// Options of a coordinator run.
#[derive(Clone, Debug)]
pub struct RunArgs {
    pub topology: Topology,
    pub kind: ServerKind,
    pub seconds: u64,
    pub seed: u64,
    pub lease: Duration,
    /// The `chaos` executable (re-executed as workers).
    pub exe: PathBuf,
    /// Fault kinds left out of the schedule.
    pub without: Vec<FaultKind>,
    /// The primitives the workers exercise.
    pub primitives: Vec<Primitive>,
}

/// Runs the whole suite; returns the process exit code.
pub fn coordinate(args: &RunArgs) -> Result<i32, String> {
    let dir = std::env::temp_dir().join("sage-lock-chaos").join(format!(
        "{}-{}-seed{}-{}",
        args.topology.name(),
        args.kind.name(),
        args.seed,
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let deploy = Deployment::start(args.topology, args.kind)?;
    let (url, replicated) = deploy.client_url();
    let baseline_by_port = deploy.worker_connections()?;
    let baseline: i64 = baseline_by_port.values().sum();
    let fleet = Fleet::start(
        Spawn {
            exe: args.exe.clone(),
            dir: dir.clone(),
            url,
            replicated,
            store_port: deploy.store.port(),
            lease: args.lease,
            seed: args.seed,
            primitives: args.primitives.clone(),
        },
        WORKERS,
    )?;
    let fleet = Mutex::new(fleet);
    std::thread::sleep(Duration::from_millis(1000));
    let rss_first = lock(&fleet).rss();

    let plan = faults::plan(
        args.topology,
        args.seed,
        args.seconds,
        args.lease,
        &args.without,
    );
    let started = Instant::now();
    let until = started + Duration::from_secs(args.seconds);
    let records =
        Nemesis::new(&deploy, &fleet, until, locked_keys(&args.primitives)).run(&plan, started);
    let nemesis_end = super::clock::now_ns();
    write_faults(&dir, &records, nemesis_end);
    // Quiet period: the deployment heals, the workers carry on without faults.
    deploy.wait_healthy(Duration::from_secs(30))?;
    let _ = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("faults.log"))
        .and_then(|mut f| {
            use std::io::Write as _;
            let now = super::clock::now_ns();
            writeln!(f, "{now} {now} healthy")
        });
    std::thread::sleep((args.lease * 4).max(Duration::from_secs(2)));
    let rss_last = lock(&fleet).rss();

    let silent = lock(&fleet).stop_all(Duration::from_secs(30));
    // Every client has quit: the servers must be back to the connections they had before.
    let leaked_connections = settle(Duration::from_secs(5), || {
        deploy
            .worker_connections()
            .map(|n| (n.values().sum::<i64>() - baseline).max(0))
    })?;
    if leaked_connections > 0 {
        describe_connections(&deploy, &baseline_by_port, &dir);
    }
    lock(&fleet).exit_all(Duration::from_secs(10));
    // Locks of killed workers expire within a lease; a queue that still lists a killed
    // waiter's place expires `QUEUE_TTL` (4 s) after the last attempt that refreshed it.
    let leaked_keys = settle(args.lease.max(QUEUE_TTL) + Duration::from_secs(2), || {
        deploy.lock_keys().map(|k| k.len() as i64)
    })?;
    let leaked_key_names = deploy.lock_keys()?;

    let fleet = fleet
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut histories = Vec::new();
    let mut violations = Vec::new();
    for name in &silent {
        violations.push(format!("{name} did not stop within 30 s"));
    }
    for done in &fleet.finished {
        histories.push(ProcessHistory {
            name: done.name.clone(),
            records: history::read(&done.history)?,
            killed_at: done.killed_at,
        });
        let stderr = std::fs::read_to_string(&done.stderr).unwrap_or_default();
        if stderr.contains("panicked") {
            violations.push(format!("{} panicked: {}", done.name, stderr.trim()));
        }
        if done.killed_at.is_none() && !done.status.is_some_and(|s| s.success()) {
            violations.push(format!(
                "{} exited with {:?}: {}",
                done.name,
                done.status,
                stderr.trim()
            ));
        }
    }
    for (name, first) in &rss_first {
        if let Some(last) = rss_last.get(name)
            && *last > first + RSS_GROWTH_KIB
        {
            violations.push(format!("{name}: RSS grew from {first} KiB to {last} KiB"));
        }
    }
    let mut store_state = HashMap::new();
    for key in store_keys() {
        store_state.insert(key.to_owned(), store::snapshot(deploy.store.port(), key)?);
    }
    let mut report = checker::check(&histories, &records, &store_state, args.lease);
    violations.append(&mut report.violations);

    let applied: Vec<_> = records.iter().filter(|r| r.skipped.is_none()).collect();
    let mut by_kind: HashMap<FaultKind, usize> = HashMap::new();
    for r in &applied {
        *by_kind.entry(r.kind).or_default() += 1;
    }
    let mut kinds: Vec<_> = by_kind.into_iter().collect();
    kinds.sort();
    let kinds: Vec<String> = kinds
        .iter()
        .map(|(k, n)| format!("{} {n}", k.name()))
        .collect();
    println!(
        "chaos: {} {} for {} s, seed {}, lease {} ms, {WORKERS} workers x {} tasks, primitives {}",
        args.topology.name(),
        args.kind.name(),
        args.seconds,
        args.seed,
        args.lease.as_millis(),
        super::TASKS_PER_WORKER,
        Primitive::list_text(&args.primitives)
    );
    println!("chaos: faults: {}", kinds.join(", "));
    for (what, n) in &report.counts {
        println!("chaos:   {what}: {n}");
    }
    for v in &violations {
        println!("chaos: VIOLATION: {v}");
    }
    for late in &report.late_losses {
        println!("chaos: LATE: {late}");
    }
    if !leaked_key_names.is_empty() {
        println!("chaos: leaked lock keys: {leaked_key_names:?}");
    }
    println!(
        "chaos: {} faults, {} critical sections, {} violations, {} late loss reports, {} leaked keys, {} leaked connections",
        applied.len(),
        report.sections,
        violations.len(),
        report.late_losses.len(),
        leaked_keys,
        leaked_connections
    );
    let failed = !violations.is_empty() || leaked_keys > 0 || leaked_connections > 0;
    // `SAGE_LOCK_CHAOS_KEEP=1` keeps the histories of a passing run too (to study one).
    let keep = std::env::var_os("SAGE_LOCK_CHAOS_KEEP").is_some_and(|v| v == "1");
    if failed || keep || !report.late_losses.is_empty() {
        deploy.copy_logs(&dir);
        println!(
            "chaos: replay with --seed {} --primitives {}; histories in {}",
            args.seed,
            Primitive::list_text(&args.primitives),
            dir.display()
        );
    }
    if failed {
        Ok(1)
    } else {
        if report.late_losses.is_empty() && !keep {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(0)
    }
}

/// Writes `faults.log`: one line per fault, `<start ns> <end ns> <kind> <target> [skipped: why]`.
fn write_faults(dir: &std::path::Path, records: &[super::faults::FaultRecord], nemesis_end: u64) {
    let mut text = String::new();
    for r in records {
        text.push_str(&format!(
            "{} {} {} {}{}\n",
            r.start,
            r.end,
            r.kind.name(),
            r.target,
            r.skipped
                .as_ref()
                .map(|why| format!(" [skipped: {why}]"))
                .unwrap_or_default()
        ));
    }
    text.push_str(&format!("{nemesis_end} {nemesis_end} nemesis-end\n"));
    let _ = std::fs::write(dir.join("faults.log"), text);
}

/// Prints which servers have more connections than before the workers started, and writes their
/// `CLIENT LIST` to `clients.txt`.
fn describe_connections(deploy: &Deployment, baseline: &HashMap<u16, i64>, dir: &std::path::Path) {
    let Ok(now) = deploy.worker_connections() else {
        return;
    };
    let mut text = String::new();
    for (port, count) in &now {
        let before = baseline.get(port).copied().unwrap_or(0);
        if *count > before {
            println!("chaos: port {port}: {count} worker connections, {before} before the workers");
            if let Ok(list) = crate::cmd(*port, &["CLIENT", "LIST"]) {
                text.push_str(&format!("== {port}\n{}\n", list.to_plain()));
            }
        }
    }
    let _ = std::fs::write(dir.join("clients.txt"), text);
    // Which process owns each connection (the workers' pids are in their histories' `start`).
    if let Ok(sockets) = std::process::Command::new("ss").args(["-tnp"]).output() {
        let _ = std::fs::write(dir.join("sockets.txt"), sockets.stdout);
    }
}

fn lock(fleet: &Mutex<Fleet>) -> std::sync::MutexGuard<'_, Fleet> {
    fleet
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Polls `measure` until it reports 0 or `timeout` passes; returns the last value.
/// How long a lock's server-side queue lasts after the last attempt that refreshed it (the
/// library's `engine::QUEUE_TTL`; see the README's "Fair waiting").
const QUEUE_TTL: Duration = Duration::from_secs(4);

fn settle(
    timeout: Duration,
    mut measure: impl FnMut() -> Result<i64, String>,
) -> Result<i64, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let value = measure()?;
        if value == 0 || Instant::now() >= deadline {
            return Ok(value);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
