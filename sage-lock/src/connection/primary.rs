//! Running a release-like call on the current primary of a replicated deployment: on the
//! shared connection while it answers, on a dedicated one when it is down or frozen.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use fred::error::ErrorKind;
use fred::interfaces::ClientLike;
use fred::types::Value;
use fred::types::config::Server;
use tokio::time::Instant;

use super::Connection;
use super::verdict::{Ack, OpError};
use crate::scripts::ScriptCall;

/// How long the node a release-like call went to on the shared connection may stay silent
/// (answer none of the shared connection's commands) before the call runs on a dedicated
/// connection instead (see [`Connection::run_on_primary`]).
pub(super) const SHARED_RELEASE_WAIT: Duration = Duration::from_millis(250);

/// When each node last answered a command of the shared connection (one entry, `None`, outside
/// a cluster): a node that answers others' commands is busy, not frozen.
#[derive(Default)]
pub(super) struct Answers(Mutex<HashMap<Option<Server>, std::time::Instant>>);

impl Answers {
    /// `node` answered a command just now.
    pub(super) fn record(&self, node: Option<Server>) {
        let mut last = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        last.insert(node, std::time::Instant::now());
    }

    /// How long `node` has answered nothing; `None` if it never answered.
    pub(super) fn silent_for(&self, node: &Option<Server>) -> Option<Duration> {
        let last = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        last.get(node).map(std::time::Instant::elapsed)
    }
}

impl Connection {
    /// The [`Answers`] key of the node the shared connection sends `slot`'s commands to.
    fn answer_key(&self, slot: u16) -> Option<Server> {
        let fred = self.fred();
        if fred.is_clustered() {
            super::verdict::serving_node(fred, slot)
        } else {
            None
        }
    }

    /// The shared connection got `reply` from `node` (the node of the call's slot): an
    /// answer, unless it is a lost connection or a command cut short.
    pub(super) fn record_answer<T>(
        &self,
        reply: &Result<T, fred::error::Error>,
        node: Option<&Server>,
    ) {
        let answered = reply.as_ref().map_or_else(
            |error| {
                !matches!(
                    error.kind(),
                    ErrorKind::IO | ErrorKind::Timeout | ErrorKind::Canceled
                )
            },
            |_| true,
        );
        if answered {
            let key = if self.fred.is_clustered() {
                node.cloned()
            } else {
                None
            };
            self.answers.record(key);
        }
    }

