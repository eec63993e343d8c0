use sage_lock::locked;

#[locked(key = "account:{acount_id}", wait = "2s")]
async fn update(account_id: u64, delta: i64) -> anyhow::Result<i64> {
    Ok(account_id as i64 + delta)
}

fn main() {}
