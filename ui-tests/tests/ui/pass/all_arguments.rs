//! Every argument, in any order, multi-line, with a trailing comma.
use std::sync::Arc;

use sage_lock::{LockClient, locked};

#[locked(
    replica_ack = false,
    lease = "1m30s",
    namespace = "everything",
    client = client,
    wait = "1h 2m 3s 4ms",
    key = "order:{id}",
    hold_at_least = "5s",
    reentrant,
    crate = ::sage_lock,
)]
async fn everything(client: Arc<LockClient>, id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

#[locked(try_lock = true, key = "a", replica_ack, lease = "30ms")]
async fn flags() -> anyhow::Result<Option<()>> {
    Ok(())
}

#[locked(key = "b", wait = "150ms", try_lock = false)]
async fn try_lock_off() -> anyhow::Result<()> {
    Ok(())
}

fn main() {
    let _ = everything;
    drop(flags());
    drop(try_lock_off());
}
