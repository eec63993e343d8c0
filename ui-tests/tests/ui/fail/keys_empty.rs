use sage_lock::locked;

#[locked(key = [], wait = "2s")]
async fn run() -> anyhow::Result<()> {
    Ok(())
}

fn main() {}
