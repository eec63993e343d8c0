//! The semaphore's and the read-write lock's queues: arrival order, dead and giving-up waiters,
//! and hand-offs.

use super::*;

/// A free permit stays free for a live queued waiter: a try is refused and a new waiter queues
/// behind it. Once that waiter's place ends (it died between attempts), the new waiter gets the
/// permit on its own. The queued waiter is written into the queue directly, so nothing retries
/// for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_permit_stays_free_for_a_live_queued_waiter() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("sem-reserved", kind);
        let client = connect(&server.url()).await;
        let sem = semaphore(&client, &ns);
        let (queue, dues) = (
            format!("{{{ns}:k}}:sem-queue"),
            format!("{{{ns}:k}}:sem-due"),
        );
        queue_ghost(server.port(), &queue, &dues, 1500);
        let tried = sem.try_acquire("k", async {}).await.expect("try");
        assert!(
            tried.is_none(),
            "{}: a try took the permit a queued waiter is owed",
            kind.name()
        );
        let asked = Instant::now();
        let entered = sem
            .acquire("k", Duration::from_secs(5), async { asked.elapsed() })
            .await
            .expect("the waiter behind gets the permit once the place ends");
        println!("{}: entered after {entered:?}", kind.name());
        assert!(
            entered > Duration::from_millis(700) && entered < DEAD_WAITER_BOUND,
            "{}: entered after {entered:?}, the ghost's place lasted about 1.5 s",
            kind.name()
        );
        assert_eq!(sem_queue_len(server.port(), &ns, "k"), 0, "{}", kind.name());
    }
}

/// Waits until the `waiting` task is queued (`queued()` is 1), drops its future, and waits until
/// `queued()` is 0, which a waiter that gave up must reach well before its place (1–2 s after
/// its last attempt) would end on its own.
async fn gives_up<T>(waiting: tokio::task::JoinHandle<T>, queued: impl Fn() -> i64, who: &str) {
    let start = Instant::now();
    while queued() != 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{who} never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waiting.abort();
    assert!(waiting.await.is_err(), "{who} got in");
    let start = Instant::now();
    while queued() != 0 {
        assert!(
            start.elapsed() < Duration::from_millis(400),
            "{who} is still queued after {:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("{who} left the queue within {:?}", start.elapsed());
}

/// A waiting caller that gives up leaves the queue at once, whether its wait ran out or its
/// future was dropped mid-wait: it does not hold up the permit until its place would have
/// ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_waiter_that_gives_up_leaves_the_queue() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("sem-give-up", kind);
        let holder = connect(&server.url()).await;
        let (release, held) = hold_queued(&Queued::Permit(semaphore(&holder, &ns)), "k").await;
        let waiter = semaphore(&connect(&server.url()).await, &ns);
        let waited = waiter
            .acquire("k", Duration::from_millis(300), async {})
            .await;
        assert!(
            matches!(waited, Err(sage_lock::LockError::TimedOut { .. })),
            "{}: {waited:?}",
            kind.name()
        );
        assert_eq!(
            sem_queue_len(server.port(), &ns, "k"),
            0,
            "{}: the waiter whose wait ran out is still queued",
            kind.name()
        );
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move { waiter.acquire("k", Duration::from_secs(5), async {}).await }
        });
        let queued = || sem_queue_len(server.port(), &ns, "k");
        gives_up(waiting, queued, "the semaphore waiter that gave up").await;
        release.send(()).expect("release");
        held.await.expect("holder");
        let tried = waiter.try_acquire("k", async { 1 }).await.expect("try");
        assert_eq!(tried, Some(1), "{}: free permit, empty queue", kind.name());
    }
}

