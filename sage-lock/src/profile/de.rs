//! `serde::Deserialize` for [`LockOptions`], [`Profile`] and [`Profiles`] (feature `serde`).
//! Durations are text in the grammar of `#[locked]` (`"150ms"`, `"2s"`, `"1m30s"`); unknown
//! settings are errors that list the known ones.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::{
    Profile, Profiles, check_hold_at_least, check_lease, check_namespace, check_wait, validate_name,
};
use crate::duration::parse_millis;
use crate::options::{LockOptions, validate_hold_at_least, validate_lease, validate_namespace};

/// The fields of a [`Profile`] as written in a configuration file. Each value is checked as it
/// is read, so that a refused one's error points at its line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFields {
    #[serde(default, deserialize_with = "profile_lease")]
    lease: Option<Duration>,
    #[serde(default, deserialize_with = "profile_wait")]
    wait: Option<Duration>,
    #[serde(default, deserialize_with = "profile_namespace")]
    namespace: Option<String>,
    #[serde(default, alias = "replica_ack")]
    replica_acknowledgement: Option<bool>,
    #[serde(default, deserialize_with = "profile_hold_at_least")]
    hold_at_least: Option<Duration>,
    #[serde(default)]
    reentrant: Option<bool>,
}

/// The fields of [`LockOptions`] as written in a configuration file, each checked as it is read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OptionsFields {
    #[serde(default, deserialize_with = "options_lease")]
    lease: Option<Duration>,
    #[serde(default, deserialize_with = "options_namespace")]
    namespace: Option<String>,
    #[serde(default, alias = "replica_ack")]
    replica_acknowledgement: Option<bool>,
    #[serde(default, deserialize_with = "options_hold_at_least")]
    hold_at_least: Option<Duration>,
    #[serde(default)]
    reentrant: Option<bool>,
}

/// A profile's name, checked as it is read (see [`validate_name`]).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct ProfileName(String);

impl<'de> Deserialize<'de> for ProfileName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        validate_name(&name).map_err(de::Error::custom)?;
        Ok(ProfileName(name))
    }
}

/// `lease = "10s"`, `wait = "2s"`, `namespace = "..."`, `replica_acknowledgement = false`
/// (alias `replica_ack`), `hold_at_least = "9s"`, `reentrant = true`; every field optional. Ranges are checked when the profiles are
/// deserialized as [`Profiles`] or installed.
impl<'de> Deserialize<'de> for Profile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let fields = ProfileFields::deserialize(deserializer)?;
        Ok(Profile {
            lease: fields.lease,
            wait: fields.wait,
            namespace: fields.namespace,
            replica_acknowledgement: fields.replica_acknowledgement,
            hold_at_least: fields.hold_at_least,
            reentrant: fields.reentrant,
        })
    }
}

/// A map of profile names to [`Profile`]s; every profile and name is checked, and a name given
/// twice is refused (TOML refuses it itself; JSON and others would keep the last silently).
impl<'de> Deserialize<'de> for Profiles {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ByName;
        impl<'de> de::Visitor<'de> for ByName {
            type Value = std::collections::BTreeMap<String, Profile>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of lock profile names to profiles")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut by_name = std::collections::BTreeMap::new();
                while let Some(ProfileName(name)) = map.next_key()? {
                    let profile: Profile = map.next_value()?;
                    if by_name.contains_key(&name) {
                        return Err(de::Error::custom(format!(
                            "lock profile {name:?} is given twice; keep one"
                        )));
                    }
                    by_name.insert(name, profile);
                }
                Ok(by_name)
            }
        }
        let by_name = deserializer.deserialize_map(ByName)?;
        let profiles = Profiles { by_name };
        profiles.check().map_err(de::Error::custom)?;
        Ok(profiles)
    }
}

