use sage_lock::locked;

#[locked(key = "doc", wait = "2s", profile = "reports", mode = "read")]
async fn run() -> anyhow::Result<()> {
    Ok(())
}

fn main() {}
