use sage_lock::locked;

#[derive(Debug)]
pub struct AppError;

#[locked(key = "account:{id}", try_lock)]
async fn settle(id: u64) -> Result<Option<u64>, AppError> {
    Ok(id)
}

fn main() {}
