//! The uncontended release: where the server has `DELIFEQ` (Valkey 9), a hold granted without
//! waiting is released with that one native command; once a waiter queues behind the holder the
//! lock's value carries the queued mark, `DELIFEQ` finds no match, and the release script hands
//! off and notifies as before. Redis 7 has no `DELIFEQ`: a one-key compare-and-delete script
//! stands in for it, with the same fallback. The read-write lock's uncontended reader, too,
//! asks the server for no more than it needs.

use std::time::{Duration, Instant};

use harness::{Server, ServerKind, commandstats_calls};
use sage_lock::{LockClient, LockOptions, Locks};

fn locks(client: &LockClient, ns: &str, lease: Duration) -> Locks<str> {
    client
        .lock_with(LockOptions::new().namespace(ns).lease(lease))
        .expect("options")
}

/// A client's first releases, 200 at once: whether the server has `DELIFEQ` is known from the
/// `INFO` that `connect` reads anyway (to refuse a cluster node, a Sentinel or a replica), so
/// none of them asks. Before, every release that came before the first answer asked again (an
/// audit counted 1,098 `INFO` calls in a burst of 5,000 on Valkey), then one asked for all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_first_releases_asks_for_delifeq_once() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks = locks(&client, "first-releases", Duration::from_secs(10));
        let (ready_tx, mut ready) = tokio::sync::mpsc::channel::<()>(200);
        let (release, released) = tokio::sync::watch::channel(false);
        let holders: Vec<_> = (0..200)
            .map(|i| {
                let (locks, ready_tx, mut released) =
                    (locks.clone(), ready_tx.clone(), released.clone());
                tokio::spawn(async move {
                    locks
                        .with_lock(&format!("k{i}"), Duration::from_secs(5), async move {
                            let _ = ready_tx.send(()).await;
                            let _ = released.wait_for(|go| *go).await;
                        })
                        .await
                })
            })
            .collect();
        for _ in 0..200 {
            ready.recv().await.expect("a holder acquired");
        }
        server.cmd_ok(&["CONFIG", "RESETSTAT"]);
        release.send_replace(true);
        for holder in holders {
            holder.await.expect("holder task").expect("holder");
        }
        let asked = commandstats_calls(server.port(), "info");
        println!("{}: {asked} INFO calls for 200 first releases", kind.name());
        assert_eq!(asked, 0, "{}: INFO server asked {asked} times", kind.name());
        client.quit().await;
    }
}

/// 50 uncontended cycles: one `DELIFEQ` per release on Valkey (and one script call per
/// acquisition), two script calls per cycle on Redis, the release's being the one-key
/// compare-and-delete; nothing reads the waiter queue (`LINDEX`: the grant marker says nobody
/// queues); no key is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_releases_use_delifeq_where_the_server_has_it() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks = locks(&client, "fast", Duration::from_secs(10));
        // Warm up: loads the scripts and asks once whether DELIFEQ exists.
        locks
            .with_lock("warm", Duration::from_secs(2), async {})
            .await
            .expect("warm-up");
        server.cmd_ok(&["CONFIG", "RESETSTAT"]);
        for i in 0..50 {
            locks
                .with_lock(&format!("k{i}"), Duration::from_secs(2), async {})
                .await
                .expect("uncontended cycle");
        }
        let port = server.port();
        let (delifeq, evalsha, lindex) = (
            commandstats_calls(port, "delifeq"),
            commandstats_calls(port, "evalsha"),
            commandstats_calls(port, "lindex"),
        );
        println!(
            "{}: {delifeq} DELIFEQ, {evalsha} EVALSHA, {lindex} LINDEX",
            kind.name()
        );
        assert_eq!(
            lindex,
            0,
            "{}: an uncontended acquisition read the waiter queue",
            kind.name()
        );
        match kind {
            ServerKind::Valkey => {
                assert_eq!(
                    (delifeq, evalsha),
                    (50, 50),
                    "valkey: one DELIFEQ per release"
                );
            }
            ServerKind::Redis => {
                assert_eq!(
                    (delifeq, evalsha),
                    (0, 100),
                    "redis: a script per acquisition and per release"
                );
            }
        }
        let left = server.cmd_ok(&["KEYS", "{fast:*"]);
        let left = match left {
            harness::Reply::Array(keys) => keys
                .iter()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .filter(|k| !k.ends_with(":fence") && !k.ends_with(":since"))
                .collect::<Vec<_>>(),
            other => panic!("KEYS: {other:?}"),
        };
        assert!(left.is_empty(), "{}: left {left:?}", kind.name());
        client.quit().await;
    }
}

