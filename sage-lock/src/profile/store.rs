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
    /// A waiting call without a `wait` of its own: the profile must set one.
    needs_wait: bool,
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
            needs_wait: false,
        }
    }

    /// The same, for a waiting function whose attribute gives no `wait`.
    #[must_use]
    pub const fn needing_wait(self) -> Self {
        ProfileUse {
            needs_wait: true,
            ..self
        }
    }

    /// `function at file:line`.
    fn site(&self) -> String {
        format!("{} at {}:{}", self.function, self.file, self.line)
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
/// binary is installed (with a `wait` where a waiting function takes it from the profile), so that a misconfigured service fails at start-up rather than on its first
/// request. Call it after [`set_profiles`] (see its example).
///
/// # Errors
/// [`LockError::InvalidArgument`] listing every missing profile and the functions using it,
/// and every installed profile without a `wait` that a waiting function (no `wait` or
/// `try_lock` in its attribute) relies on.
pub fn check_profiles() -> Result<(), LockError> {
    let installed = PROFILES.get();
    let mut missing: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut without_wait: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for used in inventory::iter::<ProfileUse> {
        match installed.and_then(|profiles| profiles.get(used.name)) {
            Some(profile) if used.needs_wait && profile.wait.is_none() => {
                without_wait.entry(used.name).or_default().push(used.site());
            }
            Some(_) => {}
            None => missing.entry(used.name).or_default().push(used.site()),
        }
    }
    let without_wait = no_wait_text(&without_wait);
    if missing.is_empty() {
        return match without_wait {
            Some(text) => Err(LockError::invalid("profile", text)),
            None => Ok(()),
        };
    }
    let list = used_by(&missing);
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
             given to sage_lock::global::set_profiles ({installed}){}",
            list.join("; "),
            without_wait
                .map(|text| format!(". Also: {text}"))
                .unwrap_or_default(),
        ),
    ))
}

/// Each profile name with the functions using it: `"name" (used by f at file:line, ...)`.
fn used_by(uses: &BTreeMap<&str, Vec<String>>) -> Vec<String> {
    uses.iter()
        .map(|(name, users)| {
            let mut users = users.clone();
            users.sort();
            users.dedup();
            format!("{name:?} (used by {})", users.join(", "))
        })
        .collect()
}

/// What to say about installed profiles that waiting functions without a `wait` of their own
/// use, though they set no `wait` either (every call of those functions would fail).
fn no_wait_text(without_wait: &BTreeMap<&str, Vec<String>>) -> Option<String> {
    if without_wait.is_empty() {
        return None;
    }
    let variables: Vec<String> = without_wait
        .keys()
        .map(|name| env::variable(name, "WAIT"))
        .collect();
    Some(format!(
        "a waiting #[locked] gives no wait and its profile has no wait: {}; set wait in the \
         profile (e.g. wait = \"2s\", or the environment variable {}), or give the attribute \
         wait = \"...\" or try_lock",
        used_by(without_wait).join("; "),
        variables.join(", "),
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
