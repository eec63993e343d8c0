//! The fred settings lock safety relies on, and fred's first connection.

use std::time::Duration;

use fred::clients::Client;
use fred::error::Error;
use fred::interfaces::ClientLike;
use fred::types::config::{Config, ReconnectPolicy};
use fred::types::{Builder, ConnectHandle};

/// A connection task that is aborted when this is dropped, unless [`AbortOnDrop::keep`] took
/// it out first.
pub(super) struct AbortOnDrop(pub(super) Option<ConnectHandle>);

impl AbortOnDrop {
    /// The task, no longer aborted on drop.
    pub(super) fn keep(mut self) -> Option<ConnectHandle> {
        self.0.take()
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// The outcome of `fred`'s first connection, whose task is `task`: connected, or the error that
/// ended the task (fred fails fast on a first connection).
pub(super) async fn first_connection(fred: &Client, task: &mut ConnectHandle) -> Result<(), Error> {
    let connected = async {
        // The state is polled too: `wait_for_connect` subscribes after `connect` spawned the
        // task, so it can miss a notification sent in between.
        let polled = async {
            while !fred.is_connected() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::select! {
            outcome = fred.wait_for_connect() => outcome,
            () = polled => Ok(()),
        }
    };
    tokio::select! {
        outcome = connected => outcome,
        ended = task => Err(match ended {
            Ok(Err(error)) => error,
            Ok(Ok(())) => Error::new(fred::error::ErrorKind::Canceled, "the connection closed"),
            Err(join) => Error::new(fred::error::ErrorKind::Unknown, join.to_string()),
        }),
    }
}

/// A fred client for `config` with the settings lock safety relies on (see
/// [`LockClient::from_fred`](crate::LockClient::from_fred)) and the given timeouts and
/// reconnection policy; `connection` and `perf` supply everything else.
pub(super) fn build_fred(
    mut config: Config,
    mut connection: fred::types::config::ConnectionConfig,
    mut perf: fred::types::config::PerformanceConfig,
    connect_timeout: Duration,
    command_timeout: Duration,
    reconnect: &ReconnectPolicy,
) -> Result<Client, Error> {
    // The lock layer owns retries: fred must never re-send a command on its own, nor follow a
    // cluster redirection (it would split a script from its ROLE/WAIT checks; see redirect.rs).
    connection.max_command_attempts = 1;
    connection.max_redirections = 0;
    connection.connection_timeout = connect_timeout;
    // Unnamed: the name would be this client's random fred id, and `CLIENT SETNAME` in every
    // handshake is a command the documented ACL rule does not grant (no connection at all).
    connection.auto_client_setname = false;
    connection.internal_command_timeout = command_timeout;
    // A demoted primary answers READONLY without dropping the connection: reconnect (through
    // Sentinel, to the new primary) instead of failing writes until then.
    for error in [
        fred::types::config::ReconnectError::MasterDown,
        fred::types::config::ReconnectError::ReadOnly,
    ] {
        if !connection.reconnect_errors.contains(&error) {
            connection.reconnect_errors.push(error);
        }
    }
    perf.default_command_timeout = command_timeout;
    // A first connection that fails ends at once, with its cause: `connect` bounds it by its own
    // deadline and names that cause, and a client whose first connection ended is connected
    // again on its next use. Retried by fred instead, a wrong password waited out the deadline
    // and was reported as an unreachable server.
    config.fail_fast = true;
    let mut builder = Builder::from_config(config);
    builder
        .set_policy(reconnect.clone())
        .set_connection_config(connection)
        .set_performance_config(perf);
    builder.build()
}
