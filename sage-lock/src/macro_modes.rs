//! What `#[locked]`'s `mode`, `permits` and `key = [..]` call (beside
//! [`macro_support`](crate::macro_support)'s mutex entry points). Not a public API.

use std::future::Future;
use std::time::Duration;

use crate::macro_support::{Shape, TryShape, client_or_global, family};
use crate::{LockClient, LockError, LockOptions};

/// Which primitive `mode = ".."` / `permits = N` asks for.
#[derive(Debug, Clone, Copy)]
pub enum Primitive {
    /// `mode = "read"`: the read side of a read-write lock.
    Read,
    /// `mode = "write"`: the write side of a read-write lock.
    Write,
    /// `permits = N`: a semaphore with N permits.
    Semaphore(u32),
}

/// Runs `body` under `primitive` on `key`: waiting up to `wait`, or (`wait == None`) only if
/// it is free now. `Ok(None)`: busy.
async fn run_primitive<F: Future>(
    client: Option<LockClient>,
    primitive: Primitive,
    key: Vec<u8>,
    options: LockOptions,
    wait: Option<Duration>,
    body: F,
) -> Result<Option<F::Output>, LockError> {
    let client = client_or_global(client, &[&key[..]], &options).await?;
    match primitive {
        Primitive::Read | Primitive::Write => {
            let rw = client.rw_lock_with::<[u8]>(options)?;
            match (primitive, wait) {
                (Primitive::Read, Some(wait)) => rw.read(&key[..], wait, body).await.map(Some),
                (Primitive::Read, None) => rw.try_read(&key[..], body).await,
                (_, Some(wait)) => rw.write(&key[..], wait, body).await.map(Some),
                (_, None) => rw.try_write(&key[..], body).await,
            }
        }
        Primitive::Semaphore(permits) => {
            let semaphore = client.semaphore_with::<[u8]>(permits, options)?;
            match wait {
                Some(wait) => semaphore.acquire(&key[..], wait, body).await.map(Some),
                None => semaphore.try_acquire(&key[..], body).await,
            }
        }
    }
}

/// `mode` / `permits`, waiting: as [`with_lock`](crate::macro_support::with_lock) on the
/// read-write lock or semaphore (the body boxed at once, as there).
pub fn with_primitive<R, F>(
    shape: Shape<R>,
    client: Option<LockClient>,
    primitive: Primitive,
    key: Vec<u8>,
    options: LockOptions,
    wait: Duration,
    body: F,
) -> impl Future<Output = R>
where
    F: Future<Output = R>,
{
    let body = Box::pin(body);
    async move {
        match run_primitive(client, primitive, key, options, Some(wait), body).await {
            Ok(Some(output)) => output,
            Ok(None) => (shape.on_error)(LockError::invalid(
                "wait_timeout",
                "internal: busy result in waiting mode",
            )),
            Err(error) => (shape.on_error)(error),
        }
    }
}

/// `mode` / `permits` with `try_lock`: as [`try_with_lock`](crate::macro_support::try_with_lock)
/// on the read-write lock or semaphore (the body boxed at once, as there).
pub fn try_with_primitive<R, B, F>(
    shape: TryShape<R, B>,
    client: Option<LockClient>,
    primitive: Primitive,
    key: Vec<u8>,
    options: LockOptions,
    body: F,
) -> impl Future<Output = R>
where
    F: Future<Output = B>,
{
    let body = Box::pin(body);
    async move {
        match run_primitive(client, primitive, key, options, None, body).await {
            Ok(Some(output)) => (shape.finished)(output),
            Ok(None) => (shape.busy)(),
            Err(error) => (shape.on_error)(error),
        }
    }
}

/// `key = [..]`, waiting: all of `keys` or none, as [`Locks::with_locks`](crate::Locks::with_locks)
/// (the body boxed at once).
pub fn with_locks<R, F>(
    shape: Shape<R>,
    client: Option<LockClient>,
    keys: Vec<Vec<u8>>,
    options: LockOptions,
    wait: Duration,
    body: F,
) -> impl Future<Output = R>
where
    F: Future<Output = R>,
{
    let body = Box::pin(body);
    async move {
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let locks = match family(client, &keys, options).await {
            Ok(locks) => locks,
            Err(error) => return (shape.on_error)(error),
        };
        match locks.with_locks(&keys, wait, body).await {
            Ok(output) => output,
            Err(error) => (shape.on_error)(error),
        }
    }
}

/// `key = [..]` with `try_lock`: as [`Locks::try_with_locks`](crate::Locks::try_with_locks)
/// (the body boxed at once).
pub fn try_with_locks<R, B, F>(
    shape: TryShape<R, B>,
    client: Option<LockClient>,
    keys: Vec<Vec<u8>>,
    options: LockOptions,
    body: F,
) -> impl Future<Output = R>
where
    F: Future<Output = B>,
{
    let body = Box::pin(body);
    async move {
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let locks = match family(client, &keys, options).await {
            Ok(locks) => locks,
            Err(error) => return (shape.on_error)(error),
        };
        match locks.try_with_locks(&keys, body).await {
            Ok(Some(output)) => (shape.finished)(output),
            Ok(None) => (shape.busy)(),
            Err(error) => (shape.on_error)(error),
        }
    }
}
