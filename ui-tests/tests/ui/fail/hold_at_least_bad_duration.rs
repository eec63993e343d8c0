use sage_lock::locked;

#[locked(key = "job", try_lock, hold_at_least = "30 seconds")]
async fn job() -> anyhow::Result<Option<()>> {
    Ok(())
}

#[locked(key = "job2", try_lock, hold_at_least = 30)]
async fn job2() -> anyhow::Result<Option<()>> {
    Ok(())
}

fn main() {}
