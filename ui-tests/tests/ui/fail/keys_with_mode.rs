use sage_lock::locked;

#[locked(key = ["a", "b"], wait = "2s", mode = "write")]
async fn run() -> anyhow::Result<()> {
    Ok(())
}

fn main() {}
