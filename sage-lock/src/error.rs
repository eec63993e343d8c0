//! [`LockError`]: every way a lock operation can fail, with enough context to act on.

use std::fmt;
use std::time::Duration;

/// Why a lock operation failed.
///
/// Every variant names the lock (key and namespace) it concerns where there is one, so
/// `Display` alone tells an operator what happened. A body's own error is never turned into a
/// `LockError`: `with_lock` returns the body's value untouched.
///
/// ```no_run
/// # async fn demo(locks: sage_lock::Locks<str>) {
/// use std::time::Duration;
/// use sage_lock::{LockError, TimeoutReason};
///
/// match locks.with_lock("report", Duration::from_secs(2), async { 1 }).await {
///     Ok(output) => println!("ran the body: {output}"),
///     Err(LockError::TimedOut { reason: TimeoutReason::Busy, .. }) => println!("someone else runs it"),
///     Err(error @ LockError::LockLost { .. }) => eprintln!("body cancelled: {error}"),
///     Err(error) => eprintln!("{error}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock could not be acquired within the wait (or, for `try_with_lock`, transient failures
    /// did not clear within about a second). The body did not run.
    #[error(
        "timed out after {} acquiring lock {} in namespace {namespace:?}: {reason}",
        rounded(*.waited),
        quoted(.key)
    )]
    TimedOut {
        /// The lock key, printable (non-UTF-8 bytes escaped). Under `with_locks` /
        /// `try_with_locks` it may name the keys it could be, e.g. `one of a, b, c`.
        key: String,
        /// The lock's namespace.
        namespace: String,
        /// How long the call tried before giving up: about the wait, about a second for
        /// `try_with_lock`, a few microseconds for [`TimeoutReason::HeldByThisTask`].
        waited: Duration,
        /// What stood in the way.
        reason: TimeoutReason,
    },

    /// The lease was lost while the body ran (or before it could start); the body future was
    /// dropped. Work the body already did is not undone.
    #[error(
        "lock {} in namespace {namespace:?} was lost after {}: {reason}",
        quoted(.key),
        rounded(*.held)
    )]
    LockLost {
        /// The lock key, printable.
        key: String,
        /// The lock's namespace.
        namespace: String,
        /// How long the lease had been held when the loss was detected (not counting the
        /// best-effort release that follows).
        held: Duration,
        /// How ownership was lost.
        reason: LossReason,
    },

    /// An argument was out of range or malformed, or the server cannot serve as a lock store as
    /// configured. Retrying the same call does not help until that changes; `message` says what
    /// to change.
    ///
    /// Mostly found before anything is sent to the server. Three cases come after a round trip,
    /// about the server's state:
    /// - `argument` `key`: a lock key holds a value of another type than sage-lock writes
    ///   (set by hand or by another program), from the lock calls and the operator tools;
    /// - `argument` `url`: [`LockClient::connect`](crate::LockClient::connect) reached a
    ///   replica, a cluster node or a Sentinel through a plain URL;
    /// - `argument` `from_fred`: every call of a
    ///   [`LockClient::from_fred`](crate::LockClient::from_fred) client whose node cannot hold
    ///   locks (a replica, a cluster node through a plain configuration, a Sentinel).
    #[error("invalid argument `{argument}`: {message}")]
    InvalidArgument {
        /// What was refused. Usually an argument's or setting's name: `lease`, `hold_at_least`,
        /// `namespace`, `wait_timeout`, `permits`, `keys`, `key`, `by`, `url`,
        /// `max_connections`, `renewal_batch_limit`, `command_timeout`, `connect_timeout`,
        /// `tls_ca`, `tls_client_cert`. Otherwise: `defaults` (`global::set_defaults` after a
        /// family was created), `profile` (a profile, its name or its environment override),
        /// `wait` (`#[locked(profile = ...)]` with no wait), `global client` (no global client,
        /// or a second `global::install`), `SAGE_LOCK_URL` (that variable empty or malformed),
        /// and `from_fred` (see above). New values may be added.
        argument: &'static str,
        /// What is wrong and how to fix it.
        message: String,
    },

    /// The server or the connection failed, or the call cannot run at all.
    ///
    /// Whether a retry can help depends on the call:
    /// - The lock calls (`with_lock`, `try_with_lock`, `with_locks`, `read`, `write`,
    ///   `acquire` and their try forms) retry transient failures within their wait and report
    ///   those as [`TimeoutReason::Unavailable`]. Their `Backend` is not transient: a
    ///   permission or script error, a call outside a Tokio runtime (kind `Config`), or a
    ///   client closed by [`LockClient::quit`](crate::LockClient::quit) (kind `Canceled`).
    /// - The operator tools (`is_locked`, `holder`, `force_unlock`, `force_unlock_by`, `scan`)
    ///   retry brief failures (a migrating slot, a reconnect) only within the command timeout,
    ///   and [`LockClient::dedicated_connection`](crate::LockClient::dedicated_connection) does
    ///   not retry: their `Backend` may be transient (kind `Timeout`, a lost connection, an
    ///   exhausted pool), and a later call may succeed.
    /// - [`LockClient::connect`](crate::LockClient::connect): an unreachable or silent server
    ///   (which may come back), wrong credentials, a missing database.
    #[error("{context}: {source}")]
    Backend {
        /// What sage-lock was doing.
        context: String,
        /// The client's error.
        #[source]
        source: fred::error::Error,
    },
}