/// A waiter in another client queues behind a holder that was granted without waiting: the
/// lock's value gets the queued mark, the holder's renewals of the marked value keep working, and
/// its release still hands off at once (a notification, not the waiter's next poll, which is up
/// to 500 ms away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_queued_behind_an_uncontended_holder_is_handed_the_lock_at_once() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let (a, b) = (
            LockClient::connect(&server.url()).await.expect("connect a"),
            LockClient::connect(&server.url()).await.expect("connect b"),
        );
        let ns = format!("handoff-{}", rand::random::<u32>());
        // A 1.5 s lease held for 1.5 s: renewed (at 0.5 s and 1 s) while the value is marked.
        let (holder, waiter) = (
            locks(&a, &ns, Duration::from_millis(1500)),
            locks(&b, &ns, Duration::from_secs(5)),
        );
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let holding = tokio::spawn(async move {
            holder
                .with_lock("k", Duration::from_secs(2), async move {
                    let _ = held_tx.send(sage_lock::current_lease().map(|l| l.fencing_token()));
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    Instant::now()
                })
                .await
        });
        held_rx.await.expect("held");
        let waiting = tokio::spawn(async move {
            waiter
                .with_lock("k", Duration::from_secs(5), async { Instant::now() })
                .await
        });
        tokio::time::sleep(Duration::from_millis(400)).await;
        let value = server.cmd_ok(&["GET", &format!("{{{ns}:k}}")]);
        let value = value.as_str().unwrap_or_default().to_owned();
        assert!(
            value.len() == 33 && value.ends_with('+'),
            "{}: a queued waiter marks the holder's value: {value:?}",
            kind.name()
        );
        let released = holding
            .await
            .expect("holder task")
            .expect("the holder kept its lock while marked (renewals worked)");
        let granted = waiting
            .await
            .expect("waiter task")
            .expect("the waiter gets the lock");
        let gap = granted.saturating_duration_since(released);
        println!("{}: hand-off {gap:?} after the body ended", kind.name());
        assert!(
            gap < Duration::from_millis(200),
            "{}: the waiter waited {gap:?} after the release (its poll, not a notification)",
            kind.name()
        );
        a.quit().await;
        b.quit().await;
    }
}

/// How many idle channels the sweep test leaves on the waiter's subscriber.
const IDLE_CHANNELS: usize = 2_000;

/// One hand-off from `holder` to `waiter` on key `probe`: the time from the holder's body's end
/// to the waiter's grant.
async fn hand_off(holder: &Locks<str>, waiter: &Locks<str>) -> Duration {
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let holding = {
        let holder = holder.clone();
        tokio::spawn(async move {
            holder
                .with_lock("probe", Duration::from_secs(5), async move {
                    let _ = held_tx.send(());
                    let _ = go_rx.await;
                    Instant::now()
                })
                .await
        })
    };
    held_rx.await.expect("the probe is held");
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .with_lock("probe", Duration::from_secs(5), async { Instant::now() })
                .await
        })
    };
    // Queued and subscribed by then.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let _ = go_tx.send(());
    let released = holding.await.expect("holder").expect("the holder");
    let granted = waiting.await.expect("waiter").expect("the waiter");
    granted.saturating_duration_since(released)
}

