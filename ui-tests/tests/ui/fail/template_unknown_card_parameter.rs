use sage_lock::locked;

#[locked(key = "account:<user>", wait = "2s")]
async fn update(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

fn main() {}
