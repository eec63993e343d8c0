//! Generics, where-clauses, explicit and elided lifetimes, `impl Trait` in and out, aliases.
use std::fmt::Display;

use sage_lock::{LockError, locked};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

pub type AppResult<T> = Result<T, AppError>;

#[locked(key = "g:{part}:{label}", wait = "2s")]
async fn generic<'a, T, E>(part: T, label: &'a str) -> Result<&'a str, E>
where
    T: Display + Send,
    E: From<LockError>,
{
    let _ = part;
    Ok(label)
}

#[locked(key = "elided:{name}", wait = "2s")]
async fn elided(name: &str) -> AppResult<&str> {
    Ok(name)
}

#[locked(key = "impl:{value}", try_lock)]
async fn impl_trait(value: impl Display + Send) -> AppResult<Option<impl Display>> {
    Ok(value.to_string())
}

#[locked(key = "const:{len}", wait = "2s")]
async fn const_generic<const N: usize>(len: usize) -> AppResult<[u8; N]> {
    let _ = len;
    Ok([0; N])
}

fn main() {
    drop(generic::<u8, AppError>(1, "x"));
    drop(elided("x"));
    drop(impl_trait(1));
    let _ = const_generic::<1>;
}
