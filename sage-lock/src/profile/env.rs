//! Environment overrides of profiles, for twelve-factor deployments:
//! `SAGE_LOCK_PROFILE_<NAME>_LEASE=10s`, `_WAIT`, `_NAMESPACE`, `_REPLICA_ACK`, `_HOLD_AT_LEAST`,
//! `_REENTRANT`, where `<NAME>` is
//! the profile name upper-cased with `-` and `.` turned into `_`. An override beats the value
//! from the configuration; an argument written in `#[locked(...)]` beats both.

use std::ffi::OsString;
use std::time::Duration;

use super::{Profile, Profiles};
use crate::duration::parse_millis;

/// The prefix of every override variable.
pub(crate) const PREFIX: &str = "SAGE_LOCK_PROFILE_";

/// The settings that can be overridden, as they appear at the end of a variable's name.
const SETTINGS: [&str; 6] = [
    "LEASE",
    "WAIT",
    "NAMESPACE",
    "REPLICA_ACK",
    "HOLD_AT_LEAST",
    "REENTRANT",
];

/// `SAGE_LOCK_PROFILE_<NAME>_<SETTING>`.
pub(crate) fn variable(name: &str, setting: &str) -> String {
    let name: String = name
        .chars()
        .map(|c| match c {
            '-' | '.' => '_',
            c => c.to_ascii_uppercase(),
        })
        .collect();
    format!("{PREFIX}{name}_{setting}")
}

/// Refuses two profile names that read the same environment variables (`-` and `.` are both
/// `_`, letters are upper-cased).
///
/// # Errors
/// A message naming both profiles, their variables and the fix.
pub(crate) fn distinct_variables<'n>(names: impl Iterator<Item = &'n str>) -> Result<(), String> {
    let mut seen: Vec<(String, &str)> = Vec::new();
    for name in names {
        let prefix = variable(name, "");
        if let Some((_, other)) = seen.iter().find(|(taken, _)| *taken == prefix) {
            return Err(format!(
                "profiles {other:?} and {name:?} share the environment variables {prefix}*: \
                 rename one of them"
            ));
        }
        seen.push((prefix, name));
    }
    Ok(())
}

/// Applies the overrides found by `lookup` (a variable's value, if set) to every profile.
///
/// # Errors
/// A message naming the variable, its value and the fix.
pub(crate) fn apply(
    profiles: &mut Profiles,
    lookup: impl Fn(&str) -> Option<OsString>,
) -> Result<(), String> {
    let names: Vec<String> = profiles.names().map(str::to_owned).collect();
    distinct_variables(names.iter().map(String::as_str))?;
    for name in &names {
        let Some(profile) = profiles.get_mut(name) else {
            continue;
        };
        for setting in SETTINGS {
            let variable = variable(name, setting);
            if let Some(value) = lookup(&variable) {
                let Some(value) = value.to_str() else {
                    return Err(format!("{variable} is not valid UTF-8"));
                };
                // The profile was valid before (checked first), so a range error is this
                // variable's.
                set(profile, setting, value.trim()).map_err(|problem| {
                    format!("{variable}={value:?} (profile {name:?}): {problem}")
                })?;
                // The range checks name the profile themselves.
                profile
                    .validate(name)
                    .map_err(|problem| format!("{variable}={value:?}: {problem}"))?;
            }
        }
    }
    Ok(())
}

fn set(profile: &mut Profile, setting: &str, value: &str) -> Result<(), String> {
    match setting {
        "LEASE" => profile.lease = Some(duration(value)?),
        "WAIT" => profile.wait = Some(duration(value)?),
        "NAMESPACE" => profile.namespace = Some(value.to_owned()),
        "HOLD_AT_LEAST" => profile.hold_at_least = Some(duration(value)?),
        "REENTRANT" => profile.reentrant = Some(flag(value)?),
        _ => profile.replica_acknowledgement = Some(flag(value)?),
    }
    Ok(())
}

fn duration(value: &str) -> Result<Duration, String> {
    parse_millis(value)
        .map(Duration::from_millis)
        .map_err(|error| error.to_string())
}

fn flag(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(
            "expected `true` or `false` (also accepted, in any case: `1`/`0`, `yes`/`no`, \
                  `on`/`off`)"
                .to_owned(),
        ),
    }
}

