use sage_lock::locked;

#[locked(key = "account:{}", wait = "2s")]
async fn update(id: u64, delta: i64) -> anyhow::Result<i64> {
    Ok(id as i64 + delta)
}

fn main() {}
