//! Proves the harness works, for both Redis and Valkey: every topology comes up, answers raw RESP
//! and fred's URLs, and server processes die when asked to and when the test process dies.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::{Builder, ClientLike, Config, KeysInterface};
use harness::{
    Cluster, Reply, SentinelSetup, Server, ServerKind, cmd, cmd_timeout, commandstats_calls,
    info_field, key_slot, shared, shared_cluster, shared_replicated, wait_until,
};

/// Whether `pid` is a live process. A zombie counts as gone: an orphaned server killed by its
/// watchdog is reaped by pid 1, which can take seconds in a container.
fn process_exists(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// SET then GET through fred, connected with `url`; proves fred 10.1 accepts the URL format.
fn fred_roundtrip(url: &str, keys: &[&str]) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let config = Config::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        let client = Builder::from_config(config)
            .build()
            .expect("fred client builds");
        tokio::time::timeout(Duration::from_secs(10), client.init())
            .await
            .unwrap_or_else(|_| panic!("fred init timed out for {url}"))
            .unwrap_or_else(|e| panic!("fred init for {url}: {e}"));
        for key in keys {
            let _: () = client
                .set(*key, "v", None, None, false)
                .await
                .unwrap_or_else(|e| panic!("SET {key} via {url}: {e}"));
            let got: Option<String> = client
                .get(*key)
                .await
                .unwrap_or_else(|e| panic!("GET {key} via {url}: {e}"));
            assert_eq!(got.as_deref(), Some("v"), "GET {key} via {url}");
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), client.quit()).await;
    });
}

/// Runs `check` for Redis and Valkey concurrently (topology startup is mostly waiting).
fn for_both_kinds(check: impl Fn(ServerKind) + Sync) {
    let check = &check;
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ServerKind::ALL
            .into_iter()
            .map(|kind| s.spawn(move || check(kind)))
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    for result in results {
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
    }
}

#[test]
fn standalone_answers_ping_and_admin_commands() {
    for kind in ServerKind::ALL {
        let server = shared(kind);
        assert_eq!(
            cmd(server.port(), &["PING"]),
            Ok(Reply::Simple("PONG".into()))
        );
        assert!(server.url().starts_with("redis://127.0.0.1:"));
        // No persistence, DEBUG allowed.
        let save = server.cmd_ok(&["CONFIG", "GET", "save"]).to_pairs();
        assert_eq!(save, vec![("save".to_owned(), String::new())], "{kind}");
        assert!(server.cmd_ok(&["DEBUG", "SLEEP", "0"]).is_ok(), "{kind}");
        let before = commandstats_calls(server.port(), "ping");
        cmd(server.port(), &["PING"]).expect("PING");
        assert!(commandstats_calls(server.port(), "ping") > before, "{kind}");
        let version_field = match kind {
            ServerKind::Redis => "redis_version",
            ServerKind::Valkey => "valkey_version",
        };
        assert!(
            info_field(server.port(), "server", version_field).is_some(),
            "{kind}: no {version_field}"
        );
        fred_roundtrip(&server.url(), &[&format!("smoke:{kind}:standalone")]);
    }
}

#[test]
fn replicated_has_two_online_replicas() {
    for kind in ServerKind::ALL {
        let setup = shared_replicated(kind);
        let port = setup.primary.port();
        assert_eq!(
            info_field(port, "replication", "connected_slaves").as_deref(),
            Some("2"),
            "{kind}"
        );
        for replica in &setup.replicas {
            assert_eq!(
                replica.info_field("replication", "role").as_deref(),
                Some("slave")
            );
        }
        // A write reaches both replicas (WAIT on the connection that wrote it).
        let mut conn = harness::RawConn::connect(port).expect("connect");
        let key = format!("smoke:{kind}:replicated");
        assert!(conn.cmd(&["SET", &key, "1"]).expect("SET").is_ok());
        assert_eq!(
            conn.cmd(&["WAIT", "2", "2000"]).expect("WAIT").as_int(),
            Some(2)
        );
        for replica in &setup.replicas {
            assert_eq!(replica.cmd_ok(&["GET", &key]).as_str(), Some("1"), "{kind}");
        }
    }
}

