use sage_lock::locked;

// `#[tokio::main]` above `#[locked]` made the fn non-async first: the error said to add
// `async`, which is there (helper 28).
#[tokio::main]
#[locked(key = "main", wait = "1s")]
async fn main() -> Result<(), sage_lock::LockError> {
    Ok(())
}
