use sage_lock::locked;

#[locked(key = "x:{_}", wait = "2s")]
async fn update(_: u64) -> anyhow::Result<()> {
    Ok(())
}

fn main() {}
