//! Connection state: the shared fred client, the dedicated pool, the deployment and its
//! replica hints, and how one lock script is run with the checks the deployment needs.
//!
//! This is the bottom layer of the runtime: it knows nothing of leases or primitives.

use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::error::Error;
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::Value;
use fred::types::config::Server;
use tokio::time::Instant;

use crate::observe::Stats;
use crate::pool::{DedicatedPool, PoolError, close_in_background};
use crate::retry::deadline_after;
use crate::scripts::{ScriptCall, is_noscript};
use crate::topology::{Checked, Deployment, ReplicaHints, run_checked};

/// What every lock operation of one client shares: connections, deployment, counters.
pub(crate) struct Connection {
    pub(crate) fred: Client,
    pub(crate) deployment: Deployment,
    pub(crate) pool: Arc<DedicatedPool>,
    pub(crate) hints: ReplicaHints,
    pub(crate) stats: Stats,
    pub(crate) command_timeout: Duration,
}

impl Connection {
    pub(crate) fn new(
        fred: Client,
        deployment: Deployment,
        max_connections: usize,
        command_timeout: Duration,
    ) -> Self {
        let pool = Arc::new(DedicatedPool::new(fred.clone(), max_connections));
        Connection {
            fred,
            deployment,
            pool,
            hints: ReplicaHints::default(),
            stats: Stats::default(),
            command_timeout,
        }
    }
}

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

impl Connection {
    /// Runs a lock script with the checks the deployment needs, within `deadline`. Also returns
    /// the node that answered (replicated deployments), for role-change detection.
    pub(crate) async fn run(
        &self,
        call: &ScriptCall<'_>,
        replica_ack: bool,
        deadline: Instant,
        granted_by: Option<&Server>,
    ) -> Result<(Value, Ack, Option<Server>), OpError> {
        let limit = deadline.min(deadline_after(self.command_timeout));
        if !self.deployment.is_replicated() {
            return match tokio::time::timeout_at(limit, run_plain(&self.fred, call)).await {
                Ok(result) => Ok((result?, Ack::Confirmed, None)),
                Err(_) => Err(OpError::Failed(timeout_error())),
            };
        }
        if !replica_ack {
            let checked = run_checked(&self.fred, &self.hints, call, None);
            return match tokio::time::timeout_at(limit, checked).await {
                Ok(result) => {
                    let node = serving_node(&self.fred, call.slot);
                    Ok(judge(result?, &self.fred, node, granted_by))
                }
                Err(_) => Err(OpError::Failed(timeout_error())),
            };
        }
        let loan = match self.pool.take(deadline).await {
            Ok(loan) => loan,
            Err(PoolError::Exhausted) => return Err(OpError::PoolExhausted),
            Err(PoolError::Connect(error)) => return Err(OpError::Failed(error)),
        };
        // WAIT may use most of what is left of the deadline, leaving a tenth (5 to 100 ms) for
        // its reply, so a renewal reports before the usable lease ends.
        let left = crate::retry::remaining(deadline);
        let slack = (left / 10).clamp(Duration::from_millis(5), Duration::from_millis(100));
        let wait_until = deadline.checked_sub(slack).unwrap_or(deadline);
        let checked = run_checked(&loan.conn, &self.hints, call, Some(wait_until));
        let grace = Duration::from_millis(250).min(self.command_timeout);
        match tokio::time::timeout_at(deadline + grace, checked).await {
            Ok(Ok(checked)) => {
                let node = serving_node(&loan.conn, call.slot);
                let judged = judge(checked, &loan.conn, node, granted_by);
                if judged.1 == Ack::Confirmed {
                    self.pool.put_back(loan);
                } else {
                    // A failover may be under way: let every dedicated connection reconnect.
                    close_in_background(loan.conn);
                    self.pool.discard_idle();
                }
                Ok(judged)
            }
            failed => {
                // The connection may still be blocked in WAIT or broken: never reuse it.
                close_in_background(loan.conn);
                self.pool.discard_idle();
                Err(OpError::Failed(match failed {
                    Ok(Err(error)) => error,
                    _ => timeout_error(),
                }))
            }
        }
    }

    /// Runs `call` on the shared connection (no replica checks), within `deadline`.
    pub(crate) async fn run_plain(
        &self,
        call: &ScriptCall<'_>,
        deadline: Instant,
    ) -> Result<Value, OpError> {
        match tokio::time::timeout_at(deadline, run_plain(&self.fred, call)).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(OpError::Failed(timeout_error())),
        }
    }
}

/// The node `conn` sends `slot`'s commands to, as far as the client's routing knows.
fn serving_node(conn: &Client, slot: u16) -> Option<Server> {
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
    Some(format!(
        "{}:{} granted the lock but {}:{} is the primary of its slot now",
        granter.host, granter.port, now.host, now.port
    ))
}

/// Turns the replica checks into an [`Ack`]; `node` answered, `granted_by` granted the lock.
fn judge(
    checked: Checked,
    conn: &Client,
    node: Option<Server>,
    granted_by: Option<&Server>,
) -> (Value, Ack, Option<Server>) {
    let moved = role_change(conn, node.as_ref(), granted_by);
    let ack = if !checked.role.is_primary() {
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
    (checked.reply, ack, node)
}

/// `EVALSHA` on the shared connection, `EVAL` after `NOSCRIPT`.
async fn run_plain(fred: &Client, call: &ScriptCall<'_>) -> Result<Value, Error> {
    let (cmd, args) = call.command(false);
    match fred.custom::<Value, Value>(cmd, args).await {
        Err(error) if is_noscript(&error) => {
            let (cmd, args) = call.command(true);
            fred.custom(cmd, args).await
        }
        other => other,
    }
}

/// The detail text of a command cut short by the caller's deadline.
pub(crate) const DEADLINE_REACHED: &str = "no reply before the deadline";

fn timeout_error() -> Error {
    Error::new(fred::error::ErrorKind::Timeout, DEADLINE_REACHED)
}
