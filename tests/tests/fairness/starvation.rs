//! No starvation across processes: several `fair_worker` processes contend for one key and
//! each gets its share, with no wait timed out.

use super::*;

/// Four processes of two tasks each contend for one key of `primitive` (a `fair_worker`
/// primitive: `mutex`, `semaphore` with one permit, `write`) for `run` with 1 ms sections: every
/// process gets its share and no wait times out.
async fn no_starvation(kind: ServerKind, primitive: &str, run: Duration) {
    no_starvation_of(kind, [primitive; 4], run, Some(SCRIPTS_PER_SECTION)).await;
}

/// The most script calls (acquire attempts and releases, all processes) per critical section in
/// [`no_starvation`] (and with readers and writers mixed): a release hands the lock over to the
/// next waiter (or the next readers) and wakes only it, not every queued process (about 2: the release, and the attempt with which the new holder's
/// local follower joins the queue).
const SCRIPTS_PER_SECTION: f64 = 3.0;

/// Four processes of two tasks each, process `i` taking the lock as `primitives[i]`, contend for
/// one key for `run` with 1 ms sections: every process gets its share (the fewest sections at
/// least half the most), no wait times out, and the server runs at most `max_scripts` script
/// calls per section. The test has a server of its own, so that the count is its own.
async fn no_starvation_of(
    kind: ServerKind,
    primitives: [&str; 4],
    run: Duration,
    max_scripts: Option<f64>,
) {
    let server = &Server::start(kind);
    let ns = ns(&format!("starve-{}", primitives.join("-")), kind);
    let scripts = || {
        ["evalsha", "eval"]
            .iter()
            .map(|command| harness::commandstats_calls(server.port(), command))
            .sum::<u64>()
    };
    let scripts_before = scripts();
    let reports = contend_processes(&server.url(), &ns, primitives, run).await;
    let sections = assert_shares(&format!("{} {primitives:?}", kind.name()), &reports);
    let scripts_per_section = (scripts() - scripts_before) as f64 / sections.max(1) as f64;
    println!(
        "{} {primitives:?}: {scripts_per_section:.2} script calls per section",
        kind.name()
    );
    if let Some(max) = max_scripts {
        assert!(
            scripts_per_section <= max,
            "{} {primitives:?}: {scripts_per_section:.2} script calls per section (at most \
             {max}): releases wake waiters that cannot take the lock",
            kind.name()
        );
    }
}

/// Runs four `fair_worker contend` processes of two tasks each on key `k` of `ns` at `url`,
/// process `i` taking it as `primitives[i]`, for `run` with 1 ms sections and 5 s waits, all
/// started together; returns their report lines.
async fn contend_processes(
    url: &str,
    ns: &str,
    primitives: [&str; 4],
    run: Duration,
) -> Vec<String> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    let start = (now_ms + 1500).to_string();
    let mut children = Vec::new();
    for primitive in primitives {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fair_worker"))
            .args([
                "contend",
                url,
                ns,
                "k",
                "2",
                &run.as_millis().to_string(),
                "1",
                "5000",
                &start,
                primitive,
            ])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn fair_worker");
        children.push(child);
    }
    let mut reports = Vec::new();
    for mut child in children {
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .await
            .expect("report");
        let status = child.wait().await.expect("worker exits");
        assert!(status.success(), "{url}: worker failed: {line}");
        reports.push(line.trim().to_owned());
    }
    reports
}

/// Asserts that no wait in `reports` timed out and every process got its share (the fewest
/// sections at least half the most); returns the sections of all.
fn assert_shares(label: &str, reports: &[String]) -> u64 {
    let field = |line: &str, name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")[..]))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
    };
    let sections: Vec<u64> = reports.iter().map(|r| field(r, "sections")).collect();
    let timeouts: u64 = reports.iter().map(|r| field(r, "timeouts")).sum();
    let (fewest, most) = (
        sections.iter().copied().min().unwrap_or(0),
        sections.iter().copied().max().unwrap_or(0),
    );
    println!("{label}: 4 processes x 2 tasks: {reports:#?}");
    assert_eq!(timeouts, 0, "{label}: waits timed out: {reports:?}");
    assert!(
        fewest * 2 >= most && fewest > 0,
        "{label}: a process starved: {sections:?}"
    );
    sections.iter().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_starvation_across_processes_redis() {
    no_starvation(ServerKind::Redis, "mutex", Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_starvation_across_processes_valkey() {
    no_starvation(ServerKind::Valkey, "mutex", Duration::from_secs(30)).await;
}

/// The semaphore's waiters queue too: with one permit it is as fair as the mutex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_semaphore_starvation_across_processes() {
    for kind in ServerKind::ALL {
        no_starvation(kind, "semaphore", Duration::from_secs(10)).await;
    }
}

/// A caller of several keys (`with_locks` on `k` and a second key, one process of two tasks)
/// against three processes of single-key waiters on `k`: it queues on every key's waiter queue
/// too, so it gets its share and no wait times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_several_keys_starvation_across_processes() {
    for kind in ServerKind::ALL {
        no_starvation_of(
            kind,
            ["pair", "mutex", "mutex", "mutex"],
            Duration::from_secs(10),
            Some(SCRIPTS_PER_SECTION),
        )
        .await;
    }
}

/// In a cluster, a caller of keys in two slots waits in line for each in turn, holding the
/// first while it waits for the second: single-key waiters on its later slot's key cannot keep
/// it out. (The namespace is picked so that `k`, which the other processes contend for, is the
/// later slot.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_several_slots_starvation_in_a_cluster() {
    for kind in ServerKind::ALL {
        let cluster = harness::shared_cluster(kind);
        let ns = loop {
            let ns = ns("starve-slots", kind);
            let slot = |key: &str| harness::key_slot(format!("{{{ns}:{key}}}").as_bytes());
            if slot("k:pair") < slot("k") {
                break ns;
            }
        };
        let reports = contend_processes(
            &cluster.url(),
            &ns,
            ["pair", "mutex", "mutex", "mutex"],
            Duration::from_secs(10),
        )
        .await;
        assert_shares(&format!("{} cluster", kind.name()), &reports);
    }
}

/// The read-write lock's waiting writers queue too: four processes of two writers each get
/// their share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_writer_starvation_across_processes() {
    for kind in ServerKind::ALL {
        no_starvation(kind, "write", Duration::from_secs(10)).await;
    }
}

/// Readers are not starved by a stream of writers: one process of two readers against three
/// processes of two writers each gets its share, and no wait times out. Releases hand the lock to
/// the readers as to the writers, so the script calls per section stay within
/// [`SCRIPTS_PER_SECTION`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reader_starvation_across_processes() {
    for kind in ServerKind::ALL {
        no_starvation_of(
            kind,
            ["read", "write", "write", "write"],
            Duration::from_secs(10),
            Some(SCRIPTS_PER_SECTION),
        )
        .await;
    }
}
