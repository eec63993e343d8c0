use sage_lock::locked;

#[locked(key = "job", try_lock, hold_at_least = "10s", hold_at_least = "20s")]
async fn job() -> anyhow::Result<Option<()>> {
    Ok(())
}

fn main() {}
