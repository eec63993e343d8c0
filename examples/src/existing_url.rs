//! `SAGE_LOCK_URL`: whether the server it names answers at all, and how to print it.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long a probe waits for each of the URL's addresses to accept a TCP connection.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The first `host:port` a server URL names (`redis://[user:pw@]host[:port][/db]`, also the
/// `valkey`, `rediss`, `-sentinel` and `-cluster` schemes), with the scheme's default port when
/// it has none; `None` when `url` has no such address (the lock client then reports what is
/// wrong with it).
#[must_use]
pub fn first_address(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    if host_port.is_empty() {
        return None;
    }
    let has_port = match host_port.rfind(']') {
        Some(bracket) => host_port[bracket..].contains(':'),
        None => host_port.contains(':'),
    };
    if has_port {
        return Some(host_port.to_owned());
    }
    let port = if scheme.contains("sentinel") {
        26379
    } else {
        6379
    };
    Some(format!("{host_port}:{port}"))
}

/// `Err` with the reason when nothing accepts a TCP connection at `url`'s first address;
/// `Ok` when something does, or when `url` names no address this can check.
///
/// # Errors
/// The address and why it could not be reached (refused, timed out, no such host).
pub fn probe(url: &str) -> Result<(), String> {
    let Some(address) = first_address(url) else {
        return Ok(());
    };
    let resolved = address
        .to_socket_addrs()
        .map_err(|error| format!("{address}: {error}"))?;
    let mut last = format!("{address}: resolves to no address");
    for addr in resolved {
        match TcpStream::connect_timeout(&addr, PROBE_TIMEOUT) {
            Ok(_) => return Ok(()),
            Err(error) => last = format!("{address}: {error}"),
        }
    }
    Err(last)
}

/// `url` with its credentials (between `://` and `@`, and any query parameter naming a
/// password) replaced by `***`, for printing.
#[must_use]
pub fn redact(url: &str) -> String {
    // The credentials end at the last `@` that is not in a query value: an unencoded password
    // may hold `@`, `/`, `?` or `#`.
    let at = url.rfind('@').and_then(|at| match url[..at].find('?') {
        Some(mark) if url[mark..at].contains('=') => url[..mark].rfind('@'),
        _ => Some(at),
    });
    let after = at.unwrap_or(0);
    let (url, query) = url[after..].find('?').map_or((url, None), |mark| {
        (&url[..after + mark], Some(&url[after + mark + 1..]))
    });
    let mut shown = match (url.split_once("://"), at) {
        (Some((scheme, _)), Some(at)) => format!("{scheme}://***{}", &url[at..]),
        _ => url.to_owned(),
    };
    if let Some(query) = query {
        let masked: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if name.to_ascii_lowercase().contains("pass") => {
                    format!("{name}=***")
                }
                _ => pair.to_owned(),
            })
            .collect();
        shown = format!("{shown}?{}", masked.join("&"));
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::{first_address, probe, redact};

    #[test]
    fn first_address_reads_the_host_and_port_of_every_scheme() {
        let cases = [
            ("redis://127.0.0.1:6390", Some("127.0.0.1:6390")),
            ("redis://user:p@ss@host:1/2", Some("host:1")),
            ("valkey://host", Some("host:6379")),
            ("rediss://host/0", Some("host:6379")),
            ("redis-sentinel://h?sentinelServiceName=m", Some("h:26379")),
            ("redis-cluster://h:7000?node=h2:7001", Some("h:7000")),
            ("redis://[::1]:7000", Some("[::1]:7000")),
            ("redis://[::1]", Some("[::1]:6379")),
            ("redis://", None),
            ("127.0.0.1:6379", None),
        ];
        for (url, expected) in cases {
            assert_eq!(first_address(url).as_deref(), expected, "{url}");
        }
    }

    #[test]
    fn a_closed_port_is_unreachable_and_names_its_address() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .expect("a free port");
        let why = probe(&format!("redis://127.0.0.1:{port}")).expect_err("nothing listens");
        assert!(why.starts_with(&format!("127.0.0.1:{port}: ")), "{why}");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        let open = listener.local_addr().expect("its address").port();
        assert_eq!(probe(&format!("redis://127.0.0.1:{open}")), Ok(()));
        assert_eq!(probe("not a url"), Ok(()));
    }

    #[test]
    fn redact_hides_credentials_only() {
        assert_eq!(redact("redis://u:pw@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1/0?x=a@b"), "redis://h:1/0?x=a@b");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        // Unencoded `?`, `/` or `#` in a password (the URL is refused later; not its password).
        assert_eq!(redact("redis://:se?cret@h:1"), "redis://***@h:1");
        assert_eq!(redact("redis://:se/cret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://u:se#cret@h:1"), "redis://***@h:1");
        assert_eq!(
            redact("redis-sentinel://h:1?sentinelServiceName=m&sentinelPassword=pw"),
            "redis-sentinel://h:1?sentinelServiceName=m&sentinelPassword=***"
        );
    }
}
