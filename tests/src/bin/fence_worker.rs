//! Test helper process: acquires `<key>` `<count>` times in a row, printing `token <n>` for each.
//!
//! Usage: `fence_worker <url> <namespace> <key> <count>`.

use std::time::Duration;

use sage_lock::{LockClient, LockOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, namespace, key, count] = args.as_slice() else {
        return Err("usage: fence_worker <url> <namespace> <key> <count>".into());
    };
    let client = LockClient::connect(url).await?;
    let locks = client.lock_with::<str>(LockOptions::new().namespace(namespace.as_str()))?;
    for _ in 0..count.parse::<u32>()? {
        let token = locks
            .with_lock(key.as_str(), Duration::from_secs(30), async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                sage_lock::current_lease().map_or(0, |l| l.fencing_token())
            })
            .await?;
        println!("token {token}");
    }
    Ok(())
}