impl LockError {
    pub(crate) fn invalid(argument: &'static str, message: impl Into<String>) -> Self {
        LockError::InvalidArgument {
            argument,
            message: message.into(),
        }
    }

    pub(crate) fn backend(context: impl Into<String>, source: fred::error::Error) -> Self {
        LockError::Backend {
            context: context.into(),
            source,
        }
    }

    /// True for [`LockError::TimedOut`].
    #[must_use]
    pub fn is_timed_out(&self) -> bool {
        matches!(self, LockError::TimedOut { .. })
    }

    /// True for [`LockError::LockLost`].
    #[must_use]
    pub fn is_lock_lost(&self) -> bool {
        matches!(self, LockError::LockLost { .. })
    }
}

/// Lets a `#[locked]` function (or any caller using `?`) return `std::io::Result<T>`. The
/// kind is [`TimedOut`](std::io::ErrorKind::TimedOut) for [`LockError::TimedOut`],
/// [`InvalidInput`](std::io::ErrorKind::InvalidInput) for [`LockError::InvalidArgument`] and
/// [`Other`](std::io::ErrorKind::Other) otherwise; the `LockError` stays inside
/// (`io::Error::into_inner` and `downcast`) and its `Display` is the `io::Error`'s.
impl From<LockError> for std::io::Error {
    fn from(error: LockError) -> Self {
        let kind = match error {
            LockError::TimedOut { .. } => std::io::ErrorKind::TimedOut,
            LockError::InvalidArgument { .. } => std::io::ErrorKind::InvalidInput,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, error)
    }
}

