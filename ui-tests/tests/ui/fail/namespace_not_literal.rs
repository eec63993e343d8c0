use sage_lock::locked;

const NAMESPACE: &str = "accounts";

#[locked(key = "account:{id}", wait = "2s", namespace = NAMESPACE)]
async fn update(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

fn main() {}
