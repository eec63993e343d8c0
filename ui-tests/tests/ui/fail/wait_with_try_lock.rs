use sage_lock::locked;

#[locked(key = "account:{id}", wait = "2s", try_lock)]
async fn settle(id: u64) -> anyhow::Result<Option<u64>> {
    Ok(id)
}

fn main() {}
