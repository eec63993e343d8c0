//! The minimum hold (`hold_at_least`) on standalone Redis and Valkey: a body that ends sooner
//! leaves the key held, by its token, until the minimum has passed since acquisition; a longer
//! body releases at once; cancellation keeps the minimum, a loss does not; `#[locked]` sets it.

mod common;

use std::time::{Duration, Instant};

use common::{Target, raw_del, raw_exists, raw_pttl};
use harness::ServerKind;
use sage_lock::{LockClient, LockError, LockOptions, Locks, locked};

fn family(client: &LockClient, target: &Target, test: &str, hold: Duration) -> Locks<str> {
    client
        .lock_with::<str>(
            LockOptions::new()
                .namespace(target.ns(test))
                .lease(Duration::from_secs(2))
                .hold_at_least(hold),
        )
        .expect("valid options")
}

/// A quick body leaves the key held for the rest of the minimum; then it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quick_body_keeps_the_key_for_the_minimum() {
    for kind in ServerKind::ALL {
        let target = Target::standalone(kind);
        let client = target.client().await;
        let locks = family(&client, &target, "min-hold", Duration::from_millis(1500));
        let server_key = LockClient::server_key(locks.namespace(), "job");
        let started = Instant::now();
        let ran = locks.try_with_lock("job", async { 7 }).await.expect("try");
        assert_eq!(ran, Some(7));
        let pttl = raw_pttl(&client, &server_key).await;
        let left = 1500 - i64::try_from(started.elapsed().as_millis()).expect("ms");
        assert!(
            pttl > 0 && pttl <= 1500 && pttl >= left - 200,
            "{}: PTTL {pttl} ms, expected about {left} ms",
            kind.name()
        );
        assert_eq!(
            locks.try_with_lock("job", async {}).await.expect("try"),
            None,
            "{}: another run within the minimum hold",
            kind.name()
        );
        tokio::time::sleep(Duration::from_millis(1500).saturating_sub(started.elapsed())).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!raw_exists(&client, &server_key).await, "{}", kind.name());
        assert_eq!(
            locks.try_with_lock("job", async { 8 }).await.expect("try"),
            Some(8),
            "{}: free again after the minimum hold",
            kind.name()
        );
    }
}

/// A body longer than the minimum releases at once; zero means off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_body_or_zero_releases_at_once() {
    for kind in ServerKind::ALL {
        let target = Target::standalone(kind);
        let client = target.client().await;
        for (hold, body) in [
            (Duration::from_millis(100), Duration::from_millis(300)),
            (Duration::ZERO, Duration::ZERO),
        ] {
            let locks = family(&client, &target, "min-hold-long", hold);
            let server_key = LockClient::server_key(locks.namespace(), "job");
            locks
                .with_lock("job", Duration::from_secs(1), tokio::time::sleep(body))
                .await
                .expect("lock");
            assert!(
                !raw_exists(&client, &server_key).await,
                "{}: hold {hold:?}, body {body:?}: key kept",
                kind.name()
            );
        }
    }
}

/// A minimum longer than the lease is honoured: the key's TTL is the remainder (renewal does not
/// need to run for it), past the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_longer_than_the_lease() {
    for kind in ServerKind::ALL {
        let target = Target::standalone(kind);
        let client = target.client().await;
        let locks = client
            .lock_with::<str>(
                LockOptions::new()
                    .namespace(target.ns("min-hold-past-lease"))
                    .lease(Duration::from_millis(500))
                    .hold_at_least(Duration::from_secs(3)),
            )
            .expect("valid options");
        let server_key = LockClient::server_key(locks.namespace(), "job");
        locks.try_with_lock("job", async {}).await.expect("try");
        let pttl = raw_pttl(&client, &server_key).await;
        assert!(
            pttl > 2000 && pttl <= 3000,
            "{}: PTTL {pttl} ms",
            kind.name()
        );
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(
            locks.try_with_lock("job", async {}).await.expect("try"),
            None,
            "{}: held past the lease",
            kind.name()
        );
    }
}

/// Cancelled mid-body (the future dropped), the call still keeps the minimum hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_keeps_the_minimum() {
    for kind in ServerKind::ALL {
        let target = Target::standalone(kind);
        let client = target.client().await;
        let locks = family(&client, &target, "min-hold-cancel", Duration::from_secs(2));
        let server_key = LockClient::server_key(locks.namespace(), "job");
        let cancelled = tokio::time::timeout(
            Duration::from_millis(200),
            locks.with_lock("job", Duration::from_secs(1), std::future::pending::<()>()),
        )
        .await;
        assert!(cancelled.is_err());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pttl = raw_pttl(&client, &server_key).await;
        assert!(
            pttl > 1000 && pttl <= 2000,
            "{}: PTTL {pttl} ms after cancellation",
            kind.name()
        );
    }
}

/// A lost lock gets no minimum hold: the key stays free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_keeps_no_minimum() {
    for kind in ServerKind::ALL {
        let target = Target::standalone(kind);
        let client = target.client().await;
        let locks = client
            .lock_with::<str>(
                LockOptions::new()
                    .namespace(target.ns("min-hold-loss"))
                    .lease(Duration::from_millis(300))
                    .hold_at_least(Duration::from_secs(10)),
            )
            .expect("valid options");
        let server_key = LockClient::server_key(locks.namespace(), "job");
        let result = locks
            .with_lock("job", Duration::from_secs(1), async {
                raw_del(&client, &server_key).await;
                tokio::time::sleep(Duration::from_secs(2)).await;
            })
            .await;
        assert!(
            matches!(result, Err(LockError::LockLost { .. })),
            "{}: {result:?}",
            kind.name()
        );
        assert!(!raw_exists(&client, &server_key).await, "{}", kind.name());
        assert_eq!(
            locks.try_with_lock("job", async { 1 }).await.expect("try"),
            Some(1),
            "{}",
            kind.name()
        );
    }
}

/// A minimum hold past a year is refused, naming the option.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absurd_minimum_is_refused() {
    let client = Target::standalone(ServerKind::Redis).client().await;
    let refused = client
        .lock_with::<str>(LockOptions::new().hold_at_least(Duration::from_secs(400 * 24 * 3600)));
    assert!(matches!(
        refused,
        Err(LockError::InvalidArgument {
            argument: "hold_at_least",
            ..
        })
    ));
}

#[derive(Debug)]
struct JobError(#[allow(dead_code)] LockError);

impl From<LockError> for JobError {
    fn from(error: LockError) -> Self {
        JobError(error)
    }
}

#[locked(key = "report", try_lock, hold_at_least = "1s", namespace = "min-hold-macro", client = client)]
async fn report(client: &LockClient, run: u32) -> Result<Option<u32>, JobError> {
    Ok(run)
}

/// `#[locked(try_lock, hold_at_least = "1s")]`: one run per second however often it is called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locked_sets_the_minimum() {
    for kind in ServerKind::ALL {
        let client = Target::standalone(kind).client().await;
        raw_del(&client, &LockClient::server_key("min-hold-macro", "report")).await;
        assert_eq!(report(&client, 1).await.expect("first"), Some(1));
        assert_eq!(report(&client, 2).await.expect("second"), None);
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(report(&client, 3).await.expect("third"), Some(3));
        raw_del(&client, &LockClient::server_key("min-hold-macro", "report")).await;
    }
}
