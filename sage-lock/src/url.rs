//! Server URLs: which schemes are accepted, clear errors for bad ones, passwords kept out of
//! every message.

use fred::types::config::{Config, Server, ServerConfig};

use crate::error::LockError;
use crate::topology::Deployment;

/// URL schemes fred understands; anything else is rejected before fred guesses.
const SCHEMES: [&str; 8] = [
    "redis",
    "rediss",
    "valkey",
    "valkeys",
    "redis-cluster",
    "rediss-cluster",
    "redis-sentinel",
    "rediss-sentinel",
];

/// The query parameters fred reads from a URL (its `sentinel-auth` ones excepted: the
/// Sentinels get the URL's own credentials).
const PARAMETERS: [&str; 2] = ["node", "sentinelServiceName"];

pub(crate) fn parse_url(url: &str) -> Result<Config, LockError> {
    // Whitespace around a URL (a configuration file, an environment variable) is no part of it.
    let url = url.trim();
    if url.is_empty() {
        return Err(LockError::invalid(
            "url",
            "the URL is empty (an unset environment variable?); expected redis://host:port[/db], \
             redis-sentinel://host:port?sentinelServiceName=NAME or \
             redis-cluster://host:port?node=host2:port2",
        ));
    }
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    if scheme.is_some_and(|scheme| scheme.to_ascii_lowercase().contains("unix")) {
        return Err(LockError::invalid(
            "url",
            format!(
                "{}: unix sockets are not supported (sage-lock connects over TCP); use \
                 redis://127.0.0.1:6379 (with the server's port), and for a local server bind it \
                 to 127.0.0.1",
                redact(url)
            ),
        ));
    }
    if !scheme.is_some_and(|scheme| SCHEMES.contains(&scheme.to_ascii_lowercase().as_str())) {
        let dashed = scheme.map(|scheme| scheme.to_ascii_lowercase().replace('+', "-"));
        let hint = match dashed {
            Some(dashed) if SCHEMES.contains(&dashed.as_str()) => {
                format!(" (did you mean `{dashed}://`?)")
            }
            _ => String::new(),
        };
        return Err(LockError::invalid(
            "url",
            format!(
                "{}{hint} has no supported scheme; expected redis://host:port[/db] (or valkey://, \
                 rediss:// for TLS), redis-sentinel://host:port?sentinelServiceName=NAME or \
                 redis-cluster://host:port?node=host2:port2 (with TLS: rediss-sentinel://, \
                 rediss-cluster://)",
                redact(url)
            ),
        ));
    }
    check_parameters(url)?;
    if scheme.is_some_and(crate::tls::scheme_uses_tls) {
        // fred builds its rustls configuration for rediss:// from the process-wide provider.
        crate::tls::install_crypto_provider();
    }
    let mut config = Config::from_url(url).map_err(|error| {
        LockError::invalid(
            "url",
            format!(
                "{} is not a valid server URL ({}){}; expected redis://host:port[/db], \
                 redis-sentinel://host:port?sentinelServiceName=NAME or \
                 redis-cluster://host:port?node=host2:port2",
                redact(url),
                error.details(),
                unencoded_credentials_hint(url)
            ),
        )
    })?;
    // fred sends no `AUTH` without a password, so `redis://bob@host` would run as the
    // `default` user: authenticate as the user named, with an empty password (which a
    // `nopass` user accepts, and a user with a password refuses, with a clear error).
    if config.username.is_some() && config.password.is_none() {
        config.password = Some(String::new());
    }
    // fred ignores a cluster URL's path: a database there would be silently dropped.
    let path = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['?', '#']).next()?.split_once('/'))
        .map(|(_, path)| path.trim_end_matches('/'));
    if let (ServerConfig::Clustered { .. }, Some(database)) = (&config.server, path)
        && !database.is_empty()
        && database != "0"
    {
        return Err(LockError::invalid(
            "url",
            format!(
                "{} names database {database}, but a cluster has only database 0: remove the \
                 /{database}",
                redact(url)
            ),
        ));
    }
    Ok(config)
}

