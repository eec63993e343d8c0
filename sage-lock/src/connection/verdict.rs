//! What a script run's reply means on a replicated deployment: the [`Ack`] its replica checks
//! give, and whether the node that answered is the one that granted the lock (a role change) or
//! only a route that was out of date.

use fred::clients::Client;
use fred::error::Error;
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::Value;
use fred::types::config::Server;

use crate::retry::is_readonly;
use crate::topology::Checked;

/// Why a single server operation did not produce an answer.
#[derive(Debug)]
pub(crate) enum OpError {
    /// The client or server failed (classify it with `retry::classify`).
    Failed(Error),
    /// No dedicated connection became free before the deadline.
    PoolExhausted,
}

impl From<Error> for OpError {
    fn from(error: Error) -> Self {
        OpError::Failed(error)
    }
}

/// What replica checks said about a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ack {
    /// No checks apply (standalone), or they passed.
    Confirmed,
    /// Too few replicas acknowledged in time.
    Short { acknowledged: i64, required: i64 },
    /// The node is no longer a primary.
    NotPrimary(String),
}

/// The node `conn` sends `slot`'s commands to, as far as the client's routing knows.
pub(super) fn serving_node(conn: &Client, slot: u16) -> Option<Server> {
    if conn.is_clustered() {
        conn.cached_cluster_state()
            .and_then(|routing| routing.get_server(slot).cloned())
    } else {
        conn.active_connections().into_iter().next()
    }
}

/// Whether the primary that granted a lock has lost its role: another node now serves the
/// lock's slot and (in a cluster) the granting node serves no slots as a primary any more. A
/// cluster slot migration, which moves the key with its token and TTL, is not a role change.
fn role_change(
    conn: &Client,
    node: Option<&Server>,
    granted_by: Option<&Server>,
) -> Option<String> {
    let (now, granter) = (node?, granted_by?);
    if now == granter {
        return None;
    }
    if conn.is_clustered()
        && conn.cached_cluster_state().is_some_and(|routing| {
            routing
                .slots()
                .iter()
                .any(|range| &range.primary == granter)
        })
    {
        return None;
    }
    let of_what = if conn.is_clustered() {
        " of its slot"
    } else {
        ""
    };
    Some(format!(
        "{}:{} granted the lock but {}:{} is the primary{of_what} now",
        granter.host, granter.port, now.host, now.port
    ))
}

/// Whether `node` answered for a lock that another node, `granted_by`, granted. When `node` is
/// a replica, that says nothing about the lock: the route to the slot was out of date.
fn answered_for_another<'a>(
    node: Option<&'a Server>,
    granted_by: Option<&'a Server>,
) -> Option<(&'a Server, &'a Server)> {
    match (node, granted_by) {
        (Some(node), Some(granter)) if node != granter => Some((node, granter)),
        _ => None,
    }
}

/// What every [`stale_route`] error says.
const STALE_ROUTE: &str = "the route to its slot was out of date";

/// The transient error of a call that reached a replica which did not grant the lock (a route
/// out of date: the caller retries on a fresh one).
fn stale_route(node: &Server, granter: &Server, said: &str) -> Error {
    Error::new(
        fred::error::ErrorKind::Routing,
        format!(
            "{}:{} {said}, but {}:{} granted the lock: {STALE_ROUTE}; retrying on a fresh one",
            node.host, node.port, granter.host, granter.port
        ),
    )
}

pub(super) fn is_stale_route(error: &Error) -> bool {
    *error.kind() == fred::error::ErrorKind::Routing && error.details().contains(STALE_ROUTE)
}

/// A `READONLY` refusal from a node that did not grant the lock becomes [`stale_route`]: only
/// the granting node's refusal says it lost its role. Other errors pass unchanged.
pub(super) fn not_the_granter(
    error: Error,
    node: Option<&Server>,
    granted_by: Option<&Server>,
) -> Error {
    match answered_for_another(node, granted_by) {
        Some((node, granter)) if is_readonly(&error) => {
            stale_route(node, granter, "refused the write as a replica")
        }
        _ => error,
    }
}

/// Turns the replica checks into an [`Ack`]; `node` answered, `granted_by` granted the lock.
/// A replica that did not grant the lock answering is a [`stale_route`] error.
pub(super) fn judge(
    checked: Checked,
    conn: &Client,
    node: Option<Server>,
    granted_by: Option<&Server>,
) -> Result<(Value, Ack, Option<Server>), OpError> {
    let moved = role_change(conn, node.as_ref(), granted_by);
    let ack = if !checked.role.is_primary() {
        if let Some((node, granter)) = answered_for_another(node.as_ref(), granted_by) {
            let said = format!("answered ROLE {}", checked.role.name);
            return Err(OpError::Failed(stale_route(node, granter, &said)));
        }
        Ack::NotPrimary(format!("ROLE reports {}", checked.role.name))
    } else if let Some(moved) = moved {
        Ack::NotPrimary(moved)
    } else {
        match checked.acknowledged {
            Some((acknowledged, required)) if acknowledged < required => Ack::Short {
                acknowledged,
                required,
            },
            _ => Ack::Confirmed,
        }
    };
    Ok((checked.reply, ack, node))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::{Failure, classify};

    /// Only the granting node refusing a write as a replica says the lock's primary lost its
    /// role; another node refusing it means the route was out of date (retried, transient).
    #[test]
    fn only_the_granters_refusal_is_a_role_change() {
        let (granter, other) = (
            Server::new("127.0.0.1", 7000),
            Server::new("127.0.0.1", 7001),
        );
        let readonly = || {
            Error::new(
                fred::error::ErrorKind::Unknown,
                "READONLY You can't write against a read only replica.",
            )
        };
        let stale = not_the_granter(readonly(), Some(&other), Some(&granter));
        assert!(is_stale_route(&stale) && !is_readonly(&stale), "{stale}");
        assert_eq!(classify(&stale), Failure::Transient);
        assert!(stale.details().contains("127.0.0.1:7001") && stale.details().contains(":7000"));
        for (node, granted_by) in [
            (Some(&granter), Some(&granter)),
            (None, Some(&granter)),
            (Some(&other), None),
        ] {
            let kept = not_the_granter(readonly(), node, granted_by);
            assert!(is_readonly(&kept) && !is_stale_route(&kept), "{kept}");
        }
        let other_error = Error::new(fred::error::ErrorKind::Unknown, "WRONGTYPE Operation");
        let passed = not_the_granter(other_error, Some(&other), Some(&granter));
        assert!(!is_stale_route(&passed) && passed.details().starts_with("WRONGTYPE"));
    }
}
