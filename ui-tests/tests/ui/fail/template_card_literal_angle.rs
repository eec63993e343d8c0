use sage_lock::locked;

#[locked(key = "html:<body>:{id}", wait = "2s")]
async fn render(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

fn main() {}
