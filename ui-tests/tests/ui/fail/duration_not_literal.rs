use sage_lock::locked;

#[locked(key = "account:{id}", wait = std::time::Duration::from_secs(2))]
async fn update(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

fn main() {}