/// Waiting callers of `primitive` in different clients get it in the order they started
/// waiting, a try while they wait is refused even when the lock is momentarily free, and the
/// queue is gone once all of them have had it.
async fn served_in_arrival_order(primitive: &str) {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns(&format!("fifo-{primitive}"), kind);
        let holder = Queued::new(primitive, &connect(&server.url()).await, &ns);
        let [queue, places] = holder
            .queue_keys()
            .map(|suffix| format!("{{{ns}:k}}:{suffix}"));
        let queued_len = || zcard(server.port(), &queue);
        let (release, held) = hold_queued(&holder, "k").await;
        let mut entered = Vec::new();
        for i in 0..4 {
            let waiter = Queued::new(primitive, &connect(&server.url()).await, &ns);
            entered.push((
                i,
                tokio::spawn(async move {
                    waiter
                        .hold("k", Duration::from_secs(10), async {
                            let at = Instant::now();
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            at
                        })
                        .await
                        .expect("waiter gets the lock")
                }),
            ));
            let start = Instant::now();
            while queued_len() < i + 1 {
                assert!(start.elapsed() < Duration::from_secs(10), "never queued");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let queued = harness::cmd(server.port(), &["ZRANGE", &queue, "0", "-1", "WITHSCORES"]);
        release.send(()).expect("release");
        held.await.expect("holder");
        assert!(
            holder.try_hold("k").await.is_none(),
            "{} {primitive}: a try overtook the queue",
            kind.name()
        );
        let mut order = Vec::new();
        for (i, task) in entered {
            order.push((task.await.expect("waiter"), i));
        }
        order.sort();
        let order: Vec<i64> = order.into_iter().map(|(_, i)| i).collect();
        assert_eq!(
            order,
            [0, 1, 2, 3],
            "{} {primitive}: the queue before the release: {queued:?}",
            kind.name()
        );
        for key in [&queue, &places] {
            let exists = harness::cmd(server.port(), &["EXISTS", key]).map(|r| r.as_int());
            assert_eq!(exists, Ok(Some(0)), "{}: {key} left behind", kind.name());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_waiters_are_served_in_arrival_order() {
    served_in_arrival_order("semaphore").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_are_served_in_arrival_order() {
    served_in_arrival_order("write").await;
}

/// Readers and writers of one key, each in its own client, enter in the order they started
/// waiting, and the readers that queued one after the other enter together: behind a holding
/// writer, reader 0, writer 1, readers 2 and 3 and writer 4 queue in turn; reader 0 goes first,
/// then writer 1, then readers 2 and 3 at once, then writer 4. A `try_write` during the hand-over
/// is refused, and both queues are gone afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_writers_are_served_in_arrival_order() {
    rw_served_in_arrival_order(false).await;
}

/// The same with every waiter in one client (one process): each waiting call queues on the
/// server itself. Before, a process's waiters of one key lined up locally, one asking the
/// server at a time, whatever their kind: writer 1 waited behind reader 0 without queuing, and
/// the readers of one process never entered together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_writers_of_one_process_are_served_in_arrival_order() {
    rw_served_in_arrival_order(true).await;
}

/// [`readers_and_writers_are_served_in_arrival_order`], the waiters in one client when
/// `one_client`.
async fn rw_served_in_arrival_order(one_client: bool) {
    const BODY: Duration = Duration::from_millis(100);
    let writes = [false, true, false, false, true];
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("fifo-rw", kind);
        let rw = |client: &LockClient| rw_locks(client, &ns);
        let holder = rw(&connect(&server.url()).await);
        let shared = connect(&server.url()).await;
        let queues: Vec<String> = ["wq", "wd", "rq", "rd"]
            .iter()
            .map(|suffix| format!("{{{ns}:k}}:{suffix}"))
            .collect();
        let queued_len = || {
            [&queues[0], &queues[2]]
                .iter()
                .map(|queue| zcard(server.port(), queue))
                .sum::<i64>()
        };
        let (release, held) = hold_queued(&Queued::Write(holder.clone()), "k").await;
        let mut entered = Vec::new();
        for (i, write) in (0_i64..).zip(writes) {
            let waiter = if one_client {
                rw(&shared)
            } else {
                rw(&connect(&server.url()).await)
            };
            entered.push(tokio::spawn(async move {
                let body = async {
                    let at = Instant::now();
                    tokio::time::sleep(BODY).await;
                    (at, Instant::now())
                };
                let wait = Duration::from_secs(10);
                if write {
                    waiter.write("k", wait, body).await
                } else {
                    waiter.read("k", wait, body).await
                }
                .expect("waiter gets the lock")
            }));
            let start = Instant::now();
            while queued_len() < i + 1 {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "{}: waiter {i} never queued on the server",
                    kind.name()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        release.send(()).expect("release");
        held.await.expect("holder");
        assert!(
            holder
                .try_write("k", async {})
                .await
                .expect("try")
                .is_none(),
            "{}: a try_write overtook the queue",
            kind.name()
        );
        let mut spans = Vec::new();
        for task in entered {
            spans.push(task.await.expect("waiter"));
        }
        let name = kind.name();
        let [r0, w1, r2, r3, w4] = spans[..] else {
            unreachable!("five waiters")
        };
        assert!(r0.1 <= w1.0, "{name}: writer 1 entered while reader 0 read");
        assert!(
            w1.1 <= r2.0 && w1.1 <= r3.0,
            "{name}: a reader overtook writer 1"
        );
        assert!(
            r2.0 < r3.1 && r3.0 < r2.1,
            "{name}: readers 2 and 3 did not read together: {spans:?}"
        );
        assert!(
            r2.1 <= w4.0 && r3.1 <= w4.0,
            "{name}: writer 4 entered while a reader read"
        );
        for key in &queues {
            let exists = harness::cmd(server.port(), &["EXISTS", key]).map(|r| r.as_int());
            assert_eq!(exists, Ok(Some(0)), "{name}: {key} left behind");
        }
    }
}

/// A live queued reader keeps later writers behind it, not later readers: with a reader written
/// into the reader queue directly (so nothing retries for it), its place ending 1.5 s later, a
/// `try_write` is refused, a `try_read` enters, and a waiting writer enters once the place ends.
/// A reader that gives up waiting (its wait ran out, or its future was dropped) leaves the queue
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_reader_keeps_later_writers_behind_it() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("rw-reader-queued", kind);
        let rw = rw_locks(&connect(&server.url()).await, &ns);
        let (queue, dues) = (format!("{{{ns}:k}}:rq"), format!("{{{ns}:k}}:rd"));
        let queued_len = || zcard(server.port(), &queue);
        queue_ghost(server.port(), &queue, &dues, 1500);
        let name = kind.name();
        let tried = rw.try_write("k", async {}).await.expect("try_write");
        assert!(
            tried.is_none(),
            "{name}: a try_write overtook a queued reader"
        );
        let read = rw.try_read("k", async { 1 }).await.expect("try_read");
        assert_eq!(read, Some(1), "{name}: a queued reader kept a reader out");
        let asked = Instant::now();
        let entered = rw
            .write("k", Duration::from_secs(5), async { asked.elapsed() })
            .await
            .expect("the writer gets the lock once the reader's place ends");
        println!("{name}: writer entered after {entered:?}");
        assert!(
            entered > Duration::from_millis(700) && entered < DEAD_WAITER_BOUND,
            "{name}: entered after {entered:?}, the queued reader's place lasted about 1.5 s"
        );
        assert_eq!(queued_len(), 0, "{name}: the ended place is still queued");

        // A reader that gives up leaves the queue.
        let (release, writer) = hold_queued(&Queued::Write(rw.clone()), "k").await;
        let reader = connect(&server.url())
            .await
            .rw_lock_with::<str>(LockOptions::new().namespace(&ns))
            .expect("options");
        let waited = reader.read("k", Duration::from_millis(300), async {}).await;
        assert!(
            matches!(waited, Err(sage_lock::LockError::TimedOut { .. })),
            "{name}: {waited:?}"
        );
        assert_eq!(
            queued_len(),
            0,
            "{name}: the reader whose wait ran out is still queued"
        );
        let reading =
            tokio::spawn(async move { reader.read("k", Duration::from_secs(5), async {}).await });
        gives_up(reading, queued_len, "the reader that gave up").await;
        release.send(()).expect("release");
        writer.await.expect("writer");
        let tried = rw.try_write("k", async { 1 }).await.expect("try_write");
        assert_eq!(tried, Some(1), "{name}: free lock, empty queues");
    }
}

/// A release of the semaphore or of a writer hands the lock over on the server to the first live
/// queued waiter, with a new fencing token: handed to a waiter that never takes it (written
/// into the queue directly, its place lasting 10 s), it comes back when the hand-off lease ends
/// (the releaser's 1 s lease), and a real waiter queued behind it gets it then, with the fencing
/// token after the one the hand-off took. The same for a dead reader queued ahead of a real
/// writer (`read`): the writer's release hands it a read lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_to_a_dead_semaphore_writer_or_reader_waiter_lasts_its_lease() {
    for primitive in ["semaphore", "write", "read"] {
        for kind in ServerKind::ALL {
            let server = harness::shared(kind);
            let ns = ns(&format!("dead-handoff-{primitive}"), kind);
            let name = format!("{} {primitive}", kind.name());
            let short = LockOptions::new()
                .namespace(&ns)
                .lease(Duration::from_secs(1));
            let client = connect(&server.url()).await;
            let holder = match primitive {
                "semaphore" => Queued::Permit(client.semaphore_with(1, short).expect("options")),
                _ => Queued::Write(client.rw_lock_with(short).expect("options")),
            };
            let [queue, places] = holder
                .queue_keys()
                .map(|suffix| format!("{{{ns}:k}}:{suffix}"));
            // The dead waiter: for `read`, a reader queued ahead of the real (writing) waiter.
            let [ghost_queue, ghost_places] = match primitive {
                "read" => ["rq", "rd"].map(|suffix| format!("{{{ns}:k}}:{suffix}")),
                _ => [queue.clone(), places.clone()],
            };
            let fence = std::sync::Arc::new(std::sync::Mutex::new(0));
            let (held_tx, held_rx) = tokio::sync::oneshot::channel();
            let (release, release_rx) = tokio::sync::oneshot::channel::<()>();
            let held = tokio::spawn({
                let (holder, fence) = (holder.clone(), fence.clone());
                async move {
                    holder
                        .hold("k", Duration::from_secs(5), async move {
                            *fence.lock().expect("fence") =
                                sage_lock::current_lease().expect("lease").fencing_token();
                            let _ = held_tx.send(());
                            let _ = release_rx.await;
                        })
                        .await
                        .expect("hold");
                }
            });
            held_rx.await.expect("held");
            let held_fence = *fence.lock().expect("fence");
            queue_ghost(server.port(), &ghost_queue, &ghost_places, 10_000);
            let waiter = Queued::new(primitive, &connect(&server.url()).await, &ns);
            let entered = tokio::spawn(async move {
                waiter
                    .hold("k", Duration::from_secs(8), async {
                        let lease = sage_lock::current_lease().expect("lease");
                        (Instant::now(), lease.fencing_token())
                    })
                    .await
                    .expect("the waiter behind the dead one gets the lock")
            });
            let start = Instant::now();
            let with_ghost = if ghost_queue == queue { 2 } else { 1 };
            while zcard(server.port(), &queue) < with_ghost {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "{name}: never queued"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            release.send(()).expect("release");
            held.await.expect("holder");
            let released_at = Instant::now();
            let handed = match primitive {
                "semaphore" => harness::cmd(
                    server.port(),
                    &["ZSCORE", &format!("{{{ns}:k}}:sem"), "ghost"],
                )
                .map(|r| r.as_str().is_some()),
                "read" => harness::cmd(
                    server.port(),
                    &["ZSCORE", &format!("{{{ns}:k}}:r"), "ghost"],
                )
                .map(|r| r.as_str().is_some()),
                _ => harness::cmd(server.port(), &["GET", &format!("{{{ns}:k}}:w")])
                    .map(|r| r.as_str() == Some("ghost")),
            };
            assert_eq!(handed, Ok(true), "{name}: the release did not hand over");
            let (at, waiter_fence) = entered.await.expect("waiter");
            let waited = at.saturating_duration_since(released_at);
            println!("{name}: the waiter behind the dead one entered {waited:?} after the release");
            assert!(
                waited > Duration::from_millis(600) && waited < DEAD_WAITER_BOUND,
                "{name}: entered {waited:?} after the release; the hand-off lease is 1 s"
            );
            assert_eq!(
                waiter_fence,
                held_fence + 2,
                "{name}: the hand-off took the fencing token between the two holds"
            );
        }
    }
}

/// A release hands the lock to at most 32 queued readers by name, and tells the rest with an
/// empty message: behind a holding writer, 40 readers that never retry (written into the reader
/// queue directly, places lasting 10 s) and then a real reader queue. The writer's release gives
/// the first 32 a read lease each (one fencing token each), leaves the other 8 queued, and the
/// real reader, woken by the message, enters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_at_most_32_readers() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("rw-reader-cap", kind);
        let name = kind.name();
        let rw = |client: &LockClient| rw_locks(client, &ns);
        let writer = rw(&connect(&server.url()).await);
        let (release, held) = hold_queued(&Queued::Write(writer), "k").await;
        let [readers, queue, dues, fence] =
            ["r", "rq", "rd", "fence"].map(|suffix| format!("{{{ns}:k}}:{suffix}"));
        let ghosts: Vec<String> = (0..40).map(|i| format!("ghost-{i:02}")).collect();
        let ghost_names: Vec<&str> = ghosts.iter().map(String::as_str).collect();
        queue_ghosts(server.port(), &queue, &dues, 10_000, &ghost_names);
        let reader = rw(&connect(&server.url()).await);
        let reading = tokio::spawn(async move {
            reader
                .read("k", Duration::from_secs(5), async {
                    sage_lock::current_lease().expect("lease").fencing_token()
                })
                .await
        });
        let start = Instant::now();
        while zcard(server.port(), &queue) < 41 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{name}: never queued"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let counter = |port| {
            harness::cmd(port, &["GET", &fence])
                .ok()
                .and_then(|r| r.as_str().and_then(|s| s.parse::<u64>().ok()))
                .unwrap_or(0)
        };
        let before = counter(server.port());
        release.send(()).expect("release");
        held.await.expect("writer");
        let entered_with = reading
            .await
            .expect("reader")
            .expect("the reader past the cap enters");
        let handed: Vec<bool> = ghosts
            .iter()
            .map(|ghost| {
                harness::cmd(server.port(), &["ZSCORE", &readers, ghost])
                    .map(|r| r.as_str().is_some())
                    .unwrap_or(false)
            })
            .collect();
        assert!(
            handed[..32].iter().all(|h| *h) && !handed[32..].iter().any(|h| *h),
            "{name}: not the first 32 readers handed the lock: {handed:?}"
        );
        assert_eq!(
            zcard(server.port(), &queue),
            8,
            "{name}: the 8 readers past the cap stay queued"
        );
        assert!(
            entered_with > before + 32,
            "{name}: the reader's fencing token {entered_with} comes after the 32 hand-offs' \
             (counter {before} before the release)"
        );
    }
}