/// What kept an acquisition from succeeding before its deadline: the `reason` of
/// [`LockError::TimedOut`] (matched in [`LockError`]'s example).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimeoutReason {
    /// Another owner held the lock for the whole wait, or it was owed to callers queued ahead
    /// (a queued writer keeps new readers out; a free permit goes to the first waiters).
    Busy,
    /// The lock was granted but the primary's replicas did not acknowledge it in time; it was
    /// released again. Also when no dedicated connection came free while this client's `WAIT`s
    /// were coming back unacknowledged (within the command timeout): they held the connections,
    /// and the counts are the last such `WAIT`'s.
    NotAcknowledged {
        /// Replicas that acknowledged.
        acknowledged: i64,
        /// Replicas that had to acknowledge.
        required: i64,
    },
    /// Every attempt hit a transient failure (connection loss, failover, cluster reconfiguration);
    /// the last one is quoted.
    Unavailable(String),
    /// No dedicated connection became free in time (see `max_connections`), and the
    /// replicas were acknowledging (else [`NotAcknowledged`](Self::NotAcknowledged)).
    PoolExhausted {
        /// The pool's size.
        max_connections: usize,
    },
    /// The calling task holds this lock already (the call is nested in its body) and the
    /// family is not reentrant (a mutex, a write lock, a one-holder semaphore, or a key of the
    /// task's own `with_locks`), or holds the other kind of a read-write lock (a write nested
    /// in its read, a read in its write): its hold lasts until that body ends, so waiting could
    /// only time out. Reported at once by the waiting calls (`with_lock`, `with_locks`,
    /// `read`, `write`, `acquire`); the try calls return `Ok(None)` instead, as for another
    /// owner's hold.
    HeldByThisTask,
    /// Others held the lock for the whole wait while the calling task itself holds a shared
    /// hold of the same kind on it (a read nested in its read, a permit in its permit) and the
    /// family is not reentrant: a writer or waiter queued behind the task's hold goes first,
    /// and may be waiting for that very hold, which lasts until the body ends.
    BehindOwnHold,
}

impl fmt::Display for TimeoutReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeoutReason::Busy => f.write_str(
                "held by another owner, or owed to callers queued ahead, for the whole wait",
            ),
            TimeoutReason::NotAcknowledged {
                acknowledged,
                required,
            } => {
                write!(
                    f,
                    "granted, but only {acknowledged} of {required} replicas acknowledged it in \
                     time (released again); check replica health or disable replica \
                     acknowledgement"
                )?;
                if *acknowledged == 0 && *required == 1 {
                    // A replicated deployment needs at least one acknowledgement: its replica
                    // is down, or there is none (a single server, a cluster made without).
                    f.write_str(
                        " (no replica acknowledged, and at least one must: is the primary's \
                         replica down? A deployment without replicas, such as a cluster made \
                         without them or a single server, needs \
                         LockOptions::replica_acknowledgement(false), or a client built \
                         without LockClientBuilder::replicated(true))",
                    )?;
                }
                Ok(())
            }
            TimeoutReason::Unavailable(last) => {
                write!(f, "server unavailable, last error: {last}")
            }
            TimeoutReason::PoolExhausted { max_connections } => write!(
                f,
                "all {max_connections} dedicated connections stayed busy; raise max_connections"
            ),
            TimeoutReason::HeldByThisTask => f.write_str(
                "this task already holds it (the call is nested in its body), so waiting could \
                 only time out: locks are not reentrant unless LockOptions::reentrant(true) \
                 (#[locked(..., reentrant)]), with which a nested call of one key and the same kind runs under the held lock \
                 (a with_locks call never does, nor a read nested in the task's write or a \
                 write in its read: take all the keys, or the write lock, for the whole body)",
            ),
            TimeoutReason::BehindOwnHold => f.write_str(
                "held by others for the whole wait, while this task itself holds a read or \
                 permit of it (the call is nested in its body): a writer or waiter queued behind \
                 that hold goes first and may wait for it, which lasts until the body ends; with \
                 LockOptions::reentrant(true) (#[locked(..., reentrant)]) a nested call of the same kind runs under the held \
                 one at once",
            ),
        }
    }
}

