use sage_lock::locked;

#[locked(key = "pool", wait = "2s", mode = "read", permits = 2)]
async fn run() -> anyhow::Result<()> {
    Ok(())
}

fn main() {}