#[test]
fn sentinel_reports_the_primary() {
    for_both_kinds(|kind| {
        let started = Instant::now();
        let setup = SentinelSetup::start(kind);
        eprintln!("{kind} sentinel setup started in {:?}", started.elapsed());
        assert_eq!(setup.current_primary_port(), setup.data.primary.port());
        assert_eq!(setup.sentinels.len(), 3);
        let ckquorum = cmd(
            setup.sentinels[0].port(),
            &["SENTINEL", "CKQUORUM", "mymaster"],
        )
        .expect("CKQUORUM");
        assert!(
            ckquorum.as_str().is_some_and(|s| s.starts_with("OK")),
            "{kind}: {ckquorum}"
        );
        fred_roundtrip(&setup.url(), &[&format!("smoke:{kind}:sentinel")]);
    });
}

#[test]
fn cluster_is_ok_with_three_primaries() {
    for_both_kinds(|kind| {
        let started = Instant::now();
        let cluster = shared_cluster(kind);
        eprintln!("{kind} cluster ready after {:?}", started.elapsed());
        for node in &cluster.nodes {
            let info = node
                .cmd_ok(&["CLUSTER", "INFO"])
                .to_text()
                .unwrap_or_default();
            assert!(info.contains("cluster_state:ok"), "{kind}: {info}");
        }
        let topology = cluster.topology().expect("CLUSTER NODES");
        assert_eq!(topology.iter().filter(|n| n.is_primary()).count(), 3);
        assert_eq!(topology.iter().filter(|n| n.has_flag("slave")).count(), 3);
        for (i, range_start) in [0u16, 5461, 10923].into_iter().enumerate() {
            assert_eq!(
                cluster.primary_for_slot(range_start).port(),
                cluster.nodes[i].port()
            );
            assert_eq!(
                cluster.replica_of(cluster.nodes[i].port()).port(),
                cluster.nodes[3 + i].port()
            );
        }
        // Keys on all three shards, through fred's cluster URL.
        let keys: Vec<String> = (0..12)
            .map(|i| format!("smoke:{kind}:cluster:{i}"))
            .collect();
        let shards: std::collections::BTreeSet<u16> = keys
            .iter()
            .map(|k| cluster.primary_for_key(k).port())
            .collect();
        assert_eq!(shards.len(), 3, "test keys should span all shards");
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        fred_roundtrip(&cluster.url(), &key_refs);
        for key in &keys {
            let owner = cluster.primary_for_key(key);
            assert_eq!(owner.cmd_ok(&["GET", key]).as_str(), Some("v"), "{key}");
        }
    });
}

#[test]
fn key_slot_matches_the_server() {
    let server = &shared_cluster(ServerKind::Valkey).nodes[0];
    for key in [
        "",
        "foo",
        "{user1000}.following",
        "a{}b",
        "{}{x}",
        "x{y}z{w}",
    ] {
        let reply = server.cmd_ok(&["CLUSTER", "KEYSLOT", key]);
        match reply.as_int() {
            Some(slot) => assert_eq!(i64::from(key_slot(key.as_bytes())), slot, "{key}"),
            None => panic!("CLUSTER KEYSLOT {key}: {reply}"),
        }
    }
}