/// How a held lock was lost: the `reason` of [`LockError::LockLost`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The key no longer holds this owner's token: it expired, was deleted, or was overwritten.
    NotOwner,
    /// Renewal kept failing until the usable lease ran out; the last failure is quoted. When no
    /// renewal call was answered at all before then (a lease shorter than the client's command
    /// timeout, 5 s by default, on a connection that went silent: a partition, a stopped
    /// server), there is no failure to quote, and the text says "no renewal completed in time",
    /// followed by why the client is not connected when it is not (a refused reconnection).
    /// A loss noticed well after the usable lease ran out adds that the process did not run in
    /// between (stopped, paused, or its runtime's threads blocked).
    RenewalFailed(String),
    /// Replicas did not acknowledge a renewal before the usable lease ran out.
    NotAcknowledged {
        /// Replicas that acknowledged.
        acknowledged: i64,
        /// Replicas that had to acknowledge.
        required: i64,
    },
    /// The node that granted the lock is no longer a primary (failover): `ROLE` on it reports a
    /// replica, or another node now serves the lock's slot.
    RoleChanged(String),
    /// The usable lease ended before the body could start.
    ExpiredBeforeStart,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::NotOwner => f.write_str(
                "the key no longer holds this owner's token (expired, deleted or overwritten)",
            ),
            LossReason::RenewalFailed(last) => {
                write!(
                    f,
                    "renewal failed until the usable lease ran out, last error: {last}"
                )
            }
            LossReason::NotAcknowledged {
                acknowledged,
                required,
            } => write!(
                f,
                "only {acknowledged} of {required} replicas acknowledged the renewal before the \
                 usable lease ran out"
            ),
            LossReason::RoleChanged(role) => {
                write!(f, "the granting node is no longer a primary: {role}")
            }
            LossReason::ExpiredBeforeStart => {
                f.write_str("the usable lease ended before the body could start")
            }
        }
    }
}

/// One failed renewal attempt whose lease is still usable, for the "renewal failed, retrying"
/// event: the attempt's own failure, without the loss wording it would get if the lease ran out.
pub(crate) struct AttemptFailure<'a>(pub(crate) &'a LossReason);

impl fmt::Display for AttemptFailure<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            LossReason::RenewalFailed(last) => f.write_str(last),
            LossReason::NotAcknowledged {
                acknowledged,
                required,
            } => write!(
                f,
                "only {acknowledged} of {required} replicas acknowledged the renewal"
            ),
            other => other.fmt(f),
        }
    }
}

