use sage_lock::locked;

// With `try_lock`, the body evaluates to `Result<T, E>`, not the function's `Result<Option<T>, E>`.
#[locked(key = "account:{id}", try_lock)]
async fn settle(id: u64) -> anyhow::Result<Option<u64>> {
    Ok(Some(id))
}

fn main() {}
