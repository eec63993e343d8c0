//! What a timed-out acquisition logs when the server does not answer: one test per binary,
//! since the clean-up it concerns runs on a task of its own, which only a global subscriber
//! sees.

use std::time::Duration;

use harness::{Captured, Server, ServerKind};
use sage_lock::{LockClient, LockError, LockOptions, TimeoutReason};

/// A call whose attempts got no answer (the server stopped with `SIGSTOP`, or killed) times out
/// with `Unavailable`, and the clean-up of its last attempt gets no answer either. That is no
/// hold's release: nothing at `WARN` may say "release not answered" or "release failed" (it
/// did, for a call that never held the lock: helper 23). What the clean-up could not undo is
/// said below `WARN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_acquisition_warns_about_no_release() {
    let captured = Captured::global_warn();
    for kind in ServerKind::ALL {
        for fault in ["paused", "killed"] {
            let server = Server::start(kind);
            let client = LockClient::builder()
                .url(&server.url())
                .command_timeout(Duration::from_secs(1))
                .connect()
                .await
                .expect("connect");
            let locks = client
                .lock_with::<str>(LockOptions::new().namespace("abandon-logs"))
                .expect("options");
            if fault == "paused" {
                server.pause();
            } else {
                server.kill();
            }
            let result = locks
                .with_lock("k", Duration::from_millis(500), async {})
                .await;
            assert!(
                matches!(
                    &result,
                    Err(LockError::TimedOut {
                        reason: TimeoutReason::Unavailable(_),
                        ..
                    })
                ),
                "{} {fault}: {result:?}",
                kind.name()
            );
            // The clean-up's own bound (1 s) runs out in the background.
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            if fault == "paused" {
                server.resume();
            }
            client.quit().await;
        }
    }
    let logs = captured.text();
    println!("{logs}");
    assert!(
        !logs.contains("release"),
        "warnings about the release of a lock never held:\n{logs}"
    );
}
