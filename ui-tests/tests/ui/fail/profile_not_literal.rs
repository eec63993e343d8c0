use sage_lock::locked;

const PROFILE: &str = "account-updates";

#[locked(profile = PROFILE, key = "account:{id}")]
async fn update(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

fn main() {}