/// Where the user information of `url` ends: at its last `@` (a password may hold `@`, `/`, `?`
/// or `#` unencoded), unless that `@` is in a query parameter's value.
fn credentials_end(url: &str) -> Option<usize> {
    let at = url.rfind('@')?;
    match url[..at].find('?') {
        Some(mark) if url[mark..at].contains('=') => url[..mark].rfind('@'),
        _ => Some(at),
    }
}

/// A hint for a URL that does not parse because its user name or password holds a character
/// that ends the host part (`/`, `?`, `#`): they must be percent-encoded. Empty otherwise.
fn unencoded_credentials_hint(url: &str) -> &'static str {
    let Some(at) = credentials_end(url) else {
        return "";
    };
    let start = url[..at].find("://").map_or(0, |scheme| scheme + 3);
    if url[start..at].contains(['/', '?', '#']) {
        " (the user name or password holds `/`, `?` or `#`: percent-encode them as %2F, %3F \
         and %23, and `@` as %40)"
    } else {
        ""
    }
}

/// Refuses a query parameter fred would silently ignore: an unknown or miscased one, and the
/// Sentinel credentials (fred sends the URL's own user and password to the Sentinels).
fn check_parameters(url: &str) -> Result<(), LockError> {
    // A `?` in an unencoded password is no query (`Config::from_url` refuses it, with a hint).
    let after_credentials = &url[credentials_end(url).unwrap_or(0)..];
    let Some((_, query)) = after_credentials.split_once('?') else {
        return Ok(());
    };
    for name in query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').map_or(pair, |(name, _)| name))
    {
        if PARAMETERS.contains(&name) {
            let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
            let scheme = scheme.to_ascii_lowercase();
            let sentinel = scheme.ends_with("-sentinel");
            let wrong = match name {
                "node" if !(sentinel || scheme.ends_with("-cluster")) => Some(
                    "`node` (more addresses) means something only in a redis-cluster:// or \
                     redis-sentinel:// URL",
                ),
                "sentinelServiceName" if !sentinel => {
                    Some("`sentinelServiceName` means something only in a redis-sentinel:// URL")
                }
                _ => None,
            };
            if let Some(wrong) = wrong {
                return Err(LockError::invalid(
                    "url",
                    format!(
                        "{}: {wrong}; this scheme's client would ignore it: remove it, or use \
                         the scheme of that deployment",
                        redact(url)
                    ),
                ));
            }
            continue;
        }
        let message = if name.eq_ignore_ascii_case("sentinelUsername")
            || name.eq_ignore_ascii_case("sentinelPassword")
        {
            format!(
                "`{name}` is not supported: sage-lock sends the URL's own user and password \
                 (redis-sentinel://user:password@host:port) to the Sentinels too, so give them \
                 the same credentials, and remove `{name}`"
            )
        } else if let Some(known) = PARAMETERS
            .iter()
            .find(|known| known.eq_ignore_ascii_case(name))
        {
            format!("unknown URL parameter `{name}`: did you mean `{known}`?")
        } else {
            format!(
                "unknown URL parameter `{name}` in {}: the parameters are `node` (more \
                 addresses of a cluster or of the Sentinels) and `sentinelServiceName`",
                redact(url)
            )
        };
        return Err(LockError::invalid("url", message));
    }
    Ok(())
}

/// The URL with its credentials replaced by `***`: the user information before the host (with
/// or without a well-formed scheme) and the value of every query parameter whose name mentions
/// a password (`sentinelPassword=`).
pub(crate) fn redact(url: &str) -> String {
    let at = credentials_end(url);
    let (head, query) = match url[at.unwrap_or(0)..].find('?') {
        Some(mark) => {
            let mark = at.unwrap_or(0) + mark;
            (&url[..mark], Some(&url[mark + 1..]))
        }
        None => (url, None),
    };
    let mut shown = match at {
        Some(at) => {
            let start = head[..at]
                .find("://")
                .map(|scheme| scheme + 3)
                .or_else(|| head[..at].rfind('/').map(|slash| slash + 1))
                .unwrap_or(0);
            format!("{}***{}", &head[..start], &head[at..])
        }
        None => head.to_owned(),
    };
    if let Some(query) = query {
        let parameters: Vec<String> = query
            .split('&')
            .map(|parameter| match parameter.split_once('=') {
                Some((name, _)) if name.to_ascii_lowercase().contains("pass") => {
                    format!("{name}=***")
                }
                _ => parameter.to_owned(),
            })
            .collect();
        shown.push('?');
        shown.push_str(&parameters.join("&"));
    }
    shown
}

