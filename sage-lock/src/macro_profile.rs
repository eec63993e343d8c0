//! What `#[locked(profile = "...")]` calls: the profile's settings, looked up when the function
//! is called, with the attribute's own arguments applied over them. Not a public API (see
//! `macro_support`).

use std::future::Future;
use std::time::Duration;

pub use crate::profile::store::ProfileUse;
pub use inventory;

use crate::macro_modes::{try_with_locks, with_locks};
use crate::macro_support::{Shape, TryShape, try_with_lock, with_lock};
use crate::profile::env::PREFIX;
use crate::{LockClient, LockError, LockOptions, Profiles};

/// The options of `profile` with the attribute's `overrides` applied, and the wait the profile
/// sets.
fn resolve(
    profile: &'static str,
    overrides: impl FnOnce(LockOptions) -> LockOptions,
) -> Result<(LockOptions, Option<Duration>), LockError> {
    let settings = crate::profile::store::profile(profile)?;
    Ok((overrides(settings.options()), settings.wait))
}

/// [`resolve`] for a waiting call: the attribute's `wait`, else the profile's, else an error
/// naming the fixes.
fn resolve_waiting(
    profile: &'static str,
    overrides: impl FnOnce(LockOptions) -> LockOptions,
    wait: Option<Duration>,
) -> Result<(LockOptions, Duration), LockError> {
    let (options, profile_wait) = resolve(profile, overrides)?;
    let wait = wait.or(profile_wait).ok_or_else(|| missing_wait(profile))?;
    Ok((options, wait))
}

fn missing_wait(profile: &str) -> LockError {
    let variable = Profiles::env_variable(profile, "WAIT");
    debug_assert!(variable.starts_with(PREFIX));
    LockError::invalid(
        "wait",
        format!(
            "#[locked(profile = {profile:?})] has no wait: neither the attribute nor profile \
             {profile:?} sets one; add `wait = \"2s\"` to the profile (or set {variable}=2s), \
             write `wait = \"...\"` in the attribute, or use `try_lock`"
        ),
    )
}

/// Default mode with a profile: the attribute's `wait`, else the profile's (the body boxed at
/// once, as in [`with_lock`]).
pub fn with_profile_lock<R, O, F>(
    shape: Shape<R>,
    client: Option<LockClient>,
    key: Vec<u8>,
    profile: &'static str,
    overrides: O,
    wait: Option<Duration>,
    body: F,
) -> impl Future<Output = R>
where
    O: FnOnce(LockOptions) -> LockOptions,
    F: Future<Output = R>,
{
    let body = Box::pin(body);
    async move {
        match resolve_waiting(profile, overrides, wait) {
            Ok((options, wait)) => with_lock(shape, client, key, options, wait, body).await,
            Err(error) => (shape.on_error)(error),
        }
    }
}

/// `try_lock` mode with a profile (its wait is not used; the body boxed at once).
pub fn try_with_profile_lock<R, B, O, F>(
    shape: TryShape<R, B>,
    client: Option<LockClient>,
    key: Vec<u8>,
    profile: &'static str,
    overrides: O,
    body: F,
) -> impl Future<Output = R>
where
    O: FnOnce(LockOptions) -> LockOptions,
    F: Future<Output = B>,
{
    let body = Box::pin(body);
    async move {
        match resolve(profile, overrides) {
            Ok((options, _)) => try_with_lock(shape, client, key, options, body).await,
            Err(error) => (shape.on_error)(error),
        }
    }
}

/// `key = [..]` with a profile, waiting: all of `keys` or none, with the attribute's `wait`,
/// else the profile's (the body boxed at once).
pub fn with_profile_locks<R, O, F>(
    shape: Shape<R>,
    client: Option<LockClient>,
    keys: Vec<Vec<u8>>,
    profile: &'static str,
    overrides: O,
    wait: Option<Duration>,
    body: F,
) -> impl Future<Output = R>
where
    O: FnOnce(LockOptions) -> LockOptions,
    F: Future<Output = R>,
{
    let body = Box::pin(body);
    async move {
        match resolve_waiting(profile, overrides, wait) {
            Ok((options, wait)) => with_locks(shape, client, keys, options, wait, body).await,
            Err(error) => (shape.on_error)(error),
        }
    }
}

/// `key = [..]` with a profile and `try_lock` (the profile's wait is not used).
pub fn try_with_profile_locks<R, B, O, F>(
    shape: TryShape<R, B>,
    client: Option<LockClient>,
    keys: Vec<Vec<u8>>,
    profile: &'static str,
    overrides: O,
    body: F,
) -> impl Future<Output = R>
where
    O: FnOnce(LockOptions) -> LockOptions,
    F: Future<Output = B>,
{
    let body = Box::pin(body);
    async move {
        match resolve(profile, overrides) {
            Ok((options, _)) => try_with_locks(shape, client, keys, options, body).await,
            Err(error) => (shape.on_error)(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_wait_names_the_profile_and_the_fixes() {
        let message = missing_wait("account-updates").to_string();
        for expected in [
            "\"account-updates\"",
            "SAGE_LOCK_PROFILE_ACCOUNT_UPDATES_WAIT=2s",
            "try_lock",
        ] {
            assert!(message.contains(expected), "{message}");
        }
    }
}
