//! Opt-in reentrancy on standalone Redis and Valkey: a reentrant call for a key the task holds
//! runs at once under the held lease (same fencing token, nothing released), nested `#[locked]`
//! functions included; tasks spawned in the body, other keys, namespaces and clients do not
//! share the hold.

mod common;

use std::time::Duration;

use common::{Target, raw_exists};
use harness::ServerKind;
use sage_lock::{LockClient, LockError, LockOptions, Locks, TimeoutReason, current_lease, locked};

fn reentrant(client: &LockClient, namespace: &str) -> Locks<str> {
    client
        .lock_with::<str>(
            LockOptions::new()
                .namespace(namespace)
                .lease(Duration::from_secs(5))
                .reentrant(true),
        )
        .expect("valid options")
}

fn token() -> u64 {
    current_lease().expect("inside a lock body").fencing_token()
}

/// Nested `with_lock` and `try_with_lock` run at once with the outer fencing token; the key is
/// still held (by the outer call) after they return, and released when the outer call ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_calls_run_under_the_outer_lease() {
    for kind in ServerKind::ALL {
        let target = Target::standalone(kind);
        let client = target.client().await;
        let ns = target.ns("reentrant-nested");
        let locks = reentrant(&client, &ns);
        let server_key = LockClient::server_key(&ns, "a");
        let (outer, inner, innermost, still_held) = locks
            .with_lock("a", Duration::from_secs(1), async {
                let outer = token();
                let (inner, innermost) = locks
                    .with_lock("a", Duration::from_millis(300), async {
                        let innermost = locks
                            .try_with_lock("a", async { token() })
                            .await
                            .expect("nested try");
                        (token(), innermost)
                    })
                    .await
                    .expect("nested wait");
                let still_held = raw_exists(&client, &server_key).await
                    && current_lease().is_some_and(|lease| lease.is_valid());
                (outer, inner, innermost, still_held)
            })
            .await
            .expect("outer");
        assert_eq!(inner, outer, "{}", kind.name());
        assert_eq!(innermost, Some(outer), "{}", kind.name());
        assert!(still_held, "{}: the inner call released", kind.name());
        assert!(!raw_exists(&client, &server_key).await, "{}", kind.name());
    }
}

/// A task spawned inside the body does not hold the lock: its reentrant calls wait and time out
/// (or, trying, find it busy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_tasks_do_not_inherit_the_lock() {
    for kind in ServerKind::ALL {
        let target = Target::standalone(kind);
        let client = target.client().await;
        let locks = reentrant(&client, &target.ns("reentrant-spawn"));
        let (tried, waited) = locks
            .with_lock("a", Duration::from_secs(1), async {
                let spawned = locks.clone();
                tokio::spawn(async move {
                    let tried = spawned.try_with_lock("a", async {}).await;
                    let waited = spawned
                        .with_lock("a", Duration::from_millis(300), async {})
                        .await;
                    (tried, waited)
                })
                .await
                .expect("spawned task")
            })
            .await
            .expect("outer");
        assert!(matches!(tried, Ok(None)), "{}: {tried:?}", kind.name());
        assert!(
            matches!(
                waited,
                Err(LockError::TimedOut {
                    reason: TimeoutReason::Busy,
                    ..
                })
            ),
            "{}: {waited:?}",
            kind.name()
        );
    }
}

/// Other keys are acquired (and released) as usual inside a held lock; a reentrant call on the
/// outer key from inside them still runs at once, under the outer key's lease. Another namespace
/// or another client does not share the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_keys_namespaces_and_clients() {
    for kind in ServerKind::ALL {
        let target = Target::standalone(kind);
        let client = target.client().await;
        let other_client = target.client().await;
        let ns = target.ns("reentrant-mixed");
        let locks = reentrant(&client, &ns);
        let same_ns_other_client = reentrant(&other_client, &ns);
        let other_ns = reentrant(&client, &target.ns("reentrant-mixed-other"));
        let key_b = LockClient::server_key(&ns, "b");
        let seen = locks
            .with_lock("a", Duration::from_secs(1), async {
                let a = current_lease().expect("a");
                let (b_key, a_again) = locks
                    .with_lock("b", Duration::from_secs(1), async {
                        let b_key = current_lease().expect("b").key().to_owned();
                        let a_again = locks
                            .try_with_lock("a", async { current_lease().expect("a again") })
                            .await
                            .expect("a again");
                        (b_key, a_again)
                    })
                    .await
                    .expect("b");
                let b_released = !raw_exists(&client, &key_b).await;
                let other_ns_key = other_ns
                    .try_with_lock("a", async {
                        current_lease().expect("other ns").namespace().to_owned()
                    })
                    .await
                    .expect("other namespace");
                let other_client = same_ns_other_client
                    .try_with_lock("a", async {})
                    .await
                    .expect("other client");
                (a, b_key, a_again, b_released, other_ns_key, other_client)
            })
            .await
            .expect("outer");
        let (a, b_key, a_again, b_released, other_ns_key, other_client) = seen;
        let name = kind.name();
        assert_eq!(b_key, "b", "{name}");
        let a_again = a_again.expect("reentrant a inside b runs");
        assert_eq!(a_again.key(), "a", "{name}");
        assert_eq!(a_again.fencing_token(), a.fencing_token(), "{name}");
        assert!(b_released, "{name}: b was not released when its call ended");
        let other_ns_key = other_ns_key.expect("another namespace is another lock");
        assert_ne!(other_ns_key, ns, "{name}");
        assert!(other_ns_key.starts_with("reentrant-mixed-other"), "{name}");
        assert_eq!(other_client, None, "{name}: another client shared the hold");
    }
}

