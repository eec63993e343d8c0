//! Running one lock script on a deployment, with the checks it needs (`ROLE` and `WAIT` on
//! replicated ones), within the caller's deadline.

use std::time::Duration;

use fred::clients::Client;
use fred::error::{Error, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::Value;
use fred::types::config::Server;
use tokio::time::Instant;

use super::in_flight::InFlight;
use super::verdict::{Ack, OpError, is_stale_route, judge, not_the_granter, serving_node};
use super::{Connection, closed_error};
use crate::pool::{Lane, PoolError};
use crate::redirect;
use crate::retry::deadline_after;
use crate::scripts::{ScriptCall, is_noscript};
use crate::topology::run_checked;

impl Connection {
    /// Runs a lock script with the checks the deployment needs, within `deadline`. Also returns
    /// the node that answered (replicated deployments), for role-change detection.
    ///
    /// `cleanup` undoes `call` (an acquisition's release): when a replica-acknowledged attempt
    /// fails or is cancelled before its reply, it is sent on the same connection, after `call`.
    /// `sent` is moved to when `call` leaves for the server, past any wait for a dedicated
    /// connection (and a Sentinel's seeding): still before the server runs it, so a lease
    /// counted from it never outlasts the server's, and a hold that waited for a connection is
    /// not counted as older than it is.
    pub(crate) async fn run(
        &self,
        call: &ScriptCall<'_>,
        replica_ack: bool,
        deadline: Instant,
        granted_by: Option<&Server>,
        cleanup: Option<ScriptCall<'static>>,
        sent: &mut std::time::Instant,
    ) -> Result<(Value, Ack, Option<Server>), OpError> {
        self.ensure_open()?;
        let fred = self.fred();
        let limit = deadline.min(deadline_after(self.command_timeout));
        if !self.deployment.is_replicated() {
            // A never-late call ends by fred's own timeout, at `limit` (see `run_plain`); the
            // bound here only backs it up.
            let bound = if call.never_late {
                limit + NEVER_LATE_BACKUP
            } else {
                limit
            };
            return match tokio::time::timeout_at(bound, run_plain(fred, call, limit)).await {
                Ok(Err(error)) if call.never_late && *error.kind() == ErrorKind::Timeout => {
                    Err(OpError::Failed(self.timeout_error()))
                }
                Ok(result) => Ok((result?, Ack::Confirmed, None)),
                Err(_) => Err(OpError::Failed(self.timeout_error())),
            };
        }
        if !replica_ack {
            let checked = Box::pin(run_checked(fred, &self.hints, call, None));
            return match tokio::time::timeout_at(limit, checked).await {
                Ok(result) => {
                    let node = serving_node(fred, call.slot);
                    self.record_answer(&result, node.as_ref());
                    let judged = result
                        .map_err(|error| {
                            OpError::Failed(not_the_granter(error, node.as_ref(), granted_by))
                        })
                        .and_then(|checked| judge(checked, fred, node, granted_by));
                    // The shared connection reached a node that is not the primary (any more).
                    let reconnect = match &judged {
                        Ok((_, ack, _)) => matches!(ack, Ack::NotPrimary(_)),
                        Err(OpError::Failed(error)) => is_stale_route(error),
                        Err(OpError::PoolExhausted) => false,
                    };
                    if reconnect {
                        self.reconnect_shared();
                    }
                    judged
                }
                Err(_) => Err(OpError::Failed(self.timeout_error())),
            };
        }
        let lane = if call.ahead {
            Lane::Ahead
        } else {
            Lane::InTurn
        };
        // A caller that came with time for a call but would get its connection too late for
        // one (twice the typical call: calls vary) is not sent: cut at its deadline, it would
        // cost its connection, which an overloaded pool would then open again and again. A
        // renewal takes whatever is left: its lease depends on it.
        let typical = self.pool.typical_call() * 2;
        let enough = if !call.ahead && crate::retry::remaining(deadline) >= typical {
            typical
        } else {
            Duration::ZERO
        };
        // Boxed (as the other multi-KB futures below): keeps this future, and every one that
        // awaits it, small on the plain path.
        let loan = match Box::pin(self.pool.take(deadline, lane, enough)).await {
            Ok(loan) => loan,
            Err(PoolError::Exhausted) => return Err(OpError::PoolExhausted),
            Err(PoolError::Unanswered(held)) => {
                return Err(OpError::Failed(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "{DEADLINE_REACHED}: no dedicated connection came free: the server did \
                         not answer the {held} calls holding them"
                    ),
                )));
            }
            Err(PoolError::Connect(error)) => return Err(OpError::Failed(error)),
            Err(PoolError::Closed) => return Err(OpError::Failed(closed_error())),
        };
        // WAIT leaves part of what is left of the deadline for its reply: an idle server ends a
        // WAIT up to 1000/`hz` ms late (100 ms at the default `hz 10`), and a renewal must
        // report its outcome before the lease's safety net fires. With 300 ms or more left, half
        // (at most 250 ms) stays free, which covers that lateness; with less, no slack could, and
        // WAIT keeps two thirds so that slow but healthy replicas still acknowledge short leases.
        // And WAIT takes at most half the command timeout, so one for a replica that left ends
        // well before fred's.
        let left = crate::retry::remaining(deadline);
        let slack = if left >= Duration::from_millis(300) {
            (left / 2).min(Duration::from_millis(250))
        } else {
            (left / 3).max(Duration::from_millis(5))
        };
        let wait_until = deadline
            .checked_sub(slack)
            .unwrap_or(deadline)
            .min(deadline_after(self.command_timeout / 2));
        let conn = loan.conn.clone();
        if let Some(seed) = &self.sentinel_seed {
            Box::pin(seed.seed(fred, &conn, &self.hints, wait_until)).await;
        }
        *sent = std::time::Instant::now();
        let in_flight = InFlight {
            loan: Some(loan),
            cleanup,
            shared: fred.clone(),
            pool: std::sync::Arc::clone(&self.pool),
            answers: (
                std::sync::Arc::clone(&self.dedicated_answers),
                serving_node(&conn, call.slot),
            ),
        };
        let checked = Box::pin(run_checked(&conn, &self.hints, call, Some(wait_until)));
        // The reply may come a little after WAIT ends, but never past the caller's deadline:
        // an acquisition's `TimedOut` comes at its wait's end.
        let grace = Duration::from_millis(250).min(self.command_timeout);
        // `quit()` ends the wait at once; the attempt is cleaned up in the background.
        let outcome = tokio::select! {
            outcome = tokio::time::timeout_at((wait_until + grace).min(deadline), checked) => {
                outcome
            }
            () = self.pool.closed() => return Err(OpError::Failed(closed_error())),
        };
        match outcome {
            Ok(Ok(checked)) => {
                let loan = in_flight.settle();
                let node = serving_node(&conn, call.slot);
                if node.is_some() {
                    self.dedicated_answers.record(node.clone());
                }
                let judged = judge(checked, &conn, node, granted_by);
                if let Ok((
                    _,
                    Ack::Short {
                        acknowledged,
                        required,
                    },
                    _,
                )) = &judged
                {
                    self.hints.came_back_short(*acknowledged, *required);
                }
                if matches!(judged, Ok((_, Ack::Confirmed, _))) {
                    self.hints.came_back_acknowledged();
                    self.pool.record_call(sent.elapsed());
                    if let Some(loan) = loan {
                        self.pool.put_back(loan);
                    }
                } else {
                    // A failover may be under way (or this connection's routing is out of
                    // date): let every dedicated connection reconnect.
                    drop(loan);
                    self.forget_topology();
                }
                judged
            }
            failed => {
                // The connection may still be blocked in WAIT or broken: never reuse it, and
                // clean up on it (the attempt may still run) before the caller retries.
                let mut in_flight = in_flight;
                if let (Err(_), Some(loan)) = (&failed, in_flight.loan.as_mut()) {
                    self.pool.mark_unanswered(loan);
                }
                // Cut by its caller's deadline while its node answers other calls (a wait
                // shorter than a round trip): no sign of a failover, and forgetting the topology
                // would close every idle connection (audit 52: at 200 ms round trips such waits
                // in a loop left renewals opening connections, and cost every hold its lease).
                let cut = match &failed {
                    Err(_) => true,
                    Ok(Err(error)) => *error.kind() == ErrorKind::Timeout,
                    Ok(Ok(_)) => false,
                };
                // The node itself, not whichever is the primary now: after a failover the new
                // primary's answers say nothing of a frozen old one that idle connections reach.
                let node = serving_node(&conn, call.slot);
                let answering = node.is_some()
                    && self
                        .dedicated_answers
                        .silent_for(&node)
                        .is_some_and(|silent| silent < ANSWERING);
                in_flight.fail(deadline).await;
                if !(cut && answering) {
                    self.forget_topology();
                }
                Err(OpError::Failed(match failed {
                    Ok(Err(error)) => {
                        not_the_granter(error, serving_node(&conn, call.slot).as_ref(), granted_by)
                    }
                    _ => self.timeout_error(),
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
        self.ensure_open()?;
        match tokio::time::timeout_at(deadline, run_plain(self.fred(), call, deadline)).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(OpError::Failed(self.timeout_error())),
        }
    }
}

/// `EVALSHA` on `fred`, `EVAL` after `NOSCRIPT`; after `MOVED` (the script did not run) again
/// on the slot's new owner (see [`crate::redirect`]). The caller bounds it by `deadline`; a
/// [`never_late`](ScriptCall::never_late) call is also never sent after it.
pub(super) async fn run_plain(
    fred: &Client,
    call: &ScriptCall<'_>,
    deadline: Instant,
) -> Result<Value, Error> {
    let (mut use_source, mut redirections) = (call.source_first, 0);
    loop {
        let node = redirect::owner(fred, call.slot);
        let (cmd, args) = call.command(use_source);
        // fred's own timeout, when it fires, marks the command so that fred never writes it
        // afterwards (a command the caller merely dropped is still written once reconnected):
        // it ends the call at `deadline`, before the caller's backup bound.
        let options = call.never_late.then(|| fred::types::config::Options {
            timeout: Some(
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            ),
            ..Default::default()
        });
        // Boxed: fred's command future is ~7 KB; kept inline it would make every future above
        // it (acquire, hold, release) as large, and each move of those a multi-KB copy.
        let timed = fred.with_options(options.as_ref().unwrap_or(&CALLER_TIMED));
        match Box::pin(async move { timed.custom::<Value, Value>(cmd, args).await }).await {
            Err(error) if is_noscript(&error) && !use_source => use_source = true,
            Err(error) if redirect::is_redirection(&error) => {
                redirections += 1;
                if redirections > redirect::MAX_REDIRECTIONS {
                    return Err(error);
                }
                redirect::after_redirection(fred, call.slot, node.as_ref())?;
            }
            other => return other,
        }
    }
}

/// How long after its deadline a [`never_late`](ScriptCall::never_late) call is cut short if
/// fred's own timeout has not ended it (it always should).
const NEVER_LATE_BACKUP: Duration = Duration::from_millis(20);

/// A node that answered a call on a dedicated connection this recently is answering: a call
/// cut there meanwhile was cut by its caller's deadline. Shorter than any failover (Sentinel's
/// `down-after-milliseconds` and a cluster's `cluster-node-timeout` start at about a second),
/// so a node frozen for one still has the topology forgotten before its replacement is named.
const ANSWERING: Duration = Duration::from_secs(1);

/// Per-command options of a command whose caller bounds it with a deadline of its own: no fred
/// timeout on top (a zero timeout is none), which saves a timer per command.
pub(crate) static CALLER_TIMED: std::sync::LazyLock<fred::types::config::Options> =
    std::sync::LazyLock::new(|| fred::types::config::Options {
        timeout: Some(Duration::ZERO),
        ..Default::default()
    });

use crate::retry::DEADLINE_REACHED;

impl Connection {
    /// Why the shared connection is down, with what to check; `None` while it is up (or before
    /// it ever failed).
    pub(crate) fn why_down(&self) -> Option<String> {
        self.errors.why_down(&self.fred)
    }

    /// Whether the shared connection is down (being re-established): a command sent now waits
    /// for it.
    pub(crate) fn is_down(&self) -> bool {
        !self.fred.is_connected()
    }

    /// The error of a command cut short by the caller's deadline: [`DEADLINE_REACHED`], followed
    /// by why the shared connection is down when it is.
    fn timeout_error(&self) -> Error {
        let details = match self.why_down() {
            Some(why) => format!("{DEADLINE_REACHED}: {why}"),
            None => DEADLINE_REACHED.to_owned(),
        };
        Error::new(fred::error::ErrorKind::Timeout, details)
    }
}
