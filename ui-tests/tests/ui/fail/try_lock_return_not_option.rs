use sage_lock::locked;

#[locked(key = "account:{id}", try_lock)]
async fn settle(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

fn main() {}
