//! Caller-configured fred clients handed to [`LockClient::from_fred`] (or the builder's
//! `fred_client`). RESP3: the behaviour suites on a standalone server and their part where
//! replies differ on replicated, Sentinel and cluster deployments; every connection speaking
//! RESP3; hand-off notifications. The caller's other settings (a non-zero database, the
//! blocking policy, flushing and broadcast capacity) are kept and work; those locks rely on
//! (timeouts, reconnect policy, `fail_fast`, connection names, retries) are overridden as
//! [`LockClient::from_fred`] documents.

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::Target;
use harness::{Server, ServerKind};
use sage_lock::fred::clients::Client;
use sage_lock::fred::interfaces::ClientLike as _;
use sage_lock::fred::types::RespVersion;
use sage_lock::fred::types::config::{
    Blocking, Config, ConnectionConfig, PerformanceConfig, ReconnectPolicy,
};
use sage_lock::{LockClient, LockOptions, Locks, current_lease};

fn standalone_resp3(kind: ServerKind) -> Target {
    Target::standalone(kind).resp3()
}

fn replicated_resp3(kind: ServerKind) -> Target {
    Target {
        kind,
        url: harness::shared_replicated(kind).primary_url(),
        replicated: true,
        label: "replicated",
        resp3: false,
    }
    .resp3()
}

fn cluster_resp3(kind: ServerKind) -> Target {
    Target {
        kind,
        url: harness::shared_cluster(kind).url(),
        replicated: false,
        label: "cluster",
        resp3: false,
    }
    .resp3()
}

mod standalone_resp3 {
    use crate::common;
    common::behaviour_suite!(super::standalone_resp3);
    common::primitives::primitive_suite!(super::standalone_resp3);
}

/// The suites' promises where `WAIT` and `ROLE` replies matter (the rest, the same scripts'
/// replies as on a standalone server, is left to the standalone run above).
mod replicated_resp3 {
    use crate::common;
    common::behaviour_tests!(
        super::replicated_resp3;
        mutual_exclusion,
        timed_out_is_bounded,
        renewal_keeps_short_lease,
        loss_when_key_deleted,
        cancellation_releases,
        fencing_tokens_increase,
        outlives_the_runtime_that_connected_it,
    );
    common::primitives::primitive_tests!(
        super::replicated_resp3;
        primitives_renew_short_leases,
        primitives_release_on_cancellation,
        semaphore_bounds_holders,
        rw_readers_share_writers_exclude,
        multi_gives_every_keys_fencing_token,
    );
}

/// A part of the suites on a cluster (its whole suites take as long again as the two above).
mod cluster_resp3 {
    use crate::common;
    common::behaviour_tests!(
        super::cluster_resp3;
        mutual_exclusion,
        renewal_keeps_short_lease,
        fencing_tokens_increase,
        outlives_the_runtime_that_connected_it,
    );
    common::primitives::primitive_tests!(
        super::cluster_resp3;
        semaphore_bounds_holders,
        rw_readers_share_writers_exclude,
        multi_gives_every_keys_fencing_token,
    );
}

fn sentinel_resp3(kind: ServerKind) -> Target {
    Target {
        kind,
        url: harness::shared_sentinel(kind).url(),
        replicated: false,
        label: "sentinel",
        resp3: false,
    }
    .resp3()
}

/// Through Sentinel (which lists the replicas as RESP3 maps): the basics.
mod sentinel_resp3 {
    use crate::common;
    common::behaviour_tests!(
        super::sentinel_resp3;
        mutual_exclusion,
        renewal_keeps_short_lease,
    );
}

/// A caller's fred client for `url`, configured by `configure` (which may set the reconnect
/// policy), not connected.
fn caller_client(
    url: &str,
    configure: impl FnOnce(
        &mut Config,
        &mut PerformanceConfig,
        &mut ConnectionConfig,
        &mut Option<ReconnectPolicy>,
    ),
) -> Client {
    let mut config = Config::from_url(url).expect("a valid URL");
    let (mut perf, mut connection, mut policy) = (
        PerformanceConfig::default(),
        ConnectionConfig::default(),
        None,
    );
    configure(&mut config, &mut perf, &mut connection, &mut policy);
    Client::new(config, Some(perf), Some(connection), policy)
}

fn resp3(config: &mut Config) {
    config.version = RespVersion::RESP3;
}

