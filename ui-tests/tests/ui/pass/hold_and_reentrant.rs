//! `hold_at_least` (zero included) and `reentrant`, alone and with every other mode.
use sage_lock::locked;

#[locked(key = "report", try_lock, hold_at_least = "9s", namespace = "jobs")]
async fn scheduled_report() -> anyhow::Result<Option<u32>> {
    Ok(1)
}

#[locked(key = "job", wait = "1s", hold_at_least = "0s")]
async fn zero_is_off() -> anyhow::Result<()> {
    Ok(())
}

#[locked(key = "account:{id}", wait = "2s", reentrant)]
async fn outer(id: u64) -> anyhow::Result<u64> {
    inner(id).await
}

#[locked(key = "account:{id}", reentrant, wait = "2s", hold_at_least = "1m")]
async fn inner(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

fn main() {
    drop(scheduled_report());
    drop(zero_is_off());
    drop(outer(1));
}
