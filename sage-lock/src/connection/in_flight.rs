//! A replica-acknowledged attempt in flight on a dedicated connection, and how a cancelled one
//! is cleaned up on that same connection.

use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::Value;
use tokio::time::Instant;

use super::RELEASE_TIMEOUT;
use super::run::run_plain;
use crate::pool::Loan;
use crate::scripts::ScriptCall;

/// A replica-acknowledged attempt in flight on a dedicated connection. Dropped before it settles
/// (the caller was cancelled), it cleans up on the same connection: the acquisition's `cleanup`
/// (its release) is sent after the attempt's own commands, so it can never overtake them, and
/// a `WAIT` blocking the connection is unblocked (`CLIENT UNBLOCK` from the shared connection)
/// instead of being waited out; then the connection is closed.
pub(super) struct InFlight {
    pub(super) loan: Option<Loan>,
    pub(super) cleanup: Option<ScriptCall<'static>>,
    pub(super) shared: Client,
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
        if let Some(released) = abandon(loan, self.cleanup.take(), self.shared.clone()) {
            // Past the bound (or if the caller is cancelled) it finishes in the background.
            let until = deadline.min(Instant::now() + RELEASE_TIMEOUT);
            let _ = tokio::time::timeout_at(until, released).await;
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(loan) = self.loan.take() {
            abandon(loan, self.cleanup.take(), self.shared.clone());
        }
    }
}

/// Closes `loan` in the background after sending `cleanup` on it (see [`InFlight`]). With a
/// `cleanup`, returns what resolves once it is through (or given up), before the close.
fn abandon(
    loan: Loan,
    cleanup: Option<ScriptCall<'static>>,
    shared: Client,
) -> Option<tokio::sync::oneshot::Receiver<()>> {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return None; // dropping the loan aborts its connection
    };
    let (done, released) = tokio::sync::oneshot::channel();
    let waits = cleanup.is_some();
    runtime.spawn(async move {
        if let Some(cleanup) = cleanup {
            let release = tokio::time::timeout(
                RELEASE_TIMEOUT * 2,
                run_plain(
                    &loan.conn,
                    &cleanup,
                    tokio::time::Instant::now() + RELEASE_TIMEOUT * 2,
                ),
            );
            let unblock = async {
                let Some(id) = loan.client_id() else {
                    return std::future::pending().await;
                };
                loop {
                    let command = fred::types::CustomCommand::new_static(
                        "CLIENT",
                        fred::types::ClusterHash::FirstKey,
                        false,
                    );
                    let args = vec![Value::from("UNBLOCK"), Value::Integer(id)];
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        shared.custom::<Value, Value>(command, args),
                    )
                    .await;
                    // Until the release is through: the WAIT may not have begun yet.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            tokio::select! {
                _ = release => {}
                () = unblock => {}
            }
        }
        let _ = done.send(());
        loan.close().await;
    });
    waits.then_some(released)
}
