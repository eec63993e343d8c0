//! Keeps a held lease alive while its body runs, and reports when it cannot.
//!
//! A renewal is due every third of the lease. A failed renewal is retried with backoff while the
//! usable lease lasts; the lock is lost when the key no longer holds the owner's token, when the
//! granting node stops being a primary, or when the usable lease runs out first.

use std::sync::Arc;
use std::time::Duration;

use fred::types::config::Server;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::client::{Ack, ClientInner, OpError};
use crate::error::LossReason;
use crate::key::LockKeys;
use crate::lease::{Lease, drift};
use crate::observe::Event;
use crate::retry::{Backoff, Failure, classify, is_readonly, remaining};

/// Everything the renewal task needs about one held lock.
pub(crate) struct Renewal {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) token: Arc<str>,
    pub(crate) lease_duration: Duration,
    pub(crate) replica_ack: bool,
    pub(crate) lease: Lease,
    /// The primary that granted the lock (replicated deployments).
    pub(crate) granted_by: Option<Server>,
}

impl Renewal {
    /// Renews until the lock is lost, then sends the reason on `lost`. Runs until aborted or lost.
    pub(crate) async fn run(self, lost: oneshot::Sender<LossReason>) {
        let reason = self.keep_alive().await;
        let _ = lost.send(reason);
    }

    async fn keep_alive(&self) -> LossReason {
        let interval = self.lease_duration / 3;
        let mut last_success = Instant::now();
        loop {
            tokio::time::sleep_until(last_success + interval).await;
            match self.renew_once().await {
                Ok(renewed_at) => last_success = renewed_at,
                Err(reason) => return reason,
            }
        }
    }

    /// One renewal, retried on transient failures until the usable lease runs out.
    /// Returns when the renewal request that succeeded was sent.
    async fn renew_once(&self) -> Result<Instant, LossReason> {
        let namespace = self.lease.namespace();
        let mut backoff = Backoff::new(
            Duration::from_millis(5),
            (self.lease_duration / 10).max(Duration::from_millis(5)),
        );
        let mut last_problem: Option<LossReason> = None;
        loop {
            let valid_until = self.lease.valid_until();
            if Instant::now() >= valid_until {
                return Err(last_problem
                    .unwrap_or_else(|| LossReason::RenewalFailed("no reply in time".into())));
            }
            let sent = Instant::now();
            let outcome = self
                .client
                .renew(
                    &self.keys,
                    &self.token,
                    self.lease_duration,
                    self.replica_ack,
                    valid_until,
                    self.granted_by.as_ref(),
                )
                .await;
            match outcome {
                Ok((true, Ack::Confirmed)) => {
                    self.lease
                        .extend_to(sent + self.lease_duration - drift(self.lease_duration));
                    self.client.stats.record(namespace, Event::Renewal);
                    tracing::trace!(key = %self.lease.key(), namespace, "lease renewed");
                    return Ok(sent);
                }
                Ok((false, _)) => return Err(LossReason::NotOwner),
                Ok((true, Ack::NotPrimary(role))) => return Err(LossReason::RoleChanged(role)),
                Ok((
                    true,
                    Ack::Short {
                        acknowledged,
                        required,
                    },
                )) => {
                    last_problem = Some(LossReason::NotAcknowledged {
                        acknowledged,
                        required,
                    });
                }
                Err(OpError::Failed(error)) if is_readonly(&error) => {
                    return Err(LossReason::RoleChanged(format!(
                        "a replica ({})",
                        error.details()
                    )));
                }
                Err(OpError::Failed(error)) => {
                    let permanent = classify(&error) == Failure::Permanent;
                    last_problem = Some(LossReason::RenewalFailed(error.to_string()));
                    if permanent {
                        return Err(last_problem.unwrap_or(LossReason::NotOwner));
                    }
                }
                Err(OpError::PoolExhausted) => {
                    last_problem = Some(LossReason::RenewalFailed(
                        "no dedicated connection became free (raise max_connections)".into(),
                    ));
                }
            }
            self.client.stats.record(namespace, Event::RenewalFailure);
            tracing::debug!(key = %self.lease.key(), namespace, problem = ?last_problem, "renewal failed, retrying");
            let delay = backoff.next_delay(remaining(self.lease.valid_until()));
            tokio::time::sleep(delay).await;
        }
    }
}
