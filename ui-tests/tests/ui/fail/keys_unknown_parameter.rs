use sage_lock::locked;

#[locked(key = ["a:{from}", "b:{too}"], wait = "2s")]
async fn run(from: u64, to: u64) -> anyhow::Result<()> {
    Ok(())
}

fn main() {}
