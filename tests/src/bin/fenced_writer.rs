//! Test helper process: acquires a lock, prints `acquired <fencing token>`, then blocks reading
//! stdin (a stand-in for a long pause; the test also SIGSTOPs it), then writes `<value>` to the
//! fencing-token-checking toy store under `<store-prefix>` with that token (after the lock call
//! returns, lost or not: the write of a holder that paused past its lease).
//!
//! Usage: `fenced_writer <url> <namespace> <key> <lease-ms> <store-prefix> <value>`.

use std::io::{BufRead as _, Write as _};
use std::time::Duration;

use sage_lock::fred::interfaces::LuaInterface;
use sage_lock::{LockClient, LockOptions};

const STORE: &str = include_str!("../lua/fenced_store.lua");

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, namespace, key, lease_ms, prefix, value] = args.as_slice() else {
        return Err(
            "usage: fenced_writer <url> <namespace> <key> <lease-ms> <store-prefix> <value>".into(),
        );
    };
    let client = LockClient::connect(url).await?;
    let locks = client.lock_with::<str>(
        LockOptions::new()
            .namespace(namespace.as_str())
            .lease(Duration::from_millis(lease_ms.parse()?)),
    )?;
    let keys = vec![
        format!("{prefix}:data"),
        format!("{prefix}:highest"),
        format!("{prefix}:rejected"),
    ];
    let token_seen = std::sync::atomic::AtomicU64::new(0);
    let outcome = locks
        .with_lock(key.as_str(), Duration::from_secs(10), async {
            let token = sage_lock::current_lease().map_or(0, |l| l.fencing_token());
            token_seen.store(token, std::sync::atomic::Ordering::SeqCst);
            println!("acquired {token}");
            let _ = std::io::stdout().flush();
            // Deliberately blocking: this process "pauses" here, unaware of time passing.
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
        })
        .await;
    // The late write, made with the token of the hold whatever became of it: sage-lock cancels
    // a body once it finds the lock lost, so a write from inside the body would race that (and
    // the process's exit); this models a write already under way when the process paused.
    let token = token_seen.load(std::sync::atomic::Ordering::SeqCst);
    let accepted: Result<i64, _> = client
        .fred()
        .eval(STORE, keys.clone(), vec![token.to_string(), value.clone()])
        .await;
    println!("accepted {accepted:?}");
    println!("outcome {outcome:?}");
    Ok(())
}
