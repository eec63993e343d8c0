//! The API in one page: connect, make lock families, run bodies under a lock.
//!
//! `cargo run -p sage-lock-examples --release --bin quickstart` (uses `SAGE_LOCK_URL` when set,
//! else starts a throwaway `redis-server`; `--valkey` for `valkey-server`).

use std::time::Duration;

use sage_lock::{LockClient, LockOptions, Locks, current_lease};
use sage_lock_examples::{ThrowawayServer, Usage};

/// What this binary's command line may hold.
const USAGE: Usage<'static> = Usage {
    flags: &["--valkey"],
    valued: &[],
    text: "usage: cargo run -p sage-lock-examples --release --bin quickstart [-- --valkey]",
};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    sage_lock_examples::finish(run().await)
}

async fn run() -> anyhow::Result<()> {
    if !USAGE.check_command_line()? {
        return Ok(());
    }
    let server = ThrowawayServer::start()?;
    println!("server: {}", server.description());

    // One client per process; cheap to clone, shared by every lock family made from it.
    let client = LockClient::connect(server.url()).await?;

    // Defaults: 30 s lease (renewed while the body runs), namespace "lock".
    let locks: Locks<String> = client.lock::<String>();
    let greeting = locks
        .with_lock("report:daily", Duration::from_secs(2), async {
            let lease = current_lease().map(|l| (l.key().to_owned(), l.fencing_token()));
            format!("generated the daily report under {lease:?}")
        })
        .await?;
    println!("with_lock      -> {greeting}");

    // Explicit options and integer keys.
    let accounts: Locks<u64> = client.lock_with::<u64>(
        LockOptions::new()
            .lease(Duration::from_secs(10))
            .namespace("account-updates")
            .replica_acknowledgement(false),
    )?;
    let balance = accounts
        .with_lock(&42, Duration::from_secs(2), async {
            // At most one process runs this for account 42 at a time. Pass the fencing token
            // to the store so it can reject a holder whose lease ran out without noticing.
            let token = current_lease().map_or(0, |lease| lease.fencing_token());
            println!("with_lock      -> updating account 42 with fencing token {token}");
            100_i64 + 5
        })
        .await?;
    println!("with_lock      -> new balance {balance}");

    // try_with_lock: Ok(None) when busy, without running the body.
    let outer = accounts.try_with_lock(&7, async {
        let inner = accounts.try_with_lock(&7, async { "inner ran" }).await?;
        println!("try_with_lock  -> inner attempt while held: {inner:?}");
        Ok::<_, sage_lock::LockError>("outer ran")
    });
    println!(
        "try_with_lock  -> outer attempt: {:?}",
        outer.await?.transpose()?
    );

    // Every acquisition of a key gets a strictly larger fencing token.
    for _ in 0..3 {
        let token = accounts
            .with_lock(&42, Duration::from_secs(2), async {
                current_lease().map_or(0, |lease| lease.fencing_token())
            })
            .await?;
        println!("fencing token  -> account 42 acquired with token {token}");
    }

    // Waiting gives up with LockError::TimedOut: another task waits 200 ms for a lock this
    // one holds. (A call nested in this task's own hold would fail at once, HeldByThisTask.)
    let waited = accounts
        .with_lock(&9, Duration::from_secs(1), async {
            let other = accounts.clone();
            tokio::spawn(async move {
                other
                    .with_lock(&9, Duration::from_millis(200), async {})
                    .await
            })
            .await
        })
        .await??;
    match waited {
        Err(error) => println!("timed out      -> {error}"),
        Ok(()) => println!("timed out      -> unexpectedly acquired a held lock"),
    }

    let stats = client.stats();
    println!(
        "stats          -> {} acquisitions, {} busy retries, {} releases, {} timeouts",
        stats.acquisitions, stats.busy_retries, stats.releases, stats.timeouts
    );
    client.quit().await;
    Ok(())
}
