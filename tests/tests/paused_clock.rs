//! Defect 11 of issue 8, second half: lease arithmetic follows the real clock, not tokio's
//! clock, which a test can pause or advance while the server's time runs on.
//!
//! fred's own timers do not work under a paused clock (connecting times out at once, see
//! `connecting_under_a_paused_clock_fails_clearly`), so these tests pause it only once the
//! lock is held, the way a test of a lock body would.

use std::time::Duration;

use harness::ServerKind;
use sage_lock::{LockClient, LockError, LockOptions, Locks};

/// A body that pauses tokio's clock and then blocks past its lease (real time passes, tokio's
/// clock does not) sees its lease as spent: the server has expired the key by then.
#[tokio::test(flavor = "current_thread")]
async fn a_paused_clock_does_not_stretch_the_lease() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let lease = Duration::from_millis(300);
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("paused-clock").lease(lease))
            .expect("options");
        let seen = locks
            .with_lock("k", Duration::from_secs(5), async {
                let lease = sage_lock::current_lease().expect("in a lock body");
                let before = lease.remaining();
                tokio::time::pause();
                std::thread::sleep(Duration::from_millis(500));
                let after = (lease.remaining(), lease.is_valid());
                tokio::time::resume();
                (before, after)
            })
            .await;
        println!("{}: {seen:?}", kind.name());
        let (before, (after, valid)) = match seen {
            Ok(seen) => seen,
            // The safety net may cancel the body once the clock runs again: the lease is gone.
            Err(LockError::LockLost { .. }) => continue,
            Err(error) => panic!("{}: {error}", kind.name()),
        };
        assert!(
            before > Duration::from_millis(200),
            "{}: {before:?}",
            kind.name()
        );
        assert_eq!(
            after,
            Duration::ZERO,
            "{}: ran out in real time",
            kind.name()
        );
        assert!(!valid, "{}", kind.name());
        client.quit().await;
    }
}

/// A paused tokio clock that jumps ahead (auto-advance to a far timer) while the lock is held
/// does not make the lease look spent: the real clock says it is still valid, and the body
/// finishes under the lock.
#[tokio::test(flavor = "current_thread")]
async fn an_advanced_clock_does_not_cut_the_lease_short() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks: Locks<str> = client
            .lock_with(
                LockOptions::new()
                    .namespace("advanced-clock")
                    .lease(Duration::from_secs(30)),
            )
            .expect("options");
        let seen = locks
            .with_lock("k", Duration::from_secs(5), async {
                let lease = sage_lock::current_lease().expect("in a lock body");
                tokio::time::pause();
                tokio::time::advance(Duration::from_secs(60)).await;
                let seen = (lease.remaining(), lease.is_valid());
                tokio::time::resume();
                seen
            })
            .await;
        println!("{}: {seen:?}", kind.name());
        let (remaining, valid) = seen.expect("the body ran to its end under the lock");
        assert!(
            remaining > Duration::from_secs(25),
            "{}: {remaining:?}",
            kind.name()
        );
        assert!(valid, "{}", kind.name());
        client.quit().await;
    }
}

/// Connecting under a paused clock gives a clear error instead of hanging (fred's timers
/// auto-advance): the limit is fred's, and the README says so.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn connecting_under_a_paused_clock_fails_clearly() {
    let server = harness::shared(ServerKind::Redis);
    match LockClient::connect(&server.url()).await {
        Err(LockError::Backend { context, .. }) => {
            assert!(context.contains("could not connect"), "{context}");
        }
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => println!("connected under a paused clock (fred no longer times out)"),
    }
}
