use sage_lock::locked;

#[locked(key = "account:{id}", wait = "2s", lease = "9000h")]
async fn update(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

fn main() {}
