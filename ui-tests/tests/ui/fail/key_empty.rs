use sage_lock::locked;

// Every call would lock the same empty key (it compiled: helper 28).
#[locked(key = "", wait = "2s")]
async fn run() -> anyhow::Result<()> {
    Ok(())
}

#[locked(key = ["a", ""], wait = "2s")]
async fn several() -> anyhow::Result<()> {
    Ok(())
}

fn main() {}
