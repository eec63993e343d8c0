use sage_lock::locked;

#[locked(key = "account:{id}", wait = "2s", reentrant = 1)]
async fn update(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

fn main() {}
