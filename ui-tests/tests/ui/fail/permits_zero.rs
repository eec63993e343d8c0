use sage_lock::locked;

#[locked(key = "pool", wait = "2s", permits = 0)]
async fn run() -> anyhow::Result<()> {
    Ok(())
}

fn main() {}
