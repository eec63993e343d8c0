use sage_lock::locked;

// Every problem is reported, each at its own token.
#[locked(
    key = "account:{acount}:{id:x}",
    wiat = "2s",
    lease = "5ms",
    try_lock = 1
)]
async fn update(account: u64, id: u64) -> anyhow::Result<Option<u64>> {
    Ok(account + id)
}

fn main() {}