pub(crate) fn describe(config: &Config) -> String {
    let hosts: Vec<String> = config
        .server
        .hosts()
        .iter()
        .map(|s| format!("{}:{}", s.host, s.port))
        .collect();
    format!("{} ({:?})", hosts.join(","), Deployment::of(&config.server))
}

/// [`describe`], followed by the node whose connection broke last when fred named one that is
/// not the one address the client was given (a cluster's node, a Sentinel's primary): fred
/// names the node of a connection that breaks, not of a reconnection that fails.
pub(crate) fn describe_node(config: &Config, lost: Option<&Server>) -> String {
    let deployment = describe(config);
    match lost {
        Some(node) if !(config.server.hosts().len() == 1 && config.server.hosts()[0] == *node) => {
            format!(
                "{deployment}; the connection lost last was to {}:{}",
                node.host, node.port
            )
        }
        _ => deployment,
    }
}

/// What to tell the user about a connection that failed: the URL names the wrong kind of
/// server or a missing database, the ACL denies a command of the handshake, or else what
/// [`crate::tls::connect_hint`] says (credentials, certificates, an unreachable server).
pub(crate) fn connect_failure_hint(
    error: &fred::error::Error,
    database: Option<u8>,
    tls: bool,
) -> String {
    mismatch_hint(error, database)
        .or_else(|| crate::acl::denial_hint(error, None))
        .unwrap_or_else(|| crate::tls::connect_hint(error, tls).to_owned())
}

