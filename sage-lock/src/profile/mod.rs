//! Named lock profiles: the settings of one kind of lock (lease, wait, namespace, replica
//! acknowledgement), kept in the service's configuration rather than in code, and used by
//! `#[locked(profile = "...")]`.
//!
//! With the `serde` feature, [`Profiles`] and [`Profile`] implement `Deserialize` (durations as
//! text such as `"2s"` or `"1m30s"`), so they can live in the service's own configuration file;
//! see [`Profiles`].

pub(crate) mod env;
pub(crate) mod store;

#[cfg(feature = "serde")]
mod de;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::duration::format_millis;
use crate::error::LockError;
use crate::options::{LockOptions, MIN_LEASE};

/// The settings of one named profile. Unset settings fall back to the service defaults
/// ([`crate::global::set_defaults`]); arguments written in `#[locked(...)]` override them.
///
/// `#[non_exhaustive]`: build one with [`Profile::new`] and its setters (see [`Profiles`]'s
/// example); more settings may be added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Profile {
    /// The lease (30 ms to one year).
    pub lease: Option<Duration>,
    /// How long `#[locked]` waits for a busy lock (positive). Without it, the attribute must give
    /// `wait` or `try_lock`.
    pub wait: Option<Duration>,
    /// The namespace (not empty, blank or whitespace-padded).
    pub namespace: Option<String>,
    /// Whether replicated deployments wait for replicas to acknowledge (`WAIT`).
    pub replica_acknowledgement: Option<bool>,
    /// The minimum hold ([`LockOptions::hold_at_least`]).
    pub hold_at_least: Option<Duration>,
    /// Whether a nested call runs under the lock its task holds ([`LockOptions::reentrant`]).
    pub reentrant: Option<bool>,
}

impl Profile {
    /// A profile with nothing set.
    #[must_use]
    pub fn new() -> Self {
        Profile::default()
    }

    /// Sets the lease ([`LockOptions::lease`]; 30 ms to one year, checked by
    /// [`Profiles::validate`] and when installed).
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Sets how long `#[locked]` waits for a busy lock (positive).
    #[must_use]
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Sets the namespace ([`LockOptions::namespace`]; not empty, blank or whitespace-padded).
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Sets whether replicated deployments wait for replicas to acknowledge
    /// ([`LockOptions::replica_acknowledgement`]).
    #[must_use]
    pub fn replica_acknowledgement(mut self, on: bool) -> Self {
        self.replica_acknowledgement = Some(on);
        self
    }

    /// Sets the minimum hold after acquisition ([`LockOptions::hold_at_least`]; at most one
    /// year).
    #[must_use]
    pub fn hold_at_least(mut self, hold_at_least: Duration) -> Self {
        self.hold_at_least = Some(hold_at_least);
        self
    }

    /// Sets whether a nested call runs under the lock its task holds
    /// ([`LockOptions::reentrant`]).
    #[must_use]
    pub fn reentrant(mut self, on: bool) -> Self {
        self.reentrant = Some(on);
        self
    }

    /// The lock options this profile sets (the wait is not an option of a lock family: pass it
    /// to [`Locks::with_lock`](crate::Locks::with_lock)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use sage_lock::Profile;
    ///
    /// let options = Profile::new().lease(Duration::from_secs(5)).options();
    /// // client.lock_with::<str>(options)?
    /// ```
    #[must_use]
    pub fn options(&self) -> LockOptions {
        let mut options = LockOptions::new();
        if let Some(lease) = self.lease {
            options = options.lease(lease);
        }
        if let Some(namespace) = &self.namespace {
            options = options.namespace(namespace.clone());
        }
        if let Some(on) = self.replica_acknowledgement {
            options = options.replica_acknowledgement(on);
        }
        if let Some(hold) = self.hold_at_least {
            options = options.hold_at_least(hold);
        }
        if let Some(on) = self.reentrant {
            options = options.reentrant(on);
        }
        options
    }

    /// Checks every setting, naming `profile` and the fix in the error.
    pub(crate) fn validate(&self, profile: &str) -> Result<(), String> {
        let named = |problem: String| format!("profile {profile:?}: {problem}");
        self.lease.map_or(Ok(()), check_lease).map_err(named)?;
        self.hold_at_least
            .map_or(Ok(()), check_hold_at_least)
            .map_err(named)?;
        self.wait.map_or(Ok(()), check_wait).map_err(named)?;
        self.namespace
            .as_deref()
            .map_or(Ok(()), check_namespace)
            .map_err(named)
    }
}

