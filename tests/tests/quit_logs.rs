//! What `quit()` logs: one test per binary, since the releases it concerns run on tasks of
//! their own, which only a global subscriber sees.

use std::time::Duration;

use harness::{Captured, ServerKind};
use sage_lock::{LockClient, LockError, LockOptions, LossReason};

/// `quit()` while 20 tasks hold locks: each holder fails with `LockLost` naming quit when its
/// usable lease runs out, and its lock expires with its lease, as documented; nothing warns
/// about releases that a closed client cannot send. Before, each lost hold still tried its
/// release and warned "release failed ... quit()": an audit counted 10,000 warnings for 10,000
/// holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quit_with_held_locks_warns_about_no_release() {
    let captured = Captured::global_warn();
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks = client
            .lock_with::<str>(
                LockOptions::new()
                    .namespace(format!("quit-logs-{}", rand::random::<u32>()).as_str())
                    .lease(Duration::from_secs(1)),
            )
            .expect("options");
        let (held_tx, mut held) = tokio::sync::mpsc::channel::<()>(20);
        let holders: Vec<_> = (0..20)
            .map(|i| {
                let (locks, held_tx) = (locks.clone(), held_tx.clone());
                tokio::spawn(async move {
                    locks
                        .with_lock(&format!("k{i}"), Duration::from_secs(5), async move {
                            let _ = held_tx.send(()).await;
                            tokio::time::sleep(Duration::from_secs(10)).await;
                        })
                        .await
                })
            })
            .collect();
        for _ in 0..20 {
            held.recv().await.expect("a holder acquired");
        }
        client.quit().await;
        for holder in holders {
            let lost = holder.await.expect("holder task");
            assert!(
                matches!(&lost, Err(LockError::LockLost { reason: LossReason::RenewalFailed(why), .. }) if why.contains("quit")),
                "{}: {lost:?}",
                kind.name()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let logs = captured.text();
    println!("{logs}");
    assert!(
        !logs.contains("release"),
        "warnings about releases after quit():\n{logs}"
    );
}