/// `waiter` waits for `key` behind `holder` (another client: another process, as far as the
/// locks can tell), whose body ends 100 ms in. Returns how long after that release the waiter's
/// body started: a waiter left to its poll starts ~400 ms after it, one woken by the release
/// notification within milliseconds.
async fn handoff_gap<H, W, HF, WF>(hold: H, wait: W) -> Duration
where
    H: FnOnce(tokio::sync::oneshot::Sender<()>) -> HF,
    HF: Future<Output = Instant> + Send + 'static,
    W: FnOnce() -> WF,
    WF: Future<Output = Instant>,
{
    let (held, is_held) = tokio::sync::oneshot::channel();
    let holding = tokio::spawn(hold(held));
    is_held.await.expect("the holder took the lock");
    let entered = wait().await;
    let released = holding.await.expect("the holder's task");
    entered.saturating_duration_since(released)
}

/// Below this, a waiter was woken by its notification (its poll would take ~400 ms).
const NOTIFIED: Duration = Duration::from_millis(250);

/// Every primitive, with two lock clients made from `make` (each from a fresh caller's client):
/// a mutex, semaphore and read-write lock each hand over to a waiter of the other client, which
/// its release notification wakes; a 400 ms lease is renewed through a 1 s body; `holder` names
/// the hold's fencing token. `name` labels the failures.
async fn every_primitive(name: &str, make: &dyn Fn() -> LockClient) {
    let (a, b) = (make(), make());
    let ns = format!("fred-config-{}", rand::random::<u32>());
    let options = || {
        LockOptions::new()
            .namespace(ns.as_str())
            .lease(Duration::from_secs(5))
    };
    let (mutex_a, mutex_b): (Locks<str>, Locks<str>) = (
        a.lock_with(options()).expect("opts"),
        b.lock_with(options()).expect("opts"),
    );
    // Renewed meanwhile, on a key of its own: a 400 ms lease through a 1 s body.
    let short: Locks<str> = a
        .lock_with(
            LockOptions::new()
                .namespace(ns.as_str())
                .lease(Duration::from_millis(400)),
        )
        .expect("opts");
    let renewing = tokio::spawn(async move {
        short
            .with_lock("renewed", Duration::from_secs(2), async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                current_lease().expect("a lease").is_valid()
            })
            .await
    });
    for round in 0..2 {
        let holder = mutex_a.clone();
        let fences = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = fences.clone();
        let gap = handoff_gap(
            move |held| async move {
                holder
                    .with_lock("m", Duration::from_secs(5), async {
                        let lease = current_lease().expect("a lease");
                        let info = holder.holder("m").await.expect("holder");
                        assert_eq!(
                            info.map(|i| i.fencing_token),
                            Some(lease.fencing_token()),
                            "holder() names the hold's fencing token"
                        );
                        seen.lock().expect("fences").push(lease.fencing_token());
                        let _ = held.send(());
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Instant::now()
                    })
                    .await
                    .expect("the mutex holder")
            },
            || async {
                mutex_b
                    .with_lock("m", Duration::from_secs(5), async {
                        fences
                            .lock()
                            .expect("fences")
                            .push(current_lease().expect("a lease").fencing_token());
                        Instant::now()
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{name}: the mutex waiter: {e}"))
            },
        )
        .await;
        println!("{name}: mutex round {round}: hand-off {gap:?}");
        assert!(
            gap < NOTIFIED,
            "{name}: mutex round {round}: hand-off {gap:?}"
        );
        let fences = fences.lock().expect("fences").clone();
        assert_eq!(fences.len(), 2, "{name}");
        // The next fencing token: the hand-off's, or (a replica-acknowledged waiter confirms
        // the hand-off with a repeated grant, which takes a token of its own) the one after it.
        assert!(
            fences[1] == fences[0] + 1 || fences[1] == fences[0] + 2,
            "{name}: fencing tokens {fences:?}"
        );
    }

    let (sem_a, sem_b) = (
        a.semaphore_with::<str>(1, options()).expect("opts"),
        b.semaphore_with::<str>(1, options()).expect("opts"),
    );
    let gap = handoff_gap(
        move |held| async move {
            sem_a
                .acquire("s", Duration::from_secs(5), async {
                    let _ = held.send(());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Instant::now()
                })
                .await
                .expect("the permit holder")
        },
        || async {
            sem_b
                .acquire("s", Duration::from_secs(5), async { Instant::now() })
                .await
                .unwrap_or_else(|e| panic!("{name}: the permit waiter: {e}"))
        },
    )
    .await;
    println!("{name}: semaphore hand-off {gap:?}");
    assert!(gap < NOTIFIED, "{name}: semaphore hand-off {gap:?}");

    let (rw_a, rw_b) = (
        a.rw_lock_with::<str>(options()).expect("opts"),
        b.rw_lock_with::<str>(options()).expect("opts"),
    );
    let gap = handoff_gap(
        move |held| async move {
            rw_a.write("r", Duration::from_secs(5), async {
                let _ = held.send(());
                tokio::time::sleep(Duration::from_millis(100)).await;
                Instant::now()
            })
            .await
            .expect("the writer")
        },
        || async {
            rw_b.read("r", Duration::from_secs(5), async { Instant::now() })
                .await
                .unwrap_or_else(|e| panic!("{name}: the reader: {e}"))
        },
    )
    .await;
    println!("{name}: write-to-read hand-off {gap:?}");
    assert!(gap < NOTIFIED, "{name}: write-to-read hand-off {gap:?}");

    let renewed = renewing.await.expect("the renewal task");
    assert!(
        matches!(renewed, Ok(true)),
        "{name}: a 400 ms lease through a 1 s body: {renewed:?}"
    );
    a.quit().await;
    b.quit().await;
}

/// [`every_primitive`], then every connection is killed (`CLIENT KILL`, data and subscriber
/// connections alike) and it runs again: the lock clients reconnect and subscribe again.
async fn every_primitive_and_reconnects(
    server: &Server,
    name: &str,
    make: &dyn Fn() -> LockClient,
) {
    every_primitive(name, make).await;
    let (a, b) = (make(), make());
    let locks: Locks<str> = a
        .lock_with(LockOptions::new().namespace(format!("kill-{}", rand::random::<u32>())))
        .expect("opts");
    let waiter: Locks<str> = b
        .lock_with(LockOptions::new().namespace(locks.namespace()))
        .expect("opts");
    harness::wait_behind(&waiter, locks.clone(), "k").await;
    for kind in ["normal", "pubsub"] {
        server.cmd_ok(&["CLIENT", "KILL", "TYPE", kind, "SKIPME", "yes"]);
    }
    let again = locks
        .with_lock("k", Duration::from_secs(5), async { 7 })
        .await;
    assert_eq!(again.ok(), Some(7), "{name}: after CLIENT KILL");
    let gap = handoff_gap(
        move |held| async move {
            locks
                .with_lock("k", Duration::from_secs(5), async {
                    let _ = held.send(());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Instant::now()
                })
                .await
                .expect("the holder after CLIENT KILL")
        },
        || async {
            waiter
                .with_lock("k", Duration::from_secs(5), async { Instant::now() })
                .await
                .unwrap_or_else(|e| panic!("{name}: the waiter after CLIENT KILL: {e}"))
        },
    )
    .await;
    println!("{name}: hand-off after CLIENT KILL {gap:?}");
    assert!(gap < NOTIFIED, "{name}: hand-off after CLIENT KILL {gap:?}");
    a.quit().await;
    b.quit().await;
}

/// The `resp=` field of every client connection on `port` but the one asking and replicas'
/// links (`flags=S`), with the connection's last command.
fn protocols(port: u16) -> Vec<(String, String)> {
    let list = harness::cmd_ok(port, &["CLIENT", "LIST"]);
    let text = list.to_text().unwrap_or_default();
    let field = |line: &str, name: &str| {
        line.split_whitespace()
            .find_map(|field| field.strip_prefix(name))
            .unwrap_or("?")
            .to_owned()
    };
    text.lines()
        .filter(|line| !line.contains("cmd=client|list") && field(line, "flags=") != "S")
        .map(|line| (field(line, "resp="), field(line, "cmd=")))
        .collect()
}

/// Every connection a lock client made from a RESP3 fred client opens speaks RESP3: the shared
/// one, the subscriber and (replicated) the dedicated ones that carry `WAIT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_of_a_resp3_client_speaks_resp3() {
    for kind in ServerKind::ALL {
        let setup = harness::Replicated::start(kind, 1);
        let port = setup.primary.port();
        let url = setup.primary_url();
        for replicated in [false, true] {
            let make = || async {
                let fred = caller_client(&url, |c, _, _, _| resp3(c));
                LockClient::builder()
                    .fred_client(&fred)
                    .replicated(replicated)
                    .connect()
                    .await
                    .expect("connect")
            };
            let (a, b) = (make().await, make().await);
            let ns = format!("resp3-conns-{}", rand::random::<u32>());
            let options = || LockOptions::new().namespace(ns.as_str());
            let (waiting, holding) = (
                a.lock_with::<str>(options()).expect("opts"),
                b.lock_with::<str>(options()).expect("opts"),
            );
            harness::wait_behind(&waiting, holding, "k").await;
            let seen = protocols(port);
            println!("{kind} replicated={replicated}: resp= of each connection: {seen:?}");
            // Two shared connections, at least one subscriber, and (replicated) a dedicated one.
            let least = if replicated { 4 } else { 3 };
            assert!(seen.len() >= least, "{kind}: {seen:?}");
            assert!(
                seen.iter().all(|(resp, _)| resp == "3"),
                "{kind} replicated={replicated}: a connection not on RESP3: {seen:?}"
            );
            a.quit().await;
            b.quit().await;
            let left = harness::settle_clients(port, 1, Duration::from_secs(5)).await;
            assert!(left <= 1, "{kind}: {left} connections left after quit");
        }
    }
}