/// The variables with the override prefix that override nothing, each with why: it names no
/// installed profile, or a setting no profile has (the longest profile prefix it starts with).
pub(crate) fn unmatched(
    profiles: &Profiles,
    variables: impl Iterator<Item = OsString>,
) -> Vec<(String, String)> {
    let known: Vec<String> = profiles
        .names()
        .flat_map(|name| SETTINGS.map(|setting| variable(name, setting)))
        .collect();
    variables
        .filter_map(|variable| variable.into_string().ok())
        .filter(|variable| {
            variable.to_ascii_uppercase().starts_with(PREFIX) && !known.contains(variable)
        })
        .map(|unknown| {
            let upper = unknown.to_ascii_uppercase();
            if known.contains(&upper) {
                let why = format!("override variables are upper-case: set {upper}");
                return (unknown, why);
            }
            let profile = profiles
                .names()
                .filter(|name| upper.starts_with(&variable(name, "")))
                .max_by_key(|name| name.len());
            let why = match profile {
                Some(name) => format!(
                    "it names no setting of lock profile {name:?}: the settings are {}",
                    SETTINGS.join(", ")
                ),
                None => "it names no installed lock profile".to_owned(),
            };
            (unknown, why)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn variables_are_upper_case_with_underscores() {
        assert_eq!(
            variable("account-updates.v2", "WAIT"),
            "SAGE_LOCK_PROFILE_ACCOUNT_UPDATES_V2_WAIT"
        );
    }

    #[test]
    fn overrides_replace_configured_values() {
        let mut profiles = Profiles::new().with(
            "account-updates",
            Profile::new()
                .lease(Duration::from_secs(30))
                .namespace("file"),
        );
        apply(
            &mut profiles,
            lookup(&[
                ("SAGE_LOCK_PROFILE_ACCOUNT_UPDATES_LEASE", "10s"),
                ("SAGE_LOCK_PROFILE_ACCOUNT_UPDATES_WAIT", " 1m30s "),
                ("SAGE_LOCK_PROFILE_ACCOUNT_UPDATES_NAMESPACE", "env"),
                ("SAGE_LOCK_PROFILE_ACCOUNT_UPDATES_REPLICA_ACK", "off"),
                ("SAGE_LOCK_PROFILE_ACCOUNT_UPDATES_HOLD_AT_LEAST", "9s"),
                ("SAGE_LOCK_PROFILE_ACCOUNT_UPDATES_REENTRANT", "yes"),
            ]),
        )
        .expect("valid overrides");
        let expected = Profile::new()
            .lease(Duration::from_secs(10))
            .wait(Duration::from_secs(90))
            .namespace("env")
            .replica_acknowledgement(false)
            .hold_at_least(Duration::from_secs(9))
            .reentrant(true);
        assert_eq!(profiles.get("account-updates"), Some(&expected));
    }

    #[test]
    fn bad_values_name_the_variable() {
        let mut profiles = Profiles::new().with("p", Profile::new());
        let error = apply(
            &mut profiles,
            lookup(&[("SAGE_LOCK_PROFILE_P_LEASE", "10")]),
        )
        .expect_err("no unit");
        assert!(
            error.starts_with("SAGE_LOCK_PROFILE_P_LEASE=\"10\"") && error.contains("\"10s\""),
            "{error}"
        );
        let error = apply(
            &mut profiles,
            lookup(&[("SAGE_LOCK_PROFILE_P_REPLICA_ACK", "maybe")]),
        )
        .expect_err("not a bool");
        assert!(error.contains("SAGE_LOCK_PROFILE_P_REPLICA_ACK"), "{error}");
        for (variable, value, problem) in [
            ("SAGE_LOCK_PROFILE_P_WAIT", "0s", "`wait` must be positive"),
            (
                "SAGE_LOCK_PROFILE_P_LEASE",
                "10ms",
                "`lease` must be at least 30ms",
            ),
            (
                "SAGE_LOCK_PROFILE_P_NAMESPACE",
                " ",
                "`namespace` must not be empty",
            ),
            (
                "SAGE_LOCK_PROFILE_P_HOLD_AT_LEAST",
                "100000h",
                "`hold_at_least` must be at most one year",
            ),
        ] {
            let mut profiles = Profiles::new().with("p", Profile::new());
            let error = apply(&mut profiles, lookup(&[(variable, value)])).expect_err(variable);
            assert!(
                error.starts_with(&format!("{variable}={value:?}")) && error.contains(problem),
                "{error}"
            );
            assert_eq!(
                error.matches("profile \"p\"").count(),
                1,
                "the profile is named once: {error}"
            );
        }
        let mut clash = Profiles::new()
            .with("a-b", Profile::new())
            .with("a.b", Profile::new());
        let error = apply(&mut clash, lookup(&[])).expect_err("same variables");
        assert!(error.contains("rename"), "{error}");
    }

    #[test]
    fn unmatched_variables_are_reported() {
        let profiles = Profiles::new().with("p", Profile::new());
        let found = unmatched(
            &profiles,
            [
                "SAGE_LOCK_PROFILE_P_LEASE",
                "SAGE_LOCK_PROFILE_Q_LEASE",
                "SAGE_LOCK_PROFILE_P_LEASEE",
                "PATH",
            ]
            .into_iter()
            .map(OsString::from),
        );
        let names: Vec<&str> = found.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            ["SAGE_LOCK_PROFILE_Q_LEASE", "SAGE_LOCK_PROFILE_P_LEASEE"]
        );
        assert!(
            found[0].1.contains("no installed lock profile"),
            "{found:?}"
        );
        assert!(
            found[1].1.contains("no setting of lock profile \"p\"") && found[1].1.contains("LEASE"),
            "{found:?}"
        );
    }

    /// A variable written in the wrong case (a lower-case profile name or prefix) is reported
    /// with the upper-case name to set, not as naming no installed profile (an audit).
    #[test]
    fn variables_in_the_wrong_case_name_the_right_one() {
        let profiles = Profiles::new().with("p1", Profile::new());
        let found = unmatched(
            &profiles,
            [
                "SAGE_LOCK_PROFILE_p1_LEASE",
                "sage_lock_profile_p1_wait",
                "SAGE_LOCK_PROFILE_P1_LEASE",
            ]
            .into_iter()
            .map(OsString::from),
        );
        assert_eq!(found.len(), 2, "{found:?}");
        for (variable, why) in &found {
            assert!(
                why.contains("upper-case") && why.contains(&variable.to_ascii_uppercase()),
                "{variable}: {why}"
            );
        }
    }
}
