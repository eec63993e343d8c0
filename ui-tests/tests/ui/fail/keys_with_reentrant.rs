use sage_lock::locked;

#[locked(key = ["account:{from}", "account:{to}"], wait = "2s", reentrant)]
async fn transfer(from: u64, to: u64) -> anyhow::Result<u64> {
    Ok(from + to)
}

fn main() {}
