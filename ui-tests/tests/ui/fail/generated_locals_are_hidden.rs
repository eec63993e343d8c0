use sage_lock::locked;

#[locked(key = "account:{id}", wait = "2s")]
async fn update(id: u64) -> anyhow::Result<usize> {
    // The macro's own locals cannot be named by the body.
    Ok(sage_lock_key.len() + id as usize)
}

fn main() {}