/// `lease = "10s"`, `namespace = "..."`, `replica_acknowledgement = false` (alias
/// `replica_ack`), `hold_at_least = "9s"`, `reentrant = true`; every field optional, checked as [`LockOptions`]'s setters document.
impl<'de> Deserialize<'de> for LockOptions {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let fields = OptionsFields::deserialize(deserializer)?;
        let mut options = LockOptions::new();
        if let Some(lease) = fields.lease {
            options = options.lease(lease);
        }
        if let Some(namespace) = fields.namespace {
            options = options.namespace(namespace);
        }
        if let Some(on) = fields.replica_acknowledgement {
            options = options.replica_acknowledgement(on);
        }
        if let Some(hold) = fields.hold_at_least {
            options = options.hold_at_least(hold);
        }
        if let Some(on) = fields.reentrant {
            options = options.reentrant(on);
        }
        Ok(options)
    }
}

/// A duration, refused unless `check` passes.
fn checked_duration<'de, D: Deserializer<'de>, E: fmt::Display>(
    deserializer: D,
    check: impl FnOnce(Duration) -> Result<(), E>,
) -> Result<Option<Duration>, D::Error> {
    let value = duration(deserializer)?;
    if let Some(value) = value {
        check(value).map_err(de::Error::custom)?;
    }
    Ok(value)
}

/// A namespace, refused unless `check` passes.
fn checked_namespace<'de, D: Deserializer<'de>, E: fmt::Display>(
    deserializer: D,
    check: impl FnOnce(&str) -> Result<(), E>,
) -> Result<Option<String>, D::Error> {
    let namespace = String::deserialize(deserializer)?;
    check(&namespace).map_err(de::Error::custom)?;
    Ok(Some(namespace))
}

fn profile_lease<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    checked_duration(d, check_lease)
}

fn profile_wait<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    checked_duration(d, check_wait)
}

fn profile_hold_at_least<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    checked_duration(d, check_hold_at_least)
}

fn profile_namespace<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    checked_namespace(d, check_namespace)
}

fn options_lease<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    checked_duration(d, validate_lease)
}

fn options_hold_at_least<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    checked_duration(d, validate_hold_at_least)
}

fn options_namespace<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    checked_namespace(d, validate_namespace)
}

