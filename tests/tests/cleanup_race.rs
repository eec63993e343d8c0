//! A failed acquisition attempt's cleanup must not release the retry's grant (found by the chaos
//! suite: `--topology replicated --server redis --seed 3` under load, an unexplained overlap right
//! after `CLIENT KILL`).
//!
//! A replica-acknowledged attempt that fails (here: its connection is killed while `WAIT`
//! blocks) sends its cleanup release (same token) on its own connection, after the attempt. The
//! engine retries with the same token on another connection at once; the release used to go out
//! only once fred had reconnected the old connection, after the retry had been granted, and
//! deleted the new grant: the holder ran without its key (10 of 10 rounds on Redis before the
//! fix), free for anyone else to take.

use std::time::{Duration, Instant};

use harness::{Replicated, ServerKind};
use sage_lock::{LockClient, LockOptions, Locks};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempt_cleanup_does_not_release_the_retry() {
    for kind in ServerKind::ALL {
        let setup = Replicated::start(kind, 1);
        let client = LockClient::builder()
            .url(&setup.primary_url())
            .replicated(true)
            .connect()
            .await
            .expect("connect");
        let locks: Locks<str> = client
            .lock_with(
                LockOptions::new()
                    .namespace("race")
                    .lease(Duration::from_secs(5)),
            )
            .expect("opts");
        let key = LockClient::server_key("race", "k");
        let key = String::from_utf8_lossy(&key).into_owned();
        let primary = setup.primary.port();
        let key_is_there = || {
            harness::cmd(primary, &["GET", &key])
                .ok()
                .map(|reply| !reply.is_nil())
        };
        let control = locks
            .with_lock("k", Duration::from_secs(5), async { key_is_there() })
            .await;
        assert_eq!(control.ok(), Some(Some(true)), "{kind}: the key is there");
        let replica = &setup.replicas[0];
        for round in 0..10 {
            // WAIT blocks (paused replica) until the connection is killed; then the replica
            // is back and the retry is granted at once.
            replica.pause();
            let killer = async {
                tokio::time::sleep(Duration::from_millis(150)).await;
                let kill = ["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"];
                let _ = harness::cmd(primary, &kill);
                replica.resume();
            };
            let started = Instant::now();
            let locked = locks.with_lock("k", Duration::from_secs(5), async {
                let granted = started.elapsed();
                // Longer than the release's way back through a reconnect.
                tokio::time::sleep(Duration::from_millis(300)).await;
                (granted, key_is_there())
            });
            let ((), result) = tokio::join!(killer, locked);
            println!("{kind} round {round}: {result:?}");
            let (granted, there) = result.unwrap_or_else(|e| panic!("{kind} round {round}: {e}"));
            assert_eq!(
                there,
                Some(true),
                "{kind} round {round}: the lock key vanished under its holder (granted after \
                 {granted:?})"
            );
        }
    }
}
