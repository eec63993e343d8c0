use sage_lock::locked;

#[locked(key = "account:{from}", wait = "2s")]
#[locked(key = "account:{to}", wait = "2s")]
async fn transfer(from: u64, to: u64) -> anyhow::Result<()> {
    let _ = (from, to);
    Ok(())
}

fn main() {}
