use sage_lock::locked;

#[derive(Debug)]
pub struct AppError;

#[locked(key = "account:{id}", wait = "2s")]
async fn update(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