/// While the subscriber drops thousands of channels that lingered idle, a release message is
/// still heard at once: before, the sweep sent one `SUNSUBSCRIBE` per round trip and read no
/// message until it was through, so a hand-off waited for the sweep or for the waiter's next poll
/// (helper 31: 6-60 ms hand-offs while 7-17k channels were dropped, against about 1 ms). The
/// waiter reaches the server through a proxy adding 1 ms each way. (At this scale the sweep was
/// through within one hand-off of a few ms before the change too: this guards it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_is_heard_while_idle_channels_are_dropped() {
    use harness::chaos::proxy::{Mode, Proxy};
    use sage_lock::__private::resident;
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let proxy = Proxy::start(server.port()).expect("a proxy");
        let (a, b) = (
            LockClient::connect(&server.url()).await.expect("connect a"),
            LockClient::connect(&format!("redis://127.0.0.1:{}", proxy.port()))
                .await
                .expect("connect b"),
        );
        let ns = format!("sweep-{}", rand::random::<u32>());
        let (holder, waiter) = (
            locks(&a, &ns, Duration::from_secs(30)),
            locks(&b, &ns, Duration::from_secs(30)),
        );
        // The holder takes every key in one round trip; a short wait for each subscribes its
        // channel, which then lingers idle.
        let keys: Vec<String> = (0..IDLE_CHANNELS).map(|i| format!("idle{i}")).collect();
        let (release_all, all_released) = tokio::sync::oneshot::channel::<()>();
        let (taken_tx, taken) = tokio::sync::oneshot::channel();
        let holding_all = {
            let holder = holder.clone();
            let keys = keys.clone();
            tokio::spawn(async move {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                holder
                    .with_locks(&keys, Duration::from_secs(5), async move {
                        let _ = taken_tx.send(());
                        let _ = all_released.await;
                    })
                    .await
            })
        };
        taken.await.expect("all keys held");
        let mut tries = tokio::task::JoinSet::new();
        for key in keys {
            let waiter = waiter.clone();
            tries.spawn(async move {
                waiter
                    .with_lock(&key, Duration::from_millis(300), async {})
                    .await
            });
        }
        while let Some(tried) = tries.join_next().await {
            assert!(tried.expect("task").is_err(), "{kind}: the key was held");
        }
        let _ = release_all.send(());
        holding_all.await.expect("holder").expect("the holder");
        let subscribed = resident(&b).channels;
        println!("{kind}: {subscribed} channels linger");
        assert!(
            subscribed >= IDLE_CHANNELS / 2,
            "{kind}: {subscribed} channels"
        );
        proxy.set_mode(Mode::Latency(Duration::from_millis(1)));
        // Hand-offs until the channels are gone: those while the sweep dropped some count.
        let mut during = Vec::new();
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until && during.len() < 15 {
            let before = resident(&b).channels;
            if before <= 1 {
                break;
            }
            let took = hand_off(&holder, &waiter).await;
            if resident(&b).channels < before {
                during.push(took);
            }
        }
        proxy.set_mode(Mode::Normal);
        println!("{kind}: hand-offs while the sweep ran: {during:?}");
        assert!(
            !during.is_empty(),
            "{kind}: no hand-off while the sweep ran"
        );
        let slowest = during.iter().max().copied().unwrap_or_default();
        assert!(
            slowest < Duration::from_millis(150),
            "{kind}: a hand-off while idle channels were dropped took {slowest:?} (a \
             notification takes a few ms, the waiter's poll up to 500 ms)"
        );
        a.quit().await;
        b.quit().await;
    }
}

/// How many uncontended cycles the read lock and semaphore tests run.
const CYCLES: u64 = 64;

/// Runs `cycle` once on key `warm` (loading the scripts), then [`CYCLES`] times on key `k`, and
/// checks what the server ran for those cycles (scripts' nested calls included): each command of
/// `exact` exactly as often as given, and the prune of expired members (`ZREMRANGEBYSCORE`) at
/// most at every 16th grant.
async fn assert_uncontended_calls(
    server: &Server,
    cycle: impl AsyncFn(&str),
    exact: &[(&str, u64)],
    name: &str,
) {
    cycle("warm").await;
    server.cmd_ok(&["CONFIG", "RESETSTAT"]);
    for _ in 0..CYCLES {
        cycle("k").await;
    }
    let calls: Vec<(&str, u64)> = exact
        .iter()
        .map(|(command, _)| (*command, commandstats_calls(server.port(), command)))
        .collect();
    let pruned = commandstats_calls(server.port(), "zremrangebyscore");
    println!("{name}: {calls:?}, {pruned} prunes");
    for ((command, ran), (_, expected)) in calls.iter().zip(exact) {
        assert_eq!(
            ran, expected,
            "{name}: {command} ran {ran} times in {CYCLES} uncontended cycles, not {expected}"
        );
    }
    assert!(
        pruned <= CYCLES / 16 + 1,
        "{name}: expired members dropped at {pruned} of {CYCLES} grants"
    );
}