/// An optional duration written as text.
fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    struct Text;
    impl Visitor<'_> for Text {
        type Value = Duration;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration such as \"150ms\", \"2s\", \"1m\", \"1h\" or \"1m30s\"")
        }
        fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
            parse_millis(text)
                .map(Duration::from_millis)
                .map_err(|error| E::custom(format!("invalid duration {text:?}: {error}")))
        }
        fn visit_u64<E: de::Error>(self, number: u64) -> Result<Duration, E> {
            Err(E::custom(format!(
                "a duration is text with a unit: write \"{number}s\" or \"{number}ms\", not \
                 {number}"
            )))
        }
        fn visit_i64<E: de::Error>(self, number: i64) -> Result<Duration, E> {
            Err(E::custom(format!(
                "a duration is text with a unit, e.g. \"2s\", not {number}"
            )))
        }
    }
    deserializer.deserialize_str(Text).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profiles(text: &str) -> Result<Profiles, String> {
        toml::from_str(text).map_err(|error| error.to_string())
    }

    #[test]
    fn profiles_from_toml() {
        let parsed = profiles(
            r#"
            [account-updates]
            lease = "10s"
            wait = "1m30s"
            namespace = "accounts"

            [reports]
            replica_ack = false

            [nightly]
            hold_at_least = "9s"
            reentrant = true
            "#,
        )
        .expect("valid");
        assert_eq!(
            parsed,
            Profiles::new()
                .with(
                    "account-updates",
                    Profile::new()
                        .lease(Duration::from_secs(10))
                        .wait(Duration::from_secs(90))
                        .namespace("accounts")
                )
                .with("reports", Profile::new().replica_acknowledgement(false))
                .with(
                    "nightly",
                    Profile::new()
                        .hold_at_least(Duration::from_secs(9))
                        .reentrant(true)
                )
        );
    }

    #[test]
    fn bad_profiles_are_clear_errors() {
        let cases = [
            ("[p]\nleese = \"1s\"", "unknown field `leese`"),
            ("[p]\nlease = \"1.5s\"", "fractional durations"),
            ("[p]\nwait = 2", "\"2s\""),
            ("[p]\nlease = \"10ms\"", "at least 30ms"),
            ("[p]\nwait = \"0s\"", "must be positive"),
            ("[p]\nhold_at_least = \"100000h\"", "at most one year"),
            ("[\"a b\"]\nwait = \"1s\"", "ASCII letters"),
        ];
        for (text, expected) in cases {
            let error = profiles(text).expect_err(text);
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    /// A refused value's error points at its line in the file, not at the whole document
    /// (helper 25: range and name checks ran on the finished map, so `toml` placed them at
    /// line 1).
    #[test]
    fn refused_values_name_their_line() {
        let cases = [
            ("[a]\nlease = \"1s\"\n\n[b]\nlease = \"10ms\"\n", "line 5"),
            ("[a]\nwait = \"1s\"\n[b]\nwait = \"0s\"\n", "line 4"),
            ("[a]\nwait = \"1s\"\n\n[\"a b\"]\nwait = \"1s\"\n", "line 4"),
            ("[a]\nwait = \"1s\"\n[b]\nnamespace = \" x \"\n", "line 4"),
            (
                "[a]\nwait = \"1s\"\n[b]\nhold_at_least = \"9000h\"\n",
                "line 4",
            ),
        ];
        for (text, line) in cases {
            let error = profiles(text).expect_err(text);
            assert!(error.contains(line), "{text}: {error}");
        }
        for (text, line) in [
            ("lease = \"2s\"\nnamespace = \" x \"\n", "line 2"),
            ("namespace = \"n\"\nlease = \"1ms\"\n", "line 2"),
            ("namespace = \"n\"\n\nhold_at_least = \"9000h\"\n", "line 3"),
        ] {
            let error = toml::from_str::<LockOptions>(text).expect_err(text);
            assert!(error.to_string().contains(line), "{text}: {error}");
        }
    }

    #[test]
    fn lock_options_from_toml() {
        let options: LockOptions =
            toml::from_str("lease = \"2s\"\nnamespace = \"n\"").expect("valid");
        let debug = format!("{options:?}");
        assert!(debug.contains("2s") && debug.contains("\"n\""), "{debug}");
        let error = toml::from_str::<LockOptions>("wait = \"2s\"").expect_err("no wait");
        assert!(
            error.to_string().contains("unknown field `wait`"),
            "{error}"
        );
        let error = toml::from_str::<LockOptions>("namespace = \"\"").expect_err("empty");
        assert!(error.to_string().contains("must not be empty"), "{error}");
        // Checked when read, as a profile's is (it was accepted, and refused by `lock_with`).
        let error =
            toml::from_str::<LockOptions>("hold_at_least = \"9000h\"").expect_err("too long");
        assert!(error.to_string().contains("at most one year"), "{error}");
    }

    /// A profile name given twice is refused in any format, not only TOML (which refuses it
    /// itself): JSON kept the last one silently (an audit).
    #[test]
    fn a_name_given_twice_is_refused() {
        let json = r#"{"p": {"lease": "5s"}, "p": {"lease": "9s"}}"#;
        let error = serde_json::from_str::<Profiles>(json).expect_err("a duplicate name");
        assert!(
            error.to_string().contains("\"p\" is given twice"),
            "{error}"
        );
        let one: Profiles =
            serde_json::from_str(r#"{"p": {"lease": "5s"}, "q": {"lease": "9s"}}"#).expect("two");
        assert_eq!(one.len(), 2);
        assert!(profiles("[p]\nlease = \"5s\"\n[p]\nlease = \"9s\"\n").is_err());
    }
}