/// Without the option a nested call times out (at once: `HeldByThisTask`, see
/// `a_wait_for_a_lock_this_task_holds_fails_at_once`), even under a reentrant outer call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_reentrant_calls_reenter() {
    for kind in ServerKind::ALL {
        let target = Target::standalone(kind);
        let client = target.client().await;
        let ns = target.ns("reentrant-opt-in");
        let outer = reentrant(&client, &ns);
        let plain = client
            .lock_with::<str>(LockOptions::new().namespace(ns.as_str()))
            .expect("valid options");
        let nested = outer
            .with_lock("a", Duration::from_secs(1), async {
                plain
                    .with_lock("a", Duration::from_millis(300), async {})
                    .await
            })
            .await
            .expect("outer");
        assert!(
            matches!(nested, Err(LockError::TimedOut { .. })),
            "{}: {nested:?}",
            kind.name()
        );
    }
}

/// A waiting call for a lock its own task holds (not reentrant) could only time out: the hold
/// lasts until the body, which awaits the call, ends. It fails at once, saying so, instead of
/// waiting the whole wait and then blaming "another owner". It waited (5 s here) and said
/// "held by another owner for the whole wait". A try still finds the lock busy. The same for a
/// nested write; a nested read or semaphore acquire still enters (holders share).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_lock_this_task_holds_fails_at_once() {
    for kind in ServerKind::ALL {
        let target = Target::standalone(kind);
        let client = target.client().await;
        let plain = client
            .lock_with::<str>(LockOptions::new().namespace(target.ns("held-by-this-task")))
            .expect("valid options");
        let (nested, took, tried) = plain
            .with_lock("a", Duration::from_secs(1), async {
                let start = std::time::Instant::now();
                let nested = plain.with_lock("a", Duration::from_secs(5), async {}).await;
                let took = start.elapsed();
                let tried = plain.try_with_lock("a", async {}).await;
                (nested, took, tried)
            })
            .await
            .expect("outer");
        let name = kind.name();
        println!("{name}: {nested:?} after {took:?}");
        let message = nested
            .as_ref()
            .err()
            .map(ToString::to_string)
            .unwrap_or_default();
        assert!(
            matches!(
                nested,
                Err(LockError::TimedOut {
                    reason: TimeoutReason::HeldByThisTask,
                    ..
                })
            ) && message.contains("this task already holds it")
                && message.contains("reentrant"),
            "{name}: {nested:?}"
        );
        assert!(took < Duration::from_secs(1), "{name}: it waited {took:?}");
        assert!(matches!(tried, Ok(None)), "{name}: try: {tried:?}");

        // The same for a writer; readers and a semaphore's holders share, so theirs still
        // enter.
        let rw = client
            .rw_lock_with::<str>(LockOptions::new().namespace(target.ns("held-by-this-task-rw")))
            .expect("valid options");
        let write_in_write = rw
            .write("w", Duration::from_secs(1), async {
                rw.write("w", Duration::from_secs(5), async {}).await
            })
            .await
            .expect("outer write");
        assert!(
            matches!(
                write_in_write,
                Err(LockError::TimedOut {
                    reason: TimeoutReason::HeldByThisTask,
                    ..
                })
            ),
            "{name}: write in write: {write_in_write:?}"
        );
        let read_in_read = rw
            .read("r", Duration::from_secs(1), async {
                rw.read("r", Duration::from_secs(1), async { 7 }).await
            })
            .await
            .expect("outer read");
        assert!(
            matches!(read_in_read, Ok(7)),
            "{name}: read in read: {read_in_read:?}"
        );
        let two = client
            .semaphore_with::<str>(
                2,
                LockOptions::new().namespace(target.ns("held-by-this-task-sem")),
            )
            .expect("valid options");
        let permit_in_permit = two
            .acquire("s", Duration::from_secs(1), async {
                two.acquire("s", Duration::from_secs(1), async { 8 }).await
            })
            .await
            .expect("outer permit");
        assert!(
            matches!(permit_in_permit, Ok(8)),
            "{name}: permit in permit: {permit_in_permit:?}"
        );
        // A semaphore of one holder keeps its own holder out, as a mutex does: at once.
        let one = client
            .semaphore_with::<str>(
                1,
                LockOptions::new().namespace(target.ns("held-by-this-task-sem1")),
            )
            .expect("valid options");
        let start = std::time::Instant::now();
        let permit_in_only_permit = one
            .acquire("s", Duration::from_secs(1), async {
                one.acquire("s", Duration::from_secs(5), async {}).await
            })
            .await
            .expect("outer permit");
        let took = start.elapsed();
        assert!(
            held_by_this_task(&permit_in_only_permit, "s") && took < Duration::from_secs(1),
            "{name}: permit in the only permit: {permit_in_only_permit:?} after {took:?}"
        );

        // A write nested in the task's own read (its read keeps the writer out) and a read
        // nested in its own write (the write keeps readers out) could only time out too.
        let start = std::time::Instant::now();
        let write_in_read = rw
            .read("x", Duration::from_secs(1), async {
                rw.write("x", Duration::from_secs(5), async {}).await
            })
            .await
            .expect("outer read");
        let read_in_write = rw
            .write("y", Duration::from_secs(1), async {
                rw.read("y", Duration::from_secs(5), async {}).await
            })
            .await
            .expect("outer write");
        let took = start.elapsed();
        for (what, nested) in [
            ("write in read", &write_in_read),
            ("read in write", &read_in_write),
        ] {
            assert!(
                matches!(
                    nested,
                    Err(LockError::TimedOut {
                        reason: TimeoutReason::HeldByThisTask,
                        ..
                    })
                ),
                "{name}: {what}: {nested:?} after {took:?}"
            );
        }
        assert!(
            took < Duration::from_secs(2),
            "{name}: they waited {took:?}"
        );
    }
}

