//! A replica-acknowledged attempt in flight on a dedicated connection, and how a cancelled one
//! is cleaned up on that same connection.

use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::Value;
use fred::types::config::Server;
use tokio::time::Instant;

use super::RELEASE_TIMEOUT;
use super::primary::Answers;
use super::run::run_plain;
use crate::pool::{DedicatedPool, Loan};
use crate::scripts::ScriptCall;

/// A replica-acknowledged attempt in flight on a dedicated connection. Dropped before it settles
/// (the caller was cancelled), it cleans up on the same connection: the acquisition's `cleanup`
/// (its release) is sent after the attempt's own commands, so it can never overtake them, and
/// a `WAIT` blocking the connection is unblocked (`CLIENT UNBLOCK` from the shared connection,
/// once `CLIENT LIST` shows it in that `WAIT`) instead of being waited out; then the connection
/// goes back to `pool` once the cleanup is answered (nothing of the attempt is left on it, and
/// `answers` records that its node answered), and is closed otherwise.
pub(super) struct InFlight {
    pub(super) loan: Option<Loan>,
    pub(super) cleanup: Option<ScriptCall<'static>>,
    pub(super) shared: Client,
    pub(super) pool: Arc<DedicatedPool>,
    pub(super) answers: (Arc<Answers>, Option<Server>),
}

impl InFlight {
    pub(super) fn settle(mut self) -> Option<Loan> {
        self.loan.take()
    }

    /// The attempt failed: cleans up (as when dropped) and waits for that, at most
    /// [`RELEASE_TIMEOUT`] and never past the caller's `deadline`, before the caller retries
    /// with the same token. A cleanup release still on its way would delete the retry's grant:
    /// after a `CLIENT KILL` the release went out once fred had reconnected the old connection,
    /// after the retry on another one had been granted, and the holder ran without its key. At
    /// the deadline no retry follows, so the caller need not wait for it.
    pub(super) async fn fail(mut self, deadline: Instant) {
        let Some(loan) = self.loan.take() else {
            return;
        };
        let (cleanup, shared, pool) = (
            self.cleanup.take(),
            self.shared.clone(),
            Arc::clone(&self.pool),
        );
        if let Some(released) = abandon(loan, cleanup, shared, pool, self.answers.clone()) {
            // Past the bound (or if the caller is cancelled) it finishes in the background.
            let until = deadline.min(Instant::now() + RELEASE_TIMEOUT);
            let _ = tokio::time::timeout_at(until, released).await;
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(loan) = self.loan.take() {
            abandon(
                loan,
                self.cleanup.take(),
                self.shared.clone(),
                Arc::clone(&self.pool),
                self.answers.clone(),
            );
        }
    }
}

/// Sends `cleanup` on `loan` in the background, then puts the connection back in `pool` if the
/// cleanup was answered, and closes it otherwise (see [`InFlight`]): an attempt cut only
/// because its caller's time ran out (a wait shorter than a round trip) costs no connection.
/// Without a `cleanup`, closes it. With a `cleanup`, returns what resolves once it is through
/// (or given up), before the connection is put back or closed.
///
/// The cleanup is sent once a `PING` on the connection is answered, so once the attempt's own
/// commands are through; until then a `WAIT` of the attempt that blocks the connection is
/// unblocked, and only a `WAIT` (see [`blocked_in_wait`]): `CLIENT UNBLOCK` of a client that an
/// operator's `CLIENT PAUSE ... WRITE` holds back aborts Redis 7 ("Unknown btype in
/// replyToBlockedClientTimedOut"). The `PING`, never held back by a write pause, leaves
/// nothing a pause could hold back on the connection once the `WAIT` began but the cleanup,
/// which is sent only after the last `CLIENT UNBLOCK` was answered.
fn abandon(
    loan: Loan,
    cleanup: Option<ScriptCall<'static>>,
    shared: Client,
    pool: Arc<DedicatedPool>,
    (answers, node): (Arc<Answers>, Option<Server>),
) -> Option<tokio::sync::oneshot::Receiver<()>> {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return None; // dropping the loan aborts its connection
    };
    let (done, released) = tokio::sync::oneshot::channel();
    let waits = cleanup.is_some();
    runtime.spawn(async move {
        // Whether the cleanup was answered: the attempt's own commands were answered before it.
        let mut cleaned_up = false;
        if let Some(cleanup) = cleanup {
            let until = Instant::now() + RELEASE_TIMEOUT * 2;
            let (through, mut through_yet) = tokio::sync::watch::channel(false);
            let barrier = async {
                let ping = loan.conn.ping::<Value>(None);
                let _ = tokio::time::timeout_at(until, ping).await;
                through.send_replace(true);
            };
            let shared = &shared;
            let unblock = |id: i64| async move {
                // Most attempts are through at once; a `WAIT` blocked on a replica is not.
                let mut pause = Duration::from_millis(5);
                loop {
                    tokio::select! {
                        _ = through_yet.wait_for(|through| *through) => return true,
                        () = tokio::time::sleep(pause) => {}
                    }
                    // The WAIT may not have begun yet: checked again after this pause.
                    pause = Duration::from_millis(20);
                    match blocked_in_wait(shared, id).await {
                        Some(true) => {
                            let command = fred::types::CustomCommand::new_static(
                                "CLIENT",
                                fred::types::ClusterHash::FirstKey,
                                false,
                            );
                            let args = vec![Value::from("UNBLOCK"), Value::Integer(id)];
                            let unblocked = tokio::time::timeout(
                                Duration::from_secs(1),
                                shared.custom::<Value, Value>(command, args),
                            )
                            .await;
                            if unblocked.is_err() {
                                // It may still reach the server, after the cleanup.
                                return false;
                            }
                        }
                        Some(false) => {}
                        // Not granted: the WAIT ends at its own timeout.
                        None => return true,
                    }
                }
            };
            let answered = match loan.client_id() {
                Some(id) => tokio::join!(barrier, unblock(id)).1,
                // A cluster connection (one per node): nothing to unblock, and a `PING` would
                // go to any node.
                None => true,
            };
            if answered {
                let release = run_plain(&loan.conn, &cleanup, until);
                cleaned_up = matches!(tokio::time::timeout_at(until, release).await, Ok(Ok(_)));
            } else {
                tracing::debug!(
                    "a CLIENT UNBLOCK went unanswered; the cancelled attempt's cleanup is not \
                     sent (its grant, if any, expires with its lease)"
                );
            }
        }
        let _ = done.send(());
        if cleaned_up && node.is_some() {
            answers.record(node);
        }
        // Outside a cluster, only a connection whose `CLIENT ID` is known: a later cut attempt
        // on one without could not have its `WAIT` unblocked (audit 53).
        if cleaned_up && (loan.client_id().is_some() || loan.conn.is_clustered()) {
            pool.put_back(loan);
        } else {
            loan.close().await;
        }
    });
    waits.then_some(released)
}

