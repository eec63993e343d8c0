use sage_lock::locked;

#[locked(key = "tenant:{self.tenant}", wait = "2s")]
async fn update(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

fn main() {}
