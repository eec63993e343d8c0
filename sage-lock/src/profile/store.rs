//! The process-wide profiles: installed once ([`set_profiles`]), looked up by `#[locked]`, and
//! checked at start-up against the profiles the binary's `#[locked]` functions name
//! ([`check_profiles`]). Re-exported from [`crate::global`].

use std::collections::BTreeMap;
use std::sync::OnceLock;

use super::{Profile, Profiles, env};
use crate::error::LockError;

static PROFILES: OnceLock<Profiles> = OnceLock::new();

/// A profile named by a `#[locked(profile = "...")]` function, registered at link time.
#[doc(hidden)]
#[derive(Debug)]
pub struct ProfileUse {
    name: &'static str,
    function: &'static str,
    file: &'static str,
    line: u32,
}

impl ProfileUse {
    /// What `#[locked]` registers for the function `function` at `file:line`.
    #[must_use]
    pub const fn new(
        name: &'static str,
        function: &'static str,
        file: &'static str,
        line: u32,
    ) -> Self {
        ProfileUse {
            name,
            function,
            file,
            line,
        }
    }
}

inventory::collect!(ProfileUse);

/// Installs the named profiles, once, after applying the environment overrides
/// (`SAGE_LOCK_PROFILE_<NAME>_LEASE`, `_WAIT`, `_NAMESPACE`, `_REPLICA_ACK`, `_HOLD_AT_LEAST`,
/// `_REENTRANT`; see [`Profiles::env_variable`]). Override variables that match no profile are logged at warn.
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use sage_lock::{global, Profile, Profiles};
///
/// global::set_profiles(
///     Profiles::new().with("account-updates", Profile::new().wait(Duration::from_secs(2))),
/// )?;
/// global::check_profiles()?; // every `#[locked(profile = ...)]` of the binary is configured
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`LockError::InvalidArgument`] for an invalid profile or override (naming it and the
/// variable), or when profiles were already installed.
pub fn set_profiles(profiles: Profiles) -> Result<(), LockError> {
    let mut profiles = profiles;
    profiles
        .check()
        .and_then(|()| env::apply(&mut profiles, |name| std::env::var_os(name)))
        .and_then(|()| profiles.check())
        .map_err(|message| LockError::invalid("profile", message))?;
    let unmatched = env::unmatched(&profiles, std::env::vars_os().map(|(name, _)| name));
    let names: Vec<String> = profiles.names().map(str::to_owned).collect();
    PROFILES.set(profiles).map_err(|_| {
        LockError::invalid(
            "profile",
            "lock profiles were already installed; call sage_lock::global::set_profiles once, \
             at start-up",
        )
    })?;
    // Only about the profiles installed: a refused call has nothing to warn about.
    for (variable, why) in unmatched {
        tracing::warn!(
            %variable,
            profiles = ?names,
            "environment variable overrides nothing: {why}"
        );
    }
    Ok(())
}

/// The installed profiles (with their environment overrides), if any.
///
/// ```
/// assert!(sage_lock::global::profiles().is_none()); // nothing installed yet
/// ```
#[must_use]
pub fn profiles() -> Option<&'static Profiles> {
    PROFILES.get()
}

/// The installed profile `name`.
///
/// ```no_run
/// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
/// let profile = sage_lock::global::profile("account-updates")?;
/// let locks = client.lock_with::<str>(profile.options())?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`LockError::InvalidArgument`] naming the profile when it is not installed.
pub fn profile(name: &str) -> Result<&'static Profile, LockError> {
    let Some(profiles) = PROFILES.get() else {
        return Err(LockError::invalid(
            "profile",
            format!(
                "unknown lock profile {name:?}: no profiles are installed; call \
                 sage_lock::global::set_profiles(...) at start-up with a profile {name:?}"
            ),
        ));
    };
    profiles.get(name).ok_or_else(|| {
        LockError::invalid(
            "profile",
            format!(
                "unknown lock profile {name:?}: add it to the profiles given to \
                 sage_lock::global::set_profiles (installed: {})",
                quoted(profiles.names())
            ),
        )
    })
}

/// Checks that every profile named by a `#[locked(profile = "...")]` function linked into this
/// binary is installed, so that a misconfigured service fails at start-up rather than on its first
/// request. Call it after [`set_profiles`] (see its example).
///
/// # Errors
/// [`LockError::InvalidArgument`] listing every missing profile and the functions using it.
pub fn check_profiles() -> Result<(), LockError> {
    let installed = PROFILES.get();
    let mut missing: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for used in inventory::iter::<ProfileUse> {
        if installed.is_some_and(|profiles| profiles.get(used.name).is_some()) {
            continue;
        }
        missing
            .entry(used.name)
            .or_default()
            .push(format!("{} at {}:{}", used.function, used.file, used.line));
    }
    if missing.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = missing
        .iter()
        .map(|(name, users)| {
            let mut users = users.clone();
            users.sort();
            users.dedup();
            format!("{name:?} (used by {})", users.join(", "))
        })
        .collect();
    let installed = match installed {
        Some(profiles) => format!("installed: {}", quoted(profiles.names())),
        None => "no profiles are installed".to_owned(),
    };
    let (count, are, them) = match missing.len() {
        1 => ("1 lock profile".to_owned(), "is", "it"),
        n => (format!("{n} lock profiles"), "are", "them"),
    };
    Err(LockError::invalid(
        "profile",
        format!(
            "{count} used by #[locked] {are} not configured: {}; add {them} to the profiles \
             given to sage_lock::global::set_profiles ({installed})",
            list.join("; "),
        ),
    ))
}

fn quoted<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<String> = names.map(|name| format!("{name:?}")).collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}