/// Whether `result` is the at-once `TimedOut(HeldByThisTask)` naming `key`.
fn held_by_this_task<T>(result: &Result<T, LockError>, key: &str) -> bool {
    matches!(
        result,
        Err(LockError::TimedOut {
            reason: TimeoutReason::HeldByThisTask,
            key: named,
            ..
        }) if named == key
    )
}

/// A multi-key hold is the task's hold of each of its keys. Nested in `with_locks(["a", "b"])`,
/// a waiting `with_lock("b")` fails at once (`HeldByThisTask`), so does an overlapping
/// `with_locks`, and so does a `with_locks` that takes a key nested in the task's own
/// `with_lock` of it; a try finds the key busy. A reentrant `with_lock("b")` runs at once under
/// the hold, with b's key and fencing token. Before, the waiting calls waited out their whole
/// wait (5 s here) and then said "held by another owner", and the reentrant one did too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_nested_in_this_tasks_multi_key_hold() {
    for kind in ServerKind::ALL {
        let target = Target::standalone(kind);
        let client = target.client().await;
        let name = kind.name();
        let plain = client
            .lock_with::<str>(LockOptions::new().namespace(target.ns("held-by-this-task-multi")))
            .expect("valid options");
        let start = std::time::Instant::now();
        let (single, several, tried) = plain
            .with_locks(&["a", "b"], Duration::from_secs(1), async {
                let single = plain.with_lock("b", Duration::from_secs(5), async {}).await;
                let several = plain
                    .with_locks(&["c", "a"], Duration::from_secs(5), async {})
                    .await;
                let tried = plain.try_with_lock("b", async {}).await;
                (single, several, tried)
            })
            .await
            .expect("outer with_locks");
        let several_in_single = plain
            .with_lock("d", Duration::from_secs(1), async {
                plain
                    .with_locks(&["e", "d"], Duration::from_secs(5), async {})
                    .await
            })
            .await
            .expect("outer with_lock");
        let took = start.elapsed();
        println!("{name}: {single:?}, {several:?}, {several_in_single:?} in {took:?}");
        assert!(held_by_this_task(&single, "b"), "{name}: {single:?}");
        assert!(held_by_this_task(&several, "a"), "{name}: {several:?}");
        assert!(
            held_by_this_task(&several_in_single, "d"),
            "{name}: {several_in_single:?}"
        );
        assert!(matches!(tried, Ok(None)), "{name}: try: {tried:?}");
        assert!(
            took < Duration::from_secs(3),
            "{name}: they waited {took:?}"
        );

        let locks = reentrant(&client, &target.ns("reentrant-multi"));
        let (outer_b, inner) = locks
            .with_locks(&["a", "b"], Duration::from_secs(1), async {
                let outer_b = current_lease()
                    .and_then(|lease| lease.fencing_token_of("b"))
                    .expect("b's token");
                let inner = locks
                    .with_lock("b", Duration::from_millis(300), async {
                        current_lease().map(|lease| (lease.key().to_owned(), lease.fencing_token()))
                    })
                    .await;
                (outer_b, inner)
            })
            .await
            .expect("outer reentrant with_locks");
        let inner = inner.expect("the reentrant call runs at once");
        assert_eq!(inner, Some(("b".to_owned(), outer_b)), "{name}");
    }
}

