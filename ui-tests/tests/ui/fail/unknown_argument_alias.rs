use sage_lock::locked;

#[locked(key = "account:{id}", timeout = "2s")]
async fn update(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

fn main() {}

// One error per typo: the suggested argument is not also reported missing (helper 28).
#[locked(keys = "account:{id}", wait = "2s")]
async fn misspelt_key(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}
