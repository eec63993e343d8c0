//! Why the shared connection is down: the last connection error fred reported, kept so that a
//! call that got no reply can say what happened (wrong credentials, a refused connection)
//! instead of only that the wait ran out.

use std::sync::Mutex;

use fred::clients::Client;
use fred::error::Error;
use fred::interfaces::{ClientLike, EventInterface};
use fred::types::config::Server;
use tokio::sync::broadcast::{self, error::TryRecvError};

/// The connection errors fred broadcasts for one client (a failed first connection, each failed
/// reconnection, a connection that broke), read only when a call needs an explanation.
pub(crate) struct ConnectionErrors {
    state: Mutex<State>,
}

struct State {
    errors: broadcast::Receiver<(Error, Option<Server>)>,
    last: Option<Error>,
    /// The node of the last connection that broke (fred does not name the node of a failed
    /// reconnection).
    lost: Option<Server>,
}

impl ConnectionErrors {
    /// Watches `fred`'s connection errors from now on.
    pub(crate) fn watch(fred: &Client) -> Self {
        ConnectionErrors {
            state: Mutex::new(State {
                errors: fred.error_rx(),
                last: None,
                lost: None,
            }),
        }
    }

    /// Why `fred` is not connected, with what to check (the same hints as
    /// [`LockClientBuilder::connect`](crate::LockClientBuilder::connect) gives); `None` while
    /// it is connected, or when no connection error was reported (say, before its first
    /// connection).
    pub(crate) fn why_down(&self, fred: &Client) -> Option<String> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            match state.errors.try_recv() {
                Ok((error, node)) => {
                    state.last = Some(error);
                    if node.is_some() {
                        state.lost = node;
                    }
                }
                Err(TryRecvError::Lagged(_)) => {}
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        if fred.is_connected() {
            return None;
        }
        let error = state.last.as_ref()?;
        let config = fred.client_config();
        let hint = crate::url::connect_failure_hint(error, config.database, config.tls.is_some());
        Some(format!(
            "not connected to {}: {error}; {hint}",
            crate::url::describe_node(&config, state.lost.as_ref())
        ))
    }
}