/// A process's waiting call never waits behind its own waiters of another primitive on the same
/// name: with the mutex `k` held by another client and a task of this client waiting for it,
/// this client's semaphore and read-write lock on `k` (other locks) enter at once. Before, each
/// of them waited out its whole wait (2 s) behind the local waiter and then said "held by
/// another owner". A semaphore family of a larger limit waits its turn behind a queued waiter
/// of a smaller one (the arrival order across limits), and enters right after it, not at the
/// end of its wait: with 1 of the semaphore `s`'s holders in another client and a task of this
/// client queued for a 1-holder family's turn, this client's 4-holder family enters once that
/// holder leaves. (Before the arrival order held across limits, the 4-holder family entered at
/// once, and a 1-holder waiter could be passed for its whole wait.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_does_not_wait_behind_local_waiters_of_other_locks() {
    for kind in ServerKind::ALL {
        let name = kind.name();
        let server = harness::shared(kind);
        let ns = ns("local-line", kind);
        let options = || {
            LockOptions::new()
                .namespace(ns.as_str())
                .lease(Duration::from_secs(5))
        };
        let other = connect(&server.url()).await;
        let this = connect(&server.url()).await;
        let (release, held) = hold(&locks(&other, &ns), "k").await;
        let waiting = wait_for(&locks(&this, &ns), "k", Duration::from_secs(10));
        until_queued(server.port(), &ns, "k", 1).await;
        let start = Instant::now();
        let permits = this
            .semaphore_with::<str>(4, options())
            .expect("options")
            .acquire("k", Duration::from_secs(2), async { start.elapsed() })
            .await;
        let read = rw_locks(&this, &ns)
            .read("k", Duration::from_secs(2), async { start.elapsed() })
            .await;
        println!("{name}: semaphore {permits:?}, read {read:?}");
        assert!(
            permits.is_ok_and(|at| at < Duration::from_secs(1)),
            "{name}: the semaphore on k waited for the mutex's local waiter"
        );
        assert!(
            read.is_ok_and(|at| at < Duration::from_secs(1)),
            "{name}: the read lock on k waited for the mutex's local waiter"
        );
        release.send(()).expect("release");
        held.await.expect("holder");
        waiting.await.expect("the mutex waiter");

        let (release, held) = hold_queued(
            &Queued::Permit(other.semaphore_with(4, options()).expect("options")),
            "s",
        )
        .await;
        let one = semaphore(&this, &ns);
        let waiting = tokio::spawn(async move {
            one.acquire("s", Duration::from_secs(10), async {})
                .await
                .expect("the 1-holder waiter")
        });
        let start = Instant::now();
        while sem_queue_len(server.port(), &ns, "s") < 1 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{name}: never queued"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let start = Instant::now();
        let four = this.semaphore_with::<str>(4, options()).expect("options");
        let four = tokio::spawn(async move {
            four.acquire("s", Duration::from_secs(5), async { start.elapsed() })
                .await
        });
        tokio::time::sleep(Duration::from_millis(400)).await;
        release.send(()).expect("release");
        held.await.expect("holder");
        waiting.await.expect("the 1-holder waiter");
        let four = four.await.expect("the 4-holder task");
        println!("{name}: 4-holder semaphore {four:?} (the holder left at 400 ms)");
        let at = four.unwrap_or_else(|error| panic!("{name}: the 4-holder family: {error}"));
        assert!(
            at >= Duration::from_millis(350),
            "{name}: the 4-holder family passed the queued 1-holder waiter ({at:?})"
        );
        assert!(
            at < Duration::from_millis(2_500),
            "{name}: the 4-holder family entered {at:?} in, long after the holder left (400 ms)"
        );
    }
}