/// What to tell the user when the first connection failed because the URL names the wrong kind
/// of server, or a database the server does not have; `None` for any other failure.
pub(crate) fn mismatch_hint(error: &fred::error::Error, database: Option<u8>) -> Option<String> {
    let details = error.details();
    if details.contains("cluster support disabled") {
        Some(
            "the server is not a cluster node (cluster-enabled no): connect to it with redis:// \
             (a primary with replicas: LockClientBuilder::replicated(true)), or give \
             redis-cluster:// the address of a cluster node"
                .to_owned(),
        )
    } else if details.contains("unknown command") && details.contains("SENTINEL") {
        Some(
            "the server is not a Sentinel: redis-sentinel:// takes the Sentinels' addresses \
             (port 26379 by default) and asks them for the primary; connect to a data node with \
             redis://"
                .to_owned(),
        )
    } else if details.contains("Failed to connect to all sentinel nodes") {
        // fred keeps each Sentinel's own error to itself: name the likely causes.
        Some(
            "no Sentinel accepted the connection: are they running and reachable at these \
             addresses (port 26379 by default)? Each Sentinel must also accept the URL's \
             credentials (user and password), as the data nodes do (create the same ACL user \
             on every Sentinel; see the README's \"Security: TLS and ACL\"); Sentinels that \
             accept only TLS need rediss-sentinel://"
                .to_owned(),
        )
    } else if details.contains("Missing primary address in response from sentinel") {
        Some(
            "the Sentinels know no primary by the URL's service name: check \
             sentinelServiceName=NAME against `SENTINEL MASTERS` on a Sentinel"
                .to_owned(),
        )
    } else if details.contains("Invalid or missing cluster state") {
        Some(
            "the cluster node has no usable slot map (CLUSTER INFO: cluster_state not ok, or \
             no slots assigned): finish setting the cluster up, e.g. redis-cli --cluster create \
             or --cluster fix"
                .to_owned(),
        )
    } else if details.contains("DB index is out of range") {
        let named = database.map_or_else(
            || "the URL's database".to_owned(),
            |db| format!("database {db}"),
        );
        Some(format!(
            "the server has no {named}: it has as many as its `databases` setting (16 by \
             default), numbered from 0; fix the /N at the end of the URL"
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_are_invalid_arguments_without_passwords() {
        let Err(err) = parse_url("http://user:secret@host:1") else {
            panic!("accepted an http URL")
        };
        let text = err.to_string();
        assert!(
            text.contains("url") && text.contains("redis://host:port"),
            "{text}"
        );
        assert!(!text.contains("secret"), "{text}");
    }

    #[test]
    fn credentials_stay_hidden_in_malformed_urls_and_query_passwords() {
        let cases = [
            (
                "redis:/user:secretA@127.0.0.1:6379",
                "redis:/***@127.0.0.1:6379",
            ),
            (
                "redis//user:secretB@127.0.0.1:6379",
                "redis//***@127.0.0.1:6379",
            ),
            ("user:secretD@127.0.0.1:6379", "***@127.0.0.1:6379"),
            ("redis://u:pw@h:1/0", "redis://***@h:1/0"),
            (
                "redis-sentinel://h:1?sentinelServiceName=x&sentinelPassword=secretJ",
                "redis-sentinel://h:1?sentinelServiceName=x&sentinelPassword=***",
            ),
            (
                "redis+sentinel://h:1?password=secretL",
                "redis+sentinel://h:1?password=***",
            ),
            ("redis://h:1/0?x=a@b", "redis://h:1/0?x=a@b"),
            ("redis://h:1", "redis://h:1"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact(url), shown, "{url}");
        }
        for url in [
            "redis:/user:secretA@127.0.0.1:6379",
            "redis//user:secretB@127.0.0.1:6379",
            "user:secretD@127.0.0.1:6379",
            "redis-sentinel://127.0.0.1:1?sentinelServiceName=x&sentinelPassword=secretJ&x",
            "redis-sentinel://127.0.0.1:1?sentinelPassword=secretL",
        ] {
            let text = parse_url(url).map_or_else(|err| err.to_string(), |_| String::new());
            assert!(!text.contains("secret"), "{text}");
        }
    }

    /// The message of `url`'s refusal ("accepted" when it parses).
    fn refusal(url: &str) -> String {
        parse_url(url).map_or_else(|err| err.to_string(), |_| "accepted".to_owned())
    }

    /// A password with `/`, `?` or `#` in it, not percent-encoded, ends the host part early;
    /// fred then reported only "Invalid port" (an audit).
    #[test]
    fn unencoded_password_characters_are_named() {
        for url in [
            "redis://:se/cret@127.0.0.1:6379",
            "redis://user:se#cret@127.0.0.1:6379",
            "redis://:se?cret@127.0.0.1:6379",
        ] {
            let text = refusal(url);
            assert!(text.contains("percent-encode"), "{url}: {text}");
            assert!(!text.contains("cret"), "{url}: the password shown: {text}");
        }
        assert_eq!(
            redact("redis://:pa?ss@h:1?node=x"),
            "redis://***@h:1?node=x"
        );
        assert_eq!(
            redact("redis-sentinel://h:1?sentinelPassword=p@ss"),
            "redis-sentinel://h:1?sentinelPassword=***"
        );
        // An `@` alone is taken as part of the password (the last one ends it).
        assert_eq!(refusal("redis://:p@ss@127.0.0.1:6379"), "accepted");
        assert!(!refusal("redis://127.0.0.1:notaport").contains("percent-encode"));
    }

    #[test]
    fn surrounding_whitespace_is_ignored_on_both_sides() {
        assert_eq!(refusal(" redis://127.0.0.1:6379"), "accepted");
        assert_eq!(refusal("redis://127.0.0.1:6379\n"), "accepted");
    }

    #[test]
    fn a_plus_in_the_scheme_gets_the_dashed_spelling() {
        let text = refusal("redis+sentinel://127.0.0.1:26379?sentinelServiceName=m");
        assert!(text.contains("did you mean `redis-sentinel://`"), "{text}");
        let text = refusal("rediss+cluster://127.0.0.1:7000");
        assert!(text.contains("did you mean `rediss-cluster://`"), "{text}");
    }

    /// `node` means something only to a cluster or Sentinel URL, `sentinelServiceName` only to a
    /// Sentinel URL: elsewhere fred ignores them (helper 29).
    #[test]
    fn parameters_of_another_scheme_are_refused() {
        for (url, name) in [
            ("redis://127.0.0.1:6379?node=127.0.0.1:6380", "node"),
            (
                "rediss://127.0.0.1:6379?sentinelServiceName=m",
                "sentinelServiceName",
            ),
            (
                "valkey://127.0.0.1:6379?sentinelServiceName=m",
                "sentinelServiceName",
            ),
            (
                "redis-cluster://127.0.0.1:7000?sentinelServiceName=m",
                "sentinelServiceName",
            ),
        ] {
            let text = refusal(url);
            assert!(
                text.contains(&format!("`{name}`")) && text.contains("only"),
                "{url}: {text}"
            );
        }
        for url in [
            "redis-cluster://127.0.0.1:7000?node=127.0.0.1:7001",
            "rediss-sentinel://127.0.0.1:26379?sentinelServiceName=m&node=127.0.0.1:26380",
        ] {
            assert_eq!(refusal(url), "accepted", "{url}");
        }
    }

    #[test]
    fn query_parameters_fred_would_ignore_are_refused() {
        let text = refusal("redis://127.0.0.1:6379?foo=bar");
        assert!(
            text.contains("unknown URL parameter `foo`") && text.contains("sentinelServiceName"),
            "{text}"
        );
        let text = refusal("redis-sentinel://127.0.0.1:26379?sentinelservicename=m");
        assert!(
            text.contains("did you mean `sentinelServiceName`"),
            "{text}"
        );
        let text = refusal(
            "redis-sentinel://127.0.0.1:26379?sentinelServiceName=m&sentinelPassword=secretX",
        );
        assert!(
            text.contains("sentinelPassword") && text.contains("same") && !text.contains("secretX"),
            "{text}"
        );
        assert_eq!(
            refusal(
                "redis-sentinel://u:p@127.0.0.1:26379/1?sentinelServiceName=m&node=127.0.0.1:26380"
            ),
            "accepted"
        );
        assert_eq!(
            refusal("redis-cluster://127.0.0.1:7000?node=127.0.0.1:7001&node=127.0.0.1:7002"),
            "accepted"
        );
    }

    #[test]
    fn a_unix_socket_url_is_refused_as_unsupported() {
        let Err(err) = parse_url("redis+unix:///tmp/redis.sock") else {
            panic!("accepted a unix socket URL")
        };
        let text = err.to_string();
        assert!(
            text.contains("unix sockets are not supported") && text.contains("redis://"),
            "{text}"
        );
    }

    #[test]
    fn deployment_comes_from_the_url() {
        let cluster = parse_url("redis-cluster://127.0.0.1:7000?node=127.0.0.1:7001");
        assert_eq!(
            cluster.ok().map(|c| Deployment::of(&c.server)),
            Some(Deployment::Cluster)
        );
        let plain = parse_url("valkey://127.0.0.1:6379");
        assert_eq!(
            plain.ok().map(|c| Deployment::of(&c.server)),
            Some(Deployment::Standalone)
        );
    }

    #[test]
    fn a_cluster_url_naming_a_database_is_refused() {
        let Err(err) = parse_url("redis-cluster://127.0.0.1:7000/1") else {
            panic!("accepted a cluster URL with a database")
        };
        assert!(err.to_string().contains("only database 0"), "{err}");
        assert!(parse_url("redis-cluster://127.0.0.1:7000/0").is_ok());
    }

    #[test]
    fn an_empty_url_says_so() {
        let Err(err) = parse_url("  ") else {
            panic!("accepted an empty URL")
        };
        assert!(err.to_string().contains("the URL is empty"), "{err}");
    }

    #[test]
    fn a_wrong_service_name_and_an_unready_cluster_are_named_not_taken_for_tls() {
        use fred::error::{Error, ErrorKind};
        let sentinel = Error::new(
            ErrorKind::Sentinel,
            "Missing primary address in response from sentinel node.",
        );
        let hint = connect_failure_hint(&sentinel, None, false);
        assert!(
            hint.contains("sentinelServiceName") && !hint.contains("rediss://"),
            "{hint}"
        );
        let cluster = Error::new(ErrorKind::Protocol, "Invalid or missing cluster state.");
        let hint = connect_failure_hint(&cluster, None, false);
        assert!(
            hint.contains("cluster_state") && !hint.contains("rediss://"),
            "{hint}"
        );
    }
}
