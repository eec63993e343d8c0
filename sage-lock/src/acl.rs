//! ACL denials (`NOPERM`): which permission the server refused, and the grant that fixes it.

use fred::error::Error;

use crate::key::scan_pattern;
use crate::scripts::source_line;

/// Where the README lists every permission sage-lock needs.
const RULE: &str = "the README's \"Security: TLS and ACL\" section has the whole ACL rule";

/// A hint for `error` when it is an ACL denial (`NOPERM`, or a denied command inside a
/// script), naming the grant that fixes it; `namespace` makes the key and channel patterns
/// concrete.
pub(crate) fn denial_hint(error: &Error, namespace: Option<&str>) -> Option<String> {
    let details = error.details();
    let lower = details.to_ascii_lowercase();
    // A denial inside a script has no NOPERM: Redis answers "ERR The user executing the script
    // can't run this command or subcommand script: SHA, on @user_script:LINE.", Valkey "ERR ACL
    // failure in script: User U has no permissions to run the 'incr' command script: ...".
    let in_script = lower.contains("the user executing the script can't")
        || lower.contains("acl failure in script");
    if !details.contains("NOPERM") && !in_script {
        return None;
    }
    // "{ns:*}" with the namespace escaped as lock keys escape it.
    let pattern = namespace.map_or_else(
        || "{NAMESPACE:*}".to_owned(),
        |namespace| String::from_utf8_lossy(&scan_pattern(namespace)).into_owned(),
    );
    let keys = pattern.strip_suffix('}').unwrap_or(&pattern);
    let command = denied_command(&lower).or_else(|| script_command(details));
    let hint = if let Some(command) = command {
        format!(
            "the server's ACL denies the '{command}' command: grant +{command} to this user; \
             {RULE}"
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

/// Whether `error` is a denial of the command itself or of its declared keys (`NOPERM` as the
/// reply): the server refused it before running anything, so it changed nothing. (A command
/// denied inside a script replies `ERR ...`, after the script's earlier calls ran.)
pub(crate) fn refused_before_running(error: &Error) -> bool {
    error.details().trim_start().starts_with("NOPERM")
}

/// `evalsha` from "... no permissions to run the 'evalsha' command".
fn denied_command(lower: &str) -> Option<String> {
    let end = lower.find("' command")?;
    let start = lower[..end].rfind('\'')? + 1;
    Some(lower[start..end].to_owned())
}

/// The command a script calls on the line a "can't run this command" error names
/// ("script: SHA, on @user_script:LINE").
fn script_command(details: &str) -> Option<String> {
    if !details.contains("can't run this command") {
        return None;
    }
    let after = |marker: &str| details.find(marker).map(|at| &details[at + marker.len()..]);
    let sha: String = after("script: ")?
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    let line: String = after("@user_script:")?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let source = source_line(&sha, line.parse().ok()?)?;
    let call = &source[source.find("call('")? + "call('".len()..];
    Some(call[..call.find('\'')?].to_ascii_lowercase())
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
        let script =
            crate::scripts::Script::new("local a = 1\nreturn redis.call('PEXPIRETIME', KEYS[1])");
        let sha = fred::util::sha1_hash("local a = 1\nreturn redis.call('PEXPIRETIME', KEYS[1])");
        let inner = hint(
            &format!(
                "ERR The user executing the script can't run this command or subcommand \
                 script: {sha}, on @user_script:2."
            ),
            None,
        )
        .unwrap_or_default();
        assert!(inner.contains("grant +pexpiretime"), "{inner}");
        drop(script);
    }
}