/// Families of different `permits` on one key keep the arrival order: a `permits = 1` waiter at
/// the head of the queue is not passed by `permits = 3` callers (in another client) that keep
/// two holders in, so it gets in once the holders drop, well within its wait. Before, "free"
/// was counted against each caller's own limit: the larger family kept getting in past it, and
/// it waited out its whole wait (helper 32: 5 s, while the others entered 138 times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smaller_limit_waiter_is_not_passed_by_a_larger_limit_family() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let ns = ns("sem-mixed", kind);
        let (big_client, small_client) =
            (connect(&server.url()).await, connect(&server.url()).await);
        let options = || {
            LockOptions::new()
                .namespace(ns.as_str())
                .lease(Duration::from_secs(5))
        };
        let big: sage_lock::Semaphores<str> =
            big_client.semaphore_with(3, options()).expect("options");
        let small: sage_lock::Semaphores<str> =
            small_client.semaphore_with(1, options()).expect("options");
        // Two tasks of the larger family, in and out of the key for 4 s: two holders most of
        // the time, at least one all of the time.
        let until = Instant::now() + Duration::from_secs(4);
        let loops: Vec<_> = (0..2)
            .map(|i| {
                let big = big.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(50 * i)).await;
                    let mut entered = 0_u32;
                    while Instant::now() < until {
                        if big
                            .acquire("k", Duration::from_secs(5), async {
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            })
                            .await
                            .is_ok()
                        {
                            entered += 1;
                        }
                    }
                    entered
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let asked = Instant::now();
        let small_entered = small
            .acquire("k", Duration::from_millis(2_500), async { asked.elapsed() })
            .await;
        let mut big_entered = 0;
        for task in loops {
            big_entered += task.await.expect("big family task");
        }
        println!(
            "{}: the permits = 1 waiter: {small_entered:?}; the permits = 3 callers entered \
             {big_entered} times",
            kind.name()
        );
        let waited = small_entered.unwrap_or_else(|error| {
            panic!(
                "{}: the permits = 1 waiter was passed for its whole wait ({big_entered} \
                 entries of the larger family): {error}",
                kind.name()
            )
        });
        assert!(
            waited < Duration::from_millis(1_500),
            "{}: the permits = 1 waiter got in only after {waited:?}",
            kind.name()
        );
        big_client.quit().await;
        small_client.quit().await;
    }
}