/// A RESP3 client: every primitive hands over by notification, renews, reconnects after
/// `CLIENT KILL` (the subscriber subscribes again) and names its holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_every_primitive_and_reconnects() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let url = server.url();
        let make = || LockClient::from_fred(caller_client(&url, |c, _, _, _| resp3(c)));
        every_primitive_and_reconnects(&server, &format!("{kind} RESP3"), &make).await;
    }
}

/// A non-zero database (RESP2 and RESP3): the lock keys are in that database, and release
/// notifications (pub/sub knows no databases) still wake the waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_the_callers_holds_the_locks() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let url = server.url();
        for version in [RespVersion::RESP2, RespVersion::RESP3] {
            let make = || {
                LockClient::from_fred(caller_client(&url, |c, _, _, _| {
                    c.database = Some(5);
                    c.version = version.clone();
                }))
            };
            let name = format!("{kind} database 5 {version:?}");
            every_primitive_and_reconnects(&server, &name, &make).await;
            let client = make();
            let ns = format!("db-{}", rand::random::<u32>());
            let locks: Locks<str> = client
                .lock_with(LockOptions::new().namespace(ns.as_str()))
                .expect("opts");
            let key = String::from_utf8(LockClient::server_key(&ns, "k")).expect("utf8");
            let (db0, db5) = locks
                .with_lock("k", Duration::from_secs(2), async {
                    let mut conn = harness::RawConn::connect(server.port()).expect("connect");
                    let db0 = conn.cmd(&["EXISTS", &key]).expect("EXISTS").as_int();
                    conn.cmd(&["SELECT", "5"]).expect("SELECT");
                    let db5 = conn.cmd(&["EXISTS", &key]).expect("EXISTS").as_int();
                    (db0, db5)
                })
                .await
                .expect("with_lock");
            assert_eq!(
                (db0, db5),
                (Some(0), Some(1)),
                "{name}: the lock key's database"
            );
            client.quit().await;
        }
    }
}

