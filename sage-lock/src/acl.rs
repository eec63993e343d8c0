//! ACL denials (`NOPERM`): which permission the server refused, and the grant that fixes it.

use fred::error::Error;

use crate::key::scan_pattern;

/// Where the README lists every permission sage-lock needs.
const RULE: &str = "the README's \"Security: TLS and ACL\" section has the whole ACL rule";

/// A hint for `error` when it is an ACL denial (also one raised inside a script), naming the
/// grant that fixes it; `namespace` makes the key and channel patterns concrete.
pub(crate) fn denial_hint(error: &Error, namespace: Option<&str>) -> Option<String> {
    let details = error.details();
    if !details.contains("NOPERM") {
        return None;
    }
    // "{ns:*}" with the namespace escaped as lock keys escape it.
    let pattern = namespace.map_or_else(
        || "{NAMESPACE:*}".to_owned(),
        |namespace| String::from_utf8_lossy(&scan_pattern(namespace)).into_owned(),
    );
    let keys = pattern.strip_suffix('}').unwrap_or(&pattern);
    let lower = details.to_ascii_lowercase();
    let hint = if let Some(command) = denied_command(&lower) {
        format!(
            "the server's ACL denies the '{command}' command: grant +{command} to this user; {RULE}"
        )
    } else if lower.contains("channel") {
        format!(
            "the server's ACL denies the release notification channel: grant \
             &{pattern}:released to this user; {RULE}"
        )
    } else if lower.contains("key") {
        format!("the server's ACL denies this namespace's keys: grant ~{keys} to this user; {RULE}")
    } else {
        format!("the server's ACL denies something sage-lock needs; {RULE}")
    };
    Some(hint)
}

/// `evalsha` from "... no permissions to run the 'evalsha' command".
fn denied_command(lower: &str) -> Option<String> {
    let end = lower.find("' command")?;
    let start = lower[..end].rfind('\'')? + 1;
    Some(lower[start..end].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fred::error::ErrorKind;

    fn hint(text: &str, namespace: Option<&str>) -> Option<String> {
        denial_hint(&Error::new(ErrorKind::Unknown, text.to_owned()), namespace)
    }

    #[test]
    fn denials_name_the_grant() {
        let redis = "NOPERM this user has no permissions to run the 'evalsha' command";
        let valkey = "NOPERM User app has no permissions to run the 'EVALSHA' command";
        for text in [redis, valkey] {
            let hint = hint(text, Some("app")).unwrap_or_default();
            assert!(hint.contains("grant +evalsha"), "{hint}");
        }
        let keys = hint(
            "NOPERM this user has no permissions to access one of the keys used as arguments",
            Some("a*b"),
        )
        .unwrap_or_default();
        assert!(keys.contains("grant ~{a\\*b:*"), "{keys}");
        let channel = hint(
            "ERR Error running script: NOPERM this user has no permissions to access one of the \
             channels used as arguments",
            None,
        )
        .unwrap_or_default();
        assert!(channel.contains("&{NAMESPACE:*}:released"), "{channel}");
        assert_eq!(hint("WRONGTYPE Operation", Some("app")), None);
    }
}