/// A profile's `lease`: 30 ms to one year.
pub(crate) fn check_lease(lease: Duration) -> Result<(), String> {
    if lease < MIN_LEASE {
        return Err(format!(
            "`lease` must be at least 30ms, got {}; choose one comfortably longer than network \
             latency and process pauses, e.g. \"10s\"",
            format_duration(lease)
        ));
    }
    if lease > ONE_YEAR {
        return Err(format!(
            "`lease` must be at most one year, got {}",
            format_duration(lease)
        ));
    }
    Ok(())
}

/// A profile's `hold_at_least`: at most one year.
pub(crate) fn check_hold_at_least(hold: Duration) -> Result<(), String> {
    if hold > ONE_YEAR {
        return Err(format!(
            "`hold_at_least` must be at most one year, got {}; use the interval of the \
             scheduled job, e.g. \"30s\"",
            format_duration(hold)
        ));
    }
    Ok(())
}

/// A profile's `wait`: positive.
pub(crate) fn check_wait(wait: Duration) -> Result<(), String> {
    if wait.is_zero() {
        return Err(
            "`wait` must be positive, e.g. \"2s\"; to not wait, remove it and use \
                    `#[locked(try_lock)]`"
                .to_owned(),
        );
    }
    Ok(())
}

/// A profile's `namespace`: not blank, and without leading or trailing whitespace.
pub(crate) fn check_namespace(namespace: &str) -> Result<(), String> {
    if namespace.trim().is_empty() {
        return Err(
            "`namespace` must not be empty or blank; give a name such as \
                    \"account-updates\", or leave it out for the default namespace"
                .to_owned(),
        );
    }
    crate::options::validate_namespace(namespace).map_err(|error| error.to_string())
}

/// The longest lease and minimum hold a profile may set.
const ONE_YEAR: Duration = Duration::from_secs(60 * 60 * 24 * 365);

/// Renders a duration in the grammar of the configuration (`1s500ms`).
fn format_duration(duration: Duration) -> String {
    format_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

/// Profiles by name. Install them once with [`crate::global::set_profiles`], which also applies
/// the environment overrides (`SAGE_LOCK_PROFILE_<NAME>_LEASE`, ...; see
/// [`Profiles::env_variable`]).
///
/// With the `serde` feature, a `Profiles` deserializes from a map of names to profiles, so a
/// service embeds it in its configuration. In TOML:
///
/// ```toml
/// [lock_profiles.account-updates]
/// lease = "10s"
/// wait = "2s"
/// namespace = "account-updates"
///
/// [lock_profiles.nightly-report]
/// lease = "1m"
/// replica_acknowledgement = false
/// ```
///
/// Unknown settings are rejected (with the list of known ones), as are malformed durations, a
/// lease below 30 ms, a zero wait, an empty namespace and names that do not map to environment
/// variables. In code:
///
/// ```
/// use std::time::Duration;
/// use sage_lock::{Profile, Profiles};
///
/// let profiles = Profiles::new()
///     .with(
///         "account-updates",
///         Profile::new().lease(Duration::from_secs(10)).wait(Duration::from_secs(2)),
///     )
///     .with("reports", Profile::new().namespace("reports").replica_acknowledgement(false));
/// assert_eq!(profiles.get("account-updates").and_then(|p| p.wait), Some(Duration::from_secs(2)));
/// // At start-up: sage_lock::global::set_profiles(profiles)?;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profiles {
    by_name: BTreeMap<String, Profile>,
}

impl Profiles {
    /// No profiles.
    #[must_use]
    pub fn new() -> Self {
        Profiles::default()
    }

    /// Adds (or replaces) the profile `name`.
    #[must_use]
    pub fn with(mut self, name: impl Into<String>, profile: Profile) -> Self {
        self.insert(name, profile);
        self
    }

    /// Adds (or replaces) the profile `name`, returning the one it replaced.
    pub fn insert(&mut self, name: impl Into<String>, profile: Profile) -> Option<Profile> {
        self.by_name.insert(name.into(), profile)
    }

