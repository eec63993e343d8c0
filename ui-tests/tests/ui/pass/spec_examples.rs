//! The two examples of the SPEC, verbatim apart from the bodies.
use sage_lock::{LockError, locked};

#[derive(Debug)]
pub enum AppError {
    Lock(LockError),
    Invalid,
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

#[derive(Debug)]
pub struct Receipt(u64);

fn validate(delta: i64) -> Result<i64, AppError> {
    if delta == 0 {
        Err(AppError::Invalid)
    } else {
        Ok(delta)
    }
}

#[locked(key = "account:{id}", wait = "2s", namespace = "account-updates")]
async fn update_account(id: u64, delta: i64) -> Result<(), AppError> {
    let delta = validate(delta)?;
    if delta < 0 {
        return Err(AppError::Invalid);
    }
    let _ = id;
    Ok(())
}

#[locked(key = "account:{id}", try_lock)] // do not wait
async fn settle(id: u64) -> Result<Option<Receipt>, AppError> {
    validate(1)?;
    if id == 0 {
        return Ok(Receipt(0));
    }
    Ok(Receipt(id))
}

fn main() {
    drop(update_account(42, 1));
    drop(settle(42));
}
