use sage_lock::locked;

#[locked(profile = "jobs", key = "job", wait = "2s", try_lock)]
async fn job() -> anyhow::Result<Option<()>> {
    Ok(())
}

fn main() {}