    /// Runs a release-like call (no acknowledgement needed) on the current primary: on the
    /// shared connection with a `ROLE` check on replicated deployments; when that node is no
    /// longer the primary, is not `granted_by` (a demoted primary can still claim the role for
    /// seconds) or answers READONLY, the shared connection is reconnected and the call runs
    /// again on a dedicated connection, which reaches the current primary.
    ///
    /// A shared connection that is busy (its node answers other commands: thousands of
    /// releases queued at once) is waited for, up to `deadline`, neither reconnected nor left.
    /// One whose node answered nothing for [`SHARED_RELEASE_WAIT`] (a frozen old primary, which
    /// Sentinel has replaced: the shared connection moves only on `READONLY` or a `ROLE`
    /// mismatch, so it would hold every release for its whole bound there, and the key on the
    /// new primary until its lease ended) is reconnected, and the call also runs on a dedicated
    /// connection; the first answer of the two copies counts, and when no dedicated connection
    /// comes free the shared copy is still waited for. While the shared connection is down
    /// (fred, reconnecting through Sentinel, asks a frozen Sentinel for the whole command
    /// timeout, and without credentials never gets past it) the call runs on a dedicated
    /// connection at once, unless it `follows_shared`: the undoing of an attempt sent on the
    /// shared connection, which fred may still hold and send once it reconnects, must come
    /// after it there, or the attempt is granted after its undoing, with nobody left to release
    /// it. With the reply, whether the call ran, or may have run, once before it or beside it
    /// (on a node that was not `granted_by`, no longer the primary, or that did not answer): a
    /// compare-and-delete sent again then finds its own earlier work.
    pub(crate) async fn run_on_primary(
        &self,
        call: &ScriptCall<'_>,
        deadline: Instant,
        granted_by: Option<&Server>,
        follows_shared: bool,
    ) -> Result<(Value, bool), OpError> {
        if !self.deployment.is_replicated() {
            return self
                .run_plain(call, deadline)
                .await
                .map(|value| (value, false));
        }
        // Releases measure nothing from when they were sent.
        let (mut sent, mut sent_shared) = (std::time::Instant::now(), std::time::Instant::now());
        if self.is_down() && !follows_shared {
            // Reconnecting, through Sentinel maybe for long (fred asks the Sentinels in order, a
            // frozen one for the whole command timeout): the current primary is reached on a
            // dedicated connection (see `PrimaryRoute`), not waited for here.
            return self
                .run(call, true, deadline, None, None, &mut sent)
                .await
                .map(|(value, _, _)| (value, false));
        }
        let node = self.answer_key(call.slot);
        let mut shared =
            Box::pin(self.run(call, false, deadline, granted_by, None, &mut sent_shared));
        let mut check_at = Instant::now() + SHARED_RELEASE_WAIT;
        let outcome = loop {
            tokio::select! {
                outcome = &mut shared => break Some(outcome),
                () = tokio::time::sleep_until(check_at) => {
                    match self.answers.silent_for(&node) {
                        // Busy, not frozen: wait on.
                        Some(silent) if silent < SHARED_RELEASE_WAIT => {
                            check_at = Instant::now()
                                + (SHARED_RELEASE_WAIT - silent).max(Duration::from_millis(10));
                        }
                        _ => break None,
                    }
                }
            }
        };
        let ran_before = match outcome {
            Some(Ok((value, Ack::Confirmed | Ack::Short { .. }, _))) => return Ok((value, false)),
            // The script ran there: its answer is not trusted, but its work may be done.
            Some(Ok((_, Ack::NotPrimary(_), _))) => true,
            Some(Err(OpError::Failed(error))) if crate::retry::is_readonly(&error) => {
                self.reconnect_shared();
                false
            }
            // Unanswered within the command timeout, with time left: it may still run there.
            Some(Err(OpError::Failed(error)))
                if *error.kind() == ErrorKind::Timeout && Instant::now() < deadline =>
            {
                if !self.is_down() {
                    self.reconnect_shared();
                }
                true
            }
            Some(Err(other)) => return Err(other),
            None => return self.beside_shared(call, deadline, shared).await,
        };
        drop(shared);
        self.run(call, true, deadline, None, None, &mut sent)
            .await
            .map(|(value, _, _)| (value, ran_before))
    }

    /// The shared connection's node answered nothing for [`SHARED_RELEASE_WAIT`] (frozen, or
    /// the connection went down meanwhile and holds the call until it reconnects): runs `call`
    /// on a dedicated connection as well, and returns the first answer of the two copies. When
    /// the dedicated copy fails (no connection came free, say), the `shared` copy, which may
    /// still run, is waited for until `deadline`.
    async fn beside_shared<F>(
        &self,
        call: &ScriptCall<'_>,
        deadline: Instant,
        mut shared: std::pin::Pin<Box<F>>,
    ) -> Result<(Value, bool), OpError>
    where
        F: Future<Output = Result<(Value, Ack, Option<Server>), OpError>>,
    {
        if !self.is_down() {
            // One that is down reconnects on its own.
            tracing::debug!(
                "the shared connection's node answered nothing in time; reconnecting it"
            );
            self.reconnect_shared();
        }
        let mut sent = std::time::Instant::now();
        let mut dedicated = Box::pin(self.run(call, true, deadline, None, None, &mut sent));
        let failed = tokio::select! {
            outcome = &mut shared => match outcome {
                // The dedicated copy may run too (or have run first).
                Ok((value, Ack::Confirmed | Ack::Short { .. }, _)) => return Ok((value, true)),
                _ => return (&mut dedicated).await.map(|(value, _, _)| (value, true)),
            },
            outcome = &mut dedicated => match outcome {
                Ok((value, _, _)) => return Ok((value, true)),
                Err(error) => error,
            },
        };
        // A dedicated copy that was sent may have run.
        let ran_beside = !matches!(failed, OpError::PoolExhausted);
        match tokio::time::timeout_at(deadline, shared).await {
            Ok(Ok((value, Ack::Confirmed | Ack::Short { .. }, _))) => Ok((value, ran_beside)),
            _ => Err(failed),
        }
    }
}