#[derive(Debug)]
struct AppError(#[allow(dead_code)] LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[locked(key = "account:{id}", wait = "1s", reentrant, namespace = "reentrant-macro", client = client)]
async fn transfer(client: &LockClient, id: u64) -> Result<(u64, u64, Option<u64>), AppError> {
    let outer = token();
    let inner = audit(client, id).await?;
    let tried = try_audit(client, id).await?;
    Ok((outer, inner, tried))
}

#[locked(key = "account:{id}", wait = "300ms", reentrant, namespace = "reentrant-macro", client = client)]
async fn audit(client: &LockClient, id: u64) -> Result<u64, AppError> {
    Ok(token())
}

#[locked(key = "account:{id}", try_lock, reentrant, namespace = "reentrant-macro", client = client)]
async fn try_audit(client: &LockClient, id: u64) -> Result<Option<u64>, AppError> {
    Ok(token())
}

/// Nested `#[locked(reentrant)]` functions share the outer lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_locked_functions() {
    for kind in ServerKind::ALL {
        let client = Target::standalone(kind).client().await;
        let id = u64::from(rand::random::<u32>());
        let (outer, inner, tried) = transfer(&client, id).await.expect("transfer");
        assert_eq!(inner, outer, "{}", kind.name());
        assert_eq!(tried, Some(outer), "{}", kind.name());
        assert!(
            !raw_exists(
                &client,
                &LockClient::server_key("reentrant-macro", &format!("account:{id}"))
            )
            .await,
            "{}",
            kind.name()
        );
    }
}

/// A read nested in the task's own read (not reentrant) shares the key, but waits behind a
/// writer queued meanwhile, which waits for the task's own read: the nested read can only time
/// out. Its error says so and names the fix, instead of "held by another owner" (helper 25 and
/// helper 27). The same for a permit nested in the task's own permit behind a queued waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_shared_hold_stuck_behind_its_own_hold_says_so() {
    for kind in ServerKind::ALL {
        let target = Target::standalone(kind);
        let (client, other) = (target.client().await, target.client().await);
        let name = kind.name();
        for primitive in ["read", "permit"] {
            let ns = target.ns(&format!("nested-behind-own-{primitive}"));
            let options = || LockOptions::new().namespace(ns.as_str());
            let rw = client.rw_lock_with::<str>(options()).expect("options");
            let other_rw = other.rw_lock_with::<str>(options()).expect("options");
            let permits = client.semaphore_with::<str>(2, options()).expect("options");
            let other_permits = other.semaphore_with::<str>(2, options()).expect("options");
            let nested = async {
                // Another owner queues behind this task's hold (and fills the second permit).
                let queued = {
                    let (other_rw, other_permits) = (other_rw.clone(), other_permits.clone());
                    tokio::spawn(async move {
                        let wait = Duration::from_secs(10);
                        if primitive == "read" {
                            other_rw.write("k", wait, async {}).await
                        } else {
                            let second = other_permits.acquire("k", wait, async {
                                tokio::time::sleep(Duration::from_secs(3)).await;
                            });
                            let third = async {
                                tokio::time::sleep(Duration::from_millis(100)).await;
                                other_permits.acquire("k", wait, async {}).await
                            };
                            let (second, third) = tokio::join!(second, third);
                            second.and(third)
                        }
                    })
                };
                tokio::time::sleep(Duration::from_millis(400)).await;
                let wait = Duration::from_millis(800);
                let nested = if primitive == "read" {
                    rw.read("k", wait, async {}).await
                } else {
                    permits.acquire("k", wait, async {}).await
                };
                (nested, queued)
            };
            let (nested, queued) = if primitive == "read" {
                rw.read("k", Duration::from_secs(1), nested).await
            } else {
                permits.acquire("k", Duration::from_secs(1), nested).await
            }
            .expect("the outer hold");
            queued
                .await
                .expect("task")
                .unwrap_or_else(|e| panic!("{name} {primitive}: the other owner: {e}"));
            let message = nested
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default();
            println!("{name} {primitive}: {message}");
            assert!(
                matches!(nested, Err(LockError::TimedOut { ref reason, .. })
                    if *reason != TimeoutReason::Busy)
                    && message.contains("this task itself holds")
                    && message.contains("reentrant(true)"),
                "{name} {primitive}: {nested:?}"
            );
        }
    }
}
