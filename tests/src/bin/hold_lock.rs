//! Test helper process: acquires a lock and holds it, renewing, until killed.
//!
//! Usage: `hold_lock <url> <namespace> <key> <lease-ms> [replicated]`. Prints `acquired <fence>`
//! once the lock is held.

use std::io::Write as _;
use std::time::Duration;

use sage_lock::{LockClient, LockOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, namespace, key, lease_ms, rest @ ..] = args.as_slice() else {
        return Err("usage: hold_lock <url> <namespace> <key> <lease-ms> [replicated]".into());
    };
    let replicated = rest.first().is_some_and(|r| r == "replicated");
    let client = LockClient::builder()
        .url(url)
        .replicated(replicated)
        .connect()
        .await?;
    let locks = client.lock_with::<str>(
        LockOptions::new()
            .namespace(namespace.as_str())
            .lease(Duration::from_millis(lease_ms.parse()?)),
    )?;
    locks
        .with_lock(key.as_str(), Duration::from_secs(30), async {
            let fence = sage_lock::current_lease().map_or(0, |l| l.fencing_token());
            println!("acquired {fence}");
            let _ = std::io::stdout().flush();
            std::future::pending::<()>().await;
        })
        .await?;
    Ok(())
}
