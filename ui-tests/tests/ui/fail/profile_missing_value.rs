use sage_lock::locked;

#[locked(profile, key = "account:{id}")]
async fn update(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

fn main() {}