/// The blocking policies `Error` and `Interrupt`, and a flush per command (fred 10's nearest to
/// auto-pipelining off) with a broadcast capacity of 1 are kept: locks work with each, also
/// after `CLIENT KILL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_connection_settings_are_kept_and_work() {
    type Setting = (&'static str, fn(&mut Config, &mut PerformanceConfig));
    let settings: [Setting; 3] = [
        ("Blocking::Error", |c, _| c.blocking = Blocking::Error),
        ("Blocking::Interrupt", |c, _| {
            c.blocking = Blocking::Interrupt
        }),
        ("a flush per command, broadcast capacity 1", |_, p| {
            p.max_feed_count = 1;
            p.broadcast_channel_capacity = 1;
        }),
    ];
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let url = server.url();
        for (setting, apply) in settings {
            let make = || LockClient::from_fred(caller_client(&url, |c, p, _, _| apply(c, p)));
            let client = make();
            let fred = client.fred();
            let kept = (
                fred.client_config().blocking,
                fred.perf_config().max_feed_count,
            );
            let mut expected = (Config::default(), PerformanceConfig::default());
            apply(&mut expected.0, &mut expected.1);
            assert_eq!(
                kept,
                (expected.0.blocking, expected.1.max_feed_count),
                "{kind}: {setting} not kept"
            );
            client.quit().await;
            every_primitive_and_reconnects(&server, &format!("{kind} {setting}"), &make).await;
        }
    }
}