/// A key as error texts show it: in double quotes, with control characters and quotes escaped
/// (`printable` keys keep their `\xNN` escapes for non-UTF-8 bytes).
pub(crate) fn quoted(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 2);
    out.push('"');
    for c in key.chars() {
        if c.is_control() || c == '"' {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

/// A duration as error texts show it: to the millisecond (to the microsecond below 1 ms).
pub(crate) fn rounded(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    let shown = if nanos >= 1_000_000 {
        Duration::from_millis(u64::try_from((nanos + 500_000) / 1_000_000).unwrap_or(u64::MAX))
    } else {
        Duration::from_micros(u64::try_from((nanos + 500) / 1_000).unwrap_or(u64::MAX))
    };
    format!("{shown:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_acknowledgement_at_all_mentions_a_primary_without_replicas() {
        let none = TimeoutReason::NotAcknowledged {
            acknowledged: 0,
            required: 1,
        }
        .to_string();
        assert!(
            none.contains("check replica health") && none.contains("without replicas"),
            "{none}"
        );
        // A cluster made without replicas is replicated by default: the fix is the option, not
        // a setting the user never gave (an audit).
        assert!(
            none.contains("a cluster") && none.contains("replica_acknowledgement(false)"),
            "{none}"
        );
        let short = TimeoutReason::NotAcknowledged {
            acknowledged: 1,
            required: 2,
        }
        .to_string();
        assert!(!short.contains("without replicas"), "{short}");
    }

    #[test]
    fn a_retried_renewal_is_not_reported_as_a_loss() {
        let timeout = LossReason::RenewalFailed("Timeout Error: no reply".into());
        assert_eq!(
            AttemptFailure(&timeout).to_string(),
            "Timeout Error: no reply"
        );
        let short = LossReason::NotAcknowledged {
            acknowledged: 0,
            required: 1,
        };
        assert_eq!(
            AttemptFailure(&short).to_string(),
            "only 0 of 1 replicas acknowledged the renewal"
        );
    }

    #[test]
    fn display_names_key_namespace_and_reason() {
        let err = LockError::TimedOut {
            key: "account:42".into(),
            namespace: "billing".into(),
            waited: Duration::from_millis(2000),
            reason: TimeoutReason::Busy,
        };
        let text = err.to_string();
        assert!(text.contains("account:42") && text.contains("billing") && text.contains("2s"));
        let lost = LockError::LockLost {
            key: "k".into(),
            namespace: "n".into(),
            held: Duration::from_secs(1),
            reason: LossReason::NotOwner,
        };
        assert!(lost.to_string().contains("no longer holds"));
    }

    #[test]
    fn display_quotes_the_key_and_rounds_durations() {
        let err = LockError::TimedOut {
            key: "a b\nc\"d".into(),
            namespace: "n".into(),
            waited: Duration::from_nanos(2_000_123_456),
            reason: TimeoutReason::Busy,
        };
        let text = err.to_string();
        assert!(text.contains(r#"acquiring lock "a b\nc\"d" in"#), "{text}");
        assert!(text.starts_with("timed out after 2s acquiring"), "{text}");
        let lost = LockError::LockLost {
            key: "k".into(),
            namespace: "n".into(),
            held: Duration::from_nanos(1_234_567_891),
            reason: LossReason::NotOwner,
        };
        let text = lost.to_string();
        assert!(
            text.starts_with(r#"lock "k" in namespace "n" was lost after 1.235s:"#),
            "{text}"
        );
        let short = LockError::TimedOut {
            key: "k".into(),
            namespace: "n".into(),
            waited: Duration::from_nanos(300_456_789),
            reason: TimeoutReason::Busy,
        };
        assert!(
            short.to_string().starts_with("timed out after 300ms "),
            "{short}"
        );
        let tiny = LockError::TimedOut {
            key: "k".into(),
            namespace: "n".into(),
            waited: Duration::from_nanos(456_789),
            reason: TimeoutReason::Busy,
        };
        assert!(
            tiny.to_string().starts_with("timed out after 457µs "),
            "{tiny}"
        );
    }

    /// `std::io::Result` is a return type a `#[locked]` fn can use: the orphan rule keeps users
    /// from writing this conversion, so sage-lock does, keeping the `LockError` inside.
    #[test]
    fn converts_into_an_io_error_of_a_matching_kind() {
        use std::io::ErrorKind;
        let cases = [
            (
                LockError::TimedOut {
                    key: "k".into(),
                    namespace: "n".into(),
                    waited: Duration::from_secs(2),
                    reason: TimeoutReason::Busy,
                },
                ErrorKind::TimedOut,
            ),
            (
                LockError::invalid("lease", "too short"),
                ErrorKind::InvalidInput,
            ),
            (
                LockError::LockLost {
                    key: "k".into(),
                    namespace: "n".into(),
                    held: Duration::from_secs(1),
                    reason: LossReason::NotOwner,
                },
                ErrorKind::Other,
            ),
        ];
        for (error, kind) in cases {
            let text = error.to_string();
            let io = std::io::Error::from(error);
            assert_eq!(io.kind(), kind, "{text}");
            assert_eq!(io.to_string(), text);
            let inner = io.into_inner().expect("the LockError is kept");
            assert!(inner.downcast_ref::<LockError>().is_some(), "{text}");
        }
    }

    /// A `with_locks` nested in the task's own reentrant hold of one of its keys is refused
    /// too: the text must not send the user to an option already set (an audit).
    #[test]
    fn held_by_this_task_names_with_locks() {
        let text = TimeoutReason::HeldByThisTask.to_string();
        assert!(
            text.contains("with_locks") && text.contains("never"),
            "{text}"
        );
    }
}