    /// The profile named `name` in this set (exactly as given to [`Profiles::with`] or
    /// [`Profiles::insert`]; no environment overrides applied), `None` when there is none.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&Profile> {
        self.by_name.get(name)
    }

    /// The profile names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// The profiles with their names, in order of name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Profile)> {
        self.by_name
            .iter()
            .map(|(name, profile)| (name.as_str(), profile))
    }

    /// How many profiles there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// True when there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The environment variable overriding `setting` (`LEASE`, `WAIT`, `NAMESPACE`,
    /// `REPLICA_ACK`, `HOLD_AT_LEAST` or `REENTRANT`) of the profile `name`:
    /// `SAGE_LOCK_PROFILE_<NAME>_<SETTING>`, the name upper-cased with `-` and `.` turned into `_`;
    /// `setting` is used as given (neither upper-cased nor checked).
    ///
    /// ```
    /// assert_eq!(
    ///     sage_lock::Profiles::env_variable("account-updates", "LEASE"),
    ///     "SAGE_LOCK_PROFILE_ACCOUNT_UPDATES_LEASE"
    /// );
    /// ```
    #[must_use]
    pub fn env_variable(name: &str, setting: &str) -> String {
        env::variable(name, setting)
    }

    /// Checks every profile and every name (two names that share their environment variables,
    /// such as `a-b` and `a_b`, included).
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] naming the profile, the setting and the fix.
    pub fn validate(&self) -> Result<(), LockError> {
        self.check()
            .map_err(|message| LockError::invalid("profile", message))
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        for (name, profile) in &self.by_name {
            validate_name(name)?;
            profile.validate(name)?;
        }
        env::distinct_variables(self.names())
    }

    pub(crate) fn get_mut(&mut self, name: &str) -> Option<&mut Profile> {
        self.by_name.get_mut(name)
    }
}

impl FromIterator<(String, Profile)> for Profiles {
    fn from_iter<I: IntoIterator<Item = (String, Profile)>>(iter: I) -> Self {
        Profiles {
            by_name: iter.into_iter().collect(),
        }
    }
}

/// A profile name maps to environment variables, so it is limited to ASCII letters, digits, `-`,
/// `_` and `.` (the same rule `#[locked(profile = "...")]` checks at compile time).
pub(crate) fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("profile names must not be empty; use e.g. \"account-updates\"".to_owned());
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "profile name {name:?} contains {bad:?}: use ASCII letters, digits, '-', '_' and '.', \
             so that it maps to environment variables (SAGE_LOCK_PROFILE_<NAME>_LEASE, ...)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names that share their environment variables (`-` and `.` both read as `_`) are
    /// refused by `validate` too, not only later by `set_profiles` (an audit).
    #[test]
    fn names_sharing_environment_variables_fail_validation() {
        let profiles: Profiles = [
            ("a-b".to_owned(), Profile::new()),
            ("a_b".to_owned(), Profile::new()),
        ]
        .into_iter()
        .collect();
        let error = profiles
            .validate()
            .expect_err("shared variables")
            .to_string();
        assert!(error.contains("SAGE_LOCK_PROFILE_A_B_"), "{error}");
    }

    #[test]
    fn validation_names_the_profile_and_the_fix() {
        let short = Profile::new().lease(Duration::from_millis(10));
        let message = short.validate("fast").expect_err("invalid");
        assert!(
            message.contains("\"fast\"") && message.contains("got 10ms"),
            "{message}"
        );
        let zero = Profile::new().wait(Duration::ZERO);
        assert!(
            zero.validate("p")
                .expect_err("invalid")
                .contains("try_lock")
        );
        let empty = Profile::new().namespace("");
        assert!(
            empty
                .validate("p")
                .expect_err("invalid")
                .contains("must not be empty")
        );
        assert!(Profile::new().lease(MIN_LEASE).validate("p").is_ok());
        let bad = Profiles::new().with("a b", Profile::new()).validate();
        assert!(
            matches!(&bad, Err(LockError::InvalidArgument { message, .. }) if message.contains("' '")),
            "{bad:?}"
        );
        assert!(validate_name("").is_err());
        assert!(validate_name("Account-updates.v2_x").is_ok());
    }

    #[test]
    fn options_carry_what_is_set() {
        let profile = Profile::new()
            .lease(Duration::from_secs(5))
            .namespace("ns")
            .replica_acknowledgement(false);
        let debug = format!("{:?}", profile.options());
        assert!(
            debug.contains("5s") && debug.contains("\"ns\"") && debug.contains("false"),
            "{debug}"
        );
        let profiles: Profiles = [("a".to_owned(), profile.clone())].into_iter().collect();
        assert_eq!(profiles.get("a"), Some(&profile));
        assert_eq!(profiles.names().collect::<Vec<_>>(), ["a"]);
        assert_eq!(profiles.len(), 1);
        assert!(!profiles.is_empty());
    }
}