/// The caller's `Config` settings on a replicated deployment (through the builder's
/// `fred_client`, which takes the `Config` alone), where lock operations send `WAIT` on
/// dedicated connections, which copy them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_connection_settings_work_with_wait() {
    type Setting = (&'static str, fn(&mut Config, &mut PerformanceConfig));
    let settings: [Setting; 4] = [
        ("RESP3", |c, _| resp3(c)),
        ("Blocking::Error", |c, _| c.blocking = Blocking::Error),
        ("Blocking::Interrupt", |c, _| {
            c.blocking = Blocking::Interrupt
        }),
        ("database 5", |c, _| c.database = Some(5)),
    ];
    for kind in ServerKind::ALL {
        let url = harness::shared_replicated(kind).primary_url();
        for (setting, apply) in settings {
            let runtime = tokio::runtime::Handle::current();
            let make = || {
                let fred = caller_client(&url, |c, p, _, _| apply(c, p));
                let connecting = LockClient::builder()
                    .fred_client(&fred)
                    .replicated(true)
                    .connect();
                tokio::task::block_in_place(|| runtime.block_on(connecting)).expect("connect")
            };
            let name = format!("{kind} replicated {setting}");
            every_primitive(&name, &make).await;
        }
    }
}

/// What lock safety relies on is set whatever the caller's client says (as
/// [`LockClient::from_fred`] documents): one attempt per command, no redirections followed, the
/// lock client's connect and command timeouts (not the caller's 1 ms), its reconnect policy (not
/// the caller's one attempt), a first connection that fails fast (not the caller's
/// `fail_fast = false`) and unnamed connections (not `auto_client_setname`); everything else
/// (here the protocol and database) is the caller's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_timeouts_and_reconnect_policy_are_overridden() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let url = server.url();
        let make = || {
            LockClient::from_fred(caller_client(&url, |c, perf, connection, policy| {
                resp3(c);
                c.database = Some(2);
                c.fail_fast = false;
                perf.default_command_timeout = Duration::from_millis(1);
                connection.max_command_attempts = 5;
                connection.max_redirections = 5;
                connection.internal_command_timeout = Duration::from_millis(1);
                connection.connection_timeout = Duration::from_millis(1);
                connection.auto_client_setname = true;
                *policy = Some(ReconnectPolicy::new_constant(1, 0));
            }))
        };
        let client = make();
        let fred = client.fred();
        let (config, perf, connection) = (
            fred.client_config(),
            fred.perf_config(),
            fred.connection_config().clone(),
        );
        assert_eq!(config.version, RespVersion::RESP3, "{kind}");
        assert_eq!(config.database, Some(2), "{kind}");
        assert!(config.fail_fast, "{kind}: fail_fast");
        assert_eq!(
            perf.default_command_timeout,
            Duration::from_secs(5),
            "{kind}"
        );
        assert_eq!(connection.max_command_attempts, 1, "{kind}");
        assert_eq!(connection.max_redirections, 0, "{kind}");
        assert!(
            !connection.auto_client_setname,
            "{kind}: auto_client_setname"
        );
        assert_eq!(
            connection.internal_command_timeout,
            Duration::from_secs(5),
            "{kind}"
        );
        assert_eq!(
            connection.connection_timeout,
            sage_lock::DEFAULT_CONNECT_TIMEOUT,
            "{kind}"
        );
        let policy = fred.client_reconnect_policy();
        assert!(
            matches!(
                policy,
                Some(ReconnectPolicy::Exponential {
                    max_attempts: 0,
                    min_delay: 20,
                    max_delay: 1_000,
                    ..
                })
            ),
            "{kind}: {policy:?}"
        );
        client.quit().await;
        every_primitive_and_reconnects(&server, &format!("{kind} overridden"), &make).await;
    }
}