#[test]
fn kill_pause_resume_restart() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let port = server.port();
        let pid = server.pid().expect("running");
        assert!(process_exists(pid));

        server.pause();
        let paused = cmd_timeout(port, &["PING"], Duration::from_millis(200));
        assert!(paused.is_err(), "{kind}: paused server answered {paused:?}");
        server.resume();
        assert_eq!(
            cmd(port, &["PING"]),
            Ok(Reply::Simple("PONG".into())),
            "{kind}"
        );

        server.kill();
        assert!(!server.is_running());
        assert!(!process_exists(pid), "{kind}: pid {pid} survived kill()");
        assert!(cmd(port, &["PING"]).is_err(), "{kind}: port still answers");

        server.restart();
        assert_eq!(server.port(), port);
        assert_ne!(server.pid(), Some(pid));
        assert_eq!(
            cmd(port, &["PING"]),
            Ok(Reply::Simple("PONG".into())),
            "{kind}"
        );
        let new_pid = server.pid().expect("running");
        let dir = server.dir().to_path_buf();
        drop(server);
        assert!(!process_exists(new_pid), "{kind}: drop left pid {new_pid}");
        assert!(!dir.exists(), "{kind}: drop left {}", dir.display());
    }
}

#[test]
fn servers_die_with_the_test_process() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_watchdog_helper"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn helper");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    let mut reader = BufReader::new(stdout);
    let mut fields = None;
    while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
        if let Some(rest) = line.trim().strip_prefix("HELPER ") {
            fields = Some(rest.to_owned());
            break;
        }
        line.clear();
    }
    let fields = fields.expect("helper printed its server");
    let get = |name: &str| {
        fields
            .split(' ')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {name} in {fields:?}"))
            .to_owned()
    };
    let pid: u32 = get("pid").parse().expect("pid");
    let port: u16 = get("port").parse().expect("port");
    let dir = std::path::PathBuf::from(get("dir"));
    assert!(process_exists(pid));
    assert!(cmd(port, &["PING"]).is_ok());

    child.kill().expect("SIGKILL the helper");
    child.wait().expect("reap the helper");
    wait_until(Duration::from_secs(5), || {
        if process_exists(pid) {
            Err(format!("server pid {pid} still alive"))
        } else if dir.exists() {
            Err(format!("{} still exists", dir.display()))
        } else {
            Ok(())
        }
    })
    .unwrap_or_else(|e| panic!("watchdog did not clean up: {e}"));
}

#[test]
fn sentinel_and_cluster_fail_over() {
    std::thread::scope(|s| {
        let sentinel = s.spawn(|| {
            for_both_kinds(|kind| {
                let setup = SentinelSetup::start(kind);
                let old = setup.data.primary.port();
                let started = Instant::now();
                setup.data.primary.kill();
                let new = setup
                    .wait_for_failover(old, Duration::from_secs(20))
                    .unwrap_or_else(|e| panic!("{kind}: no sentinel failover: {e}"));
                eprintln!("{kind} sentinel failover took {:?}", started.elapsed());
                assert_eq!(setup.current_primary().port(), new);
                assert_eq!(
                    info_field(new, "replication", "connected_slaves").as_deref(),
                    Some("1"),
                    "{kind}: the other replica follows the new primary"
                );
            });
        });
        let cluster = s.spawn(|| {
            for_both_kinds(|kind| {
                let cluster = Cluster::start(kind);
                let (primary, replica) = (&cluster.nodes[0], &cluster.nodes[3]);
                let started = Instant::now();
                primary.kill();
                let new = cluster
                    .wait_for_failover(primary.port(), Duration::from_secs(20))
                    .unwrap_or_else(|e| panic!("{kind}: cluster did not fail over: {e}"));
                eprintln!("{kind} cluster failover took {:?}", started.elapsed());
                assert_eq!(new, replica.port());
                assert_eq!(cluster.primary_for_slot(0).port(), replica.port());
                // The old primary comes back (same node id) as a replica of its replica.
                primary.restart();
                wait_until(Duration::from_secs(20), || {
                    let role = primary.info_field("replication", "role");
                    let link = primary.info_field("replication", "master_link_status");
                    match (role.as_deref(), link.as_deref()) {
                        (Some("slave"), Some("up")) => Ok(()),
                        other => Err(format!("restarted primary: {other:?}")),
                    }
                })
                .unwrap_or_else(|e| panic!("{kind}: {e}"));
                assert_eq!(cluster.replica_of(replica.port()).port(), primary.port());
            });
        });
        for handle in [sentinel, cluster] {
            if let Err(panic) = handle.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
}
