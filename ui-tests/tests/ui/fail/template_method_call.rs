use sage_lock::locked;

#[locked(key = "user:{name.to_lowercase()}", wait = "2s")]
async fn update(name: String) -> anyhow::Result<String> {
    Ok(name)
}

fn main() {}