/// A caller's `fail_fast: false` (fred retries a failed first connection by its reconnect
/// policy) does not turn a connection that cannot succeed into a wait for the whole connect
/// timeout: [`sage_lock::LockClientBuilder::connect`] still fails at once and names the cause
/// (a refused connection, the credentials, the database), as with fred's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_fail_fast_off_still_fails_fast_at_connect() {
    /// Each failure below is local and immediate; the connect timeout is 5 s.
    const AT_ONCE: Duration = Duration::from_secs(2);
    let refused = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let user = format!("ff-{}", rand::random::<u32>());
        server.cmd_ok(&["ACL", "SETUSER", &user, "on", ">pw", "~*", "&*", "+@all"]);
        let port = server.port();
        let cases = [
            (format!("redis://127.0.0.1:{refused}"), "Connection refused"),
            (
                format!("redis://{user}:wrong@127.0.0.1:{port}"),
                "refused the credentials",
            ),
            (
                format!("redis://{user}:pw@127.0.0.1:{port}/99"),
                "has no database 99",
            ),
        ];
        for (url, cause) in cases {
            for version in [RespVersion::RESP2, RespVersion::RESP3] {
                let fred = caller_client(&url, |c, _, _, _| {
                    c.fail_fast = false;
                    c.version = version.clone();
                });
                let started = Instant::now();
                let outcome = LockClient::builder()
                    .fred_client(&fred)
                    .connect_timeout(Duration::from_secs(5))
                    .connect()
                    .await;
                let took = started.elapsed();
                let error = match outcome {
                    Ok(client) => {
                        client.quit().await;
                        panic!("{kind} {url} {version:?}: connected")
                    }
                    Err(error) => error.to_string(),
                };
                println!("{kind} {cause} {version:?}: {took:?}: {error}");
                assert!(
                    took < AT_ONCE,
                    "{kind} {url} {version:?}: failed after {took:?}: {error}"
                );
                assert!(
                    error.contains(cause),
                    "{kind} {url} {version:?}: the error does not name the cause ({cause}): {error}"
                );
            }
        }
    }
}

/// The error and its sources, as one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// A caller's fred client that can never connect (a wrong password, a database the server
/// does not have), handed to `from_fred` (which connects in the background and reports
/// nothing): the calls that then get no reply say why, with what to fix, instead of only "no
/// reply from the server within the wait".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_a_client_that_cannot_connect_name_the_cause() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let user = format!("cause-{}", rand::random::<u32>());
        server.cmd_ok(&["ACL", "SETUSER", &user, "on", ">pw", "~*", "&*", "+@all"]);
        let port = server.port();
        let cases = [
            (
                format!("redis://{user}:wrong@127.0.0.1:{port}"),
                "the server refused the credentials",
            ),
            (
                format!("redis://{user}:pw@127.0.0.1:{port}/99"),
                "the server has no database 99",
            ),
        ];
        for (url, cause) in cases {
            let client = LockClient::from_fred(caller_client(&url, |_, _, _, _| {}));
            let locks: Locks<str> = client.lock();
            let waited = locks
                .with_lock("k", Duration::from_millis(800), async {})
                .await
                .expect_err("no connection");
            let waited = chain(&waited);
            println!("{kind} with_lock: {waited}");
            assert!(
                waited.contains(cause) && waited.contains("not connected to"),
                "{kind} {url}: with_lock's error does not name the cause ({cause}): {waited}"
            );
            if cause.contains("credentials") {
                let inspected = chain(&locks.is_locked("k").await.expect_err("no connection"));
                println!("{kind} is_locked: {inspected}");
                assert!(
                    inspected.contains(cause),
                    "{kind} {url}: is_locked's error does not name the cause ({cause}): {inspected}"
                );
            }
            client.quit().await;
        }
    }
}

/// A `from_fred` client whose server does not answer (nothing listens on the port, or a peer
/// accepts and stays silent): the node check of its first call may add up to its 1 s bound,
/// but later calls keep to their wait (`with_lock`'s "at most about 25 ms past the wait"), not
/// ask the node again and again for a second each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_from_fred_client_without_a_server_keeps_later_calls_within_their_wait() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    // Accepts (the kernel's backlog does) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent_port = silent.local_addr().expect("address").port();
    for (what, port) in [("closed port", closed), ("silent peer", silent_port)] {
        let url = format!("redis://127.0.0.1:{port}");
        let client = LockClient::from_fred(caller_client(&url, |_, _, _, _| {}));
        let locks: Locks<str> = client.lock();
        let wait = Duration::from_millis(300);
        let mut took = Vec::new();
        for _ in 0..3 {
            let start = Instant::now();
            let error = locks
                .with_lock("k", wait, async {})
                .await
                .expect_err("no server");
            took.push(start.elapsed());
            assert!(
                matches!(error, sage_lock::LockError::TimedOut { .. }),
                "{what}: {error}"
            );
        }
        println!("{what}: with_lock({wait:?}) took {took:?}");
        for later in &took[1..] {
            assert!(
                *later < wait + Duration::from_millis(600),
                "{what}: a later call took {later:?} for a wait of {wait:?} (all: {took:?})"
            );
        }
        client.quit().await;
    }
    drop(silent);
}
