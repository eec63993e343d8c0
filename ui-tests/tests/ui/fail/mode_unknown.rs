use sage_lock::locked;

#[locked(key = "doc", wait = "2s", mode = "raed")]
async fn run() -> anyhow::Result<()> {
    Ok(())
}

fn main() {}