/// 64 uncontended read cycles on one key (no writer holds or waits): each acquisition learns
/// that with one `EXISTS` and reads neither the readers' scores (`ZSCORE`) nor the writer queue
/// (`ZRANGE`); expired readers are dropped at every 16th grant only; the release removes the
/// reader and looks no further (one `ZREM` each way, one `EXISTS` of the writer queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_read_asks_only_whether_a_writer_holds_or_waits() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let rw = client
            .rw_lock_with::<str>(LockOptions::new().namespace("fast-read"))
            .expect("options");
        let read = async |key: &str| {
            rw.read(key, Duration::from_secs(2), async {})
                .await
                .expect("uncontended read");
        };
        let exact = [
            ("evalsha", 2 * CYCLES),
            ("exists", 2 * CYCLES),
            ("zscore", 0),
            ("zrange", 0),
            ("zrem", 2 * CYCLES),
        ];
        assert_uncontended_calls(&server, read, &exact, kind.name()).await;
        client.quit().await;
    }
}

/// 64 uncontended cycles of a 4-permit semaphore on one key: each acquisition counts the live
/// holders with one `ZCOUNT` and looks once at the empty waiter queue (`ZRANGE`), without asking
/// for its own score (`ZSCORE`), counting all members (`ZCARD`) or dropping expired holders
/// but at every 16th grant; the release removes the holder and looks no further (one `ZREM`,
/// one `EXISTS` of the queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_permit_counts_the_holders_once() {
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let sem = client
            .semaphore_with::<str>(4, LockOptions::new().namespace("fast-permit"))
            .expect("options");
        let permit = async |key: &str| {
            sem.acquire(key, Duration::from_secs(2), async {})
                .await
                .expect("uncontended permit");
        };
        let exact = [
            ("evalsha", 2 * CYCLES),
            ("zcount", CYCLES),
            ("zrange", CYCLES),
            ("zcard", 0),
            ("zscore", 0),
            ("zrem", CYCLES),
            ("exists", CYCLES),
        ];
        assert_uncontended_calls(&server, permit, &exact, kind.name()).await;
        client.quit().await;
    }
}

/// A `DELIFEQ` cut by a lost connection (its client killed while a write pause held it back)
/// does not turn this client's releases to the script for good: the next uncontended
/// releases send `DELIFEQ` again. Before, any error from `DELIFEQ`, a transient one included,
/// switched it off for the client's lifetime (audit 50).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delifeq_cut_by_a_lost_connection_is_sent_again() {
    let server = Server::start(ServerKind::Valkey);
    let client = LockClient::connect(&server.url()).await.expect("connect");
    let locks = locks(&client, "fast-cut", Duration::from_secs(10));
    locks
        .with_lock("warm", Duration::from_secs(2), async {})
        .await
        .expect("warm-up");
    let cut = locks.with_lock("cut", Duration::from_secs(2), async {
        // The release's DELIFEQ is held back, then its connection killed.
        server.cmd_ok(&["CLIENT", "PAUSE", "3000", "WRITE"]);
        let port = server.port();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let _ = harness::cmd(port, &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
            std::thread::sleep(Duration::from_millis(100));
            let _ = harness::cmd(port, &["CLIENT", "UNPAUSE"]);
        });
    });
    let started = Instant::now();
    let cut = cut.await;
    println!("cut release: {cut:?} after {:?}", started.elapsed());
    server.cmd_ok(&["CONFIG", "RESETSTAT"]);
    for i in 0..5 {
        locks
            .with_lock(&format!("k{i}"), Duration::from_secs(5), async {})
            .await
            .expect("uncontended cycle");
    }
    let delifeq = commandstats_calls(server.port(), "delifeq");
    assert_eq!(delifeq, 5, "valkey: DELIFEQ after a cut one");
    client.quit().await;
}
