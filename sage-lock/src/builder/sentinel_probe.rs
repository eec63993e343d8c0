//! What a Sentinel answered: fred tries each Sentinel and, when none accepts the connection,
//! keeps none of their errors ("Failed to connect to all sentinel nodes"). Asking the first one
//! alone, with the same credentials and TLS settings, recovers its own answer for the error.
//! When a Sentinel did answer and the primary it named refused, the error names that primary
//! rather than only the Sentinels of the URL.

use std::time::Duration;

use fred::interfaces::ClientLike;
use fred::types::config::{Config, ReconnectPolicy, ServerConfig};

use super::fred_settings::{AbortOnDrop, build_fred, first_connection};

/// How long the first Sentinel gets to answer alone.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// `config` (a Sentinel configuration) with its first Sentinel as a plain server, or `None`
/// for any other configuration.
pub(super) fn first_sentinel(config: &Config) -> Option<Config> {
    let ServerConfig::Sentinel { hosts, .. } = &config.server else {
        return None;
    };
    let first = hosts.first()?.clone();
    let mut alone = config.clone();
    alone.server = ServerConfig::Centralized { server: first };
    // A Sentinel has no databases: `SELECT` would be its answer instead.
    alone.database = None;
    Some(alone)
}

/// Connects to the Sentinel `alone` names (see [`first_sentinel`]) and says what it answered
/// when it refused, as `asked alone, the Sentinel at H:P answered: HINT: ERROR`; `None` when it
/// accepted the connection (the cause lies elsewhere) or the probe could not run.
pub(super) async fn what_the_first_sentinel_said(alone: Config) -> Option<String> {
    let ServerConfig::Centralized { server } = &alone.server else {
        return None;
    };
    let address = format!("{}:{}", server.host, server.port);
    let tls = alone.tls.is_some();
    let fred = build_fred(
        alone,
        fred::types::config::ConnectionConfig::default(),
        fred::types::config::PerformanceConfig::default(),
        PROBE_TIMEOUT,
        PROBE_TIMEOUT,
        &ReconnectPolicy::default(),
    )
    .ok()?;
    let mut task = AbortOnDrop(None);
    let handle = task.0.insert(fred.connect());
    let outcome = tokio::time::timeout(PROBE_TIMEOUT, first_connection(&fred, handle)).await;
    let error = match outcome {
        Ok(Err(error)) => error,
        // Accepted, or silent: nothing more to say than the Sentinels' own error.
        Ok(Ok(())) | Err(_) => return None,
    };
    let hint = crate::acl::denial_hint(&error, None)
        .unwrap_or_else(|| crate::tls::connect_hint(&error, tls).to_owned());
    Some(format!(
        "asked alone, the Sentinel at {address} answered: {hint}: {error}"
    ))
}

/// When the Sentinels of `sentinels` (a Sentinel configuration) accept the connection and name
/// the primary, which the failed first connection then reached: says so, as `the Sentinels
/// accepted the connection and named the primary H:P, which failed it`, with a word on
/// credentials (the URL's go to both) when `error` is a refusal of them. `None` when no Sentinel names one within
/// [`PROBE_TIMEOUT`]: the failure is the Sentinels' own.
pub(super) async fn what_the_primary_refused(
    sentinels: &Config,
    error: &fred::error::Error,
) -> Option<String> {
    let deadline = tokio::time::Instant::now() + PROBE_TIMEOUT;
    let primary = crate::sentinel::primary_per_sentinels(sentinels, deadline).await?;
    let details = error.details();
    let credentials = if [
        "WRONGPASS",
        "NOAUTH",
        "invalid password",
        "invalid username-password",
    ]
    .iter()
    .any(|word| details.contains(word))
    {
        " (the URL's user name and password go to the Sentinels and to the data nodes alike: \
         the user must exist, with the same password, on both)"
    } else {
        ""
    };
    Some(format!(
        "the Sentinels accepted the connection and named the primary {}:{}, which failed \
         it{credentials}",
        primary.host, primary.port
    ))
}