/// Whether the client `id` is blocked in a `WAIT` (`CLIENT LIST ID`: flag `b`, command
/// `wait`), and not in anything else, such as a command a `CLIENT PAUSE` holds back. `None`
/// when `CLIENT LIST` is not granted (ACL; said once at `WARN`); `Some(false)` when it fails
/// otherwise.
async fn blocked_in_wait(shared: &Client, id: i64) -> Option<bool> {
    static DENIED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let command =
        fred::types::CustomCommand::new_static("CLIENT", fred::types::ClusterHash::FirstKey, false);
    let args = vec![Value::from("LIST"), Value::from("ID"), Value::Integer(id)];
    let listed = tokio::time::timeout(
        Duration::from_secs(1),
        shared.custom::<Value, Value>(command, args),
    )
    .await;
    match listed {
        Ok(Ok(line)) => Some(line.as_str().is_some_and(|line| in_wait(&line))),
        Ok(Err(error)) if error.details().contains("NOPERM") => {
            if !DENIED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    "CLIENT LIST is not granted to this user (ACL: add +client|list): a \
                     cancelled acquisition's WAIT is waited out (at most half the command \
                     timeout) instead of unblocked, and its connection held until then"
                );
            }
            None
        }
        _ => Some(false),
    }
}

/// Whether a `CLIENT LIST` line shows a client blocked (flag `b`) in `WAIT`.
fn in_wait(line: &str) -> bool {
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|field| field.strip_prefix(name))
            .unwrap_or_default()
    };
    field("flags=").contains('b') && field("cmd=").eq_ignore_ascii_case("wait")
}

#[cfg(test)]
mod tests {
    use super::in_wait;

    #[test]
    fn only_a_client_blocked_in_wait_is_in_wait() {
        let wait = "id=4 addr=127.0.0.1:60444 laddr=127.0.0.1:45999 fd=9 name= age=0 idle=0 \
                    flags=b db=0 sub=0 psub=0 ssub=0 multi=-1 qbuf=0 events=r cmd=wait \
                    user=default redir=-1 resp=2\n";
        assert!(in_wait(wait));
        // Held back by `CLIENT PAUSE ... WRITE`: blocked, in another command.
        assert!(!in_wait(&wait.replace("cmd=wait", "cmd=evalsha")));
        // Its WAIT over: no longer blocked.
        assert!(!in_wait(&wait.replace("flags=b", "flags=N")));
        assert!(!in_wait(""));
    }
}
