use sage_lock::locked;

#[locked(key = "account:{id}", try_lock = "yes")]
async fn settle(id: u64) -> anyhow::Result<Option<u64>> {
    Ok(id)
}

fn main() {}
