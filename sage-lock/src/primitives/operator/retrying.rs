//! The operator calls' retries: each server call is sent again after a failure that the call
//! allows, with the lock calls' backoff, within the command timeout.

use std::time::Duration;

use fred::error::{Error, ErrorKind};
use tokio::time::Instant;

use crate::connection::OpError;
use crate::retry::{Backoff, DEADLINE_REACHED, Failure, classify, remaining};

/// `future`'s outcome, or a timeout error once `deadline` passes.
pub(super) async fn bounded<T>(
    deadline: Instant,
    future: impl Future<Output = Result<T, Error>>,
) -> Result<T, OpError> {
    match tokio::time::timeout_at(deadline, future).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(OpError::Failed(Error::new(
            ErrorKind::Timeout,
            DEADLINE_REACHED,
        ))),
    }
}

/// Whether a failed read may be sent again: after any transient failure (see
/// [`crate::retry::classify`]: a slot being migrated, which answers `ASK` or `TRYAGAIN`; a
/// `MOVED` met before fred's routing was refreshed; a lost connection).
pub(super) fn transient(error: &Error) -> bool {
    classify(error) == Failure::Transient
}

/// Whether a failed write may be sent again without having run: the server (or fred) refused it
/// before running it, for a redirection not followed or a slot being migrated (`Routing`), or
/// with a transient refusal such as `TRYAGAIN` or `CLUSTERDOWN`. Not after a lost connection
/// or a timeout, after which it may have run.
pub(super) fn refused(error: &Error) -> bool {
    const REFUSALS: [&str; 9] = [
        "TRYAGAIN",
        "CLUSTERDOWN",
        "LOADING",
        "MASTERDOWN",
        "BUSY",
        "READONLY",
        "MOVED",
        "ASK",
        "Failed to route",
    ];
    if !transient(error) {
        return false;
    }
    match error.kind() {
        ErrorKind::Routing => true,
        ErrorKind::Unknown | ErrorKind::Protocol => {
            let details = error.details().trim_start();
            REFUSALS.iter().any(|refusal| details.starts_with(refusal))
        }
        _ => false,
    }
}

/// Runs `attempt` until it succeeds or fails for good: a failure `again` accepts ([`transient`]
/// for a read, [`refused`] for a write) is tried again after the lock calls' backoff until
/// `deadline`, which `attempt` is to bound its own call by. Giving up, it returns the last
/// failure (the one before the deadline's timeout, when that cut the last attempt short) and
/// says how long it retried.
pub(super) async fn retrying<T, F, Fut>(
    deadline: Instant,
    again: fn(&Error) -> bool,
    mut attempt: F,
) -> Result<T, OpError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, OpError>>,
{
    let started = Instant::now();
    let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(100));
    let mut attempts = 0_u32;
    let mut cause: Option<Error> = None;
    loop {
        attempts += 1;
        let error = match attempt().await {
            Err(OpError::Failed(error)) if again(&error) => error,
            other => return other,
        };
        let left = remaining(deadline);
        if left.is_zero() {
            return Err(OpError::Failed(gave_up(
                error,
                cause,
                attempts,
                started.elapsed(),
            )));
        }
        if *error.kind() != ErrorKind::Timeout {
            cause = Some(error);
        }
        tokio::time::sleep(backoff.next_delay(left)).await;
    }
}

/// The error of a call [`retrying`] gave up on after `attempts`: the last failure, and the
/// earlier `cause` when the last was the deadline's timeout.
fn gave_up(last: Error, cause: Option<Error>, attempts: u32, took: Duration) -> Error {
    if attempts <= 1 {
        return last;
    }
    let (kind, details) = match cause {
        Some(cause) if *last.kind() == ErrorKind::Timeout => (
            cause.kind().clone(),
            format!("{} (then {})", cause.details(), last.details()),
        ),
        _ => (last.kind().clone(), last.details().to_owned()),
    };
    Error::new(
        kind,
        format!(
            "{details}; gave up after {attempts} attempts in {:.1} s (the command timeout \
             bounds an operator call)",
            took.as_secs_f64()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_given_up_says_why_and_how_long_it_retried() {
        let server = || Error::new(ErrorKind::Unknown, "TRYAGAIN Multiple keys request");
        let deadline = || Error::new(ErrorKind::Timeout, DEADLINE_REACHED);
        // Tried once: the failure as it came.
        let once = gave_up(server(), None, 1, Duration::from_millis(3));
        assert_eq!(once.details(), server().details());
        // Cut short by the deadline after retries: the server's answer comes first.
        let retried = gave_up(deadline(), Some(server()), 18, Duration::from_secs(1));
        assert_eq!(*retried.kind(), ErrorKind::Unknown);
        assert!(
            retried.details().starts_with("TRYAGAIN")
                && retried.details().contains(DEADLINE_REACHED)
                && retried
                    .details()
                    .contains("gave up after 18 attempts in 1.0 s"),
            "{retried}"
        );
        assert_eq!(classify(&retried), Failure::Transient);
    }

    #[test]
    fn a_write_is_sent_again_only_when_refused_unrun() {
        for (kind, text) in [
            (
                ErrorKind::Unknown,
                "TRYAGAIN Multiple keys request during rehashing of slot",
            ),
            (ErrorKind::Unknown, "CLUSTERDOWN The cluster is down"),
            (ErrorKind::Routing, "hash slot 1 is being migrated (ASK)"),
            (ErrorKind::Routing, "Too many redirections."),
        ] {
            let error = Error::new(kind, text);
            assert!(refused(&error) && transient(&error), "{error}");
        }
        for (kind, text) in [
            (ErrorKind::IO, "connection reset"),
            (ErrorKind::Timeout, DEADLINE_REACHED),
            (ErrorKind::Unknown, "WRONGTYPE Operation"),
        ] {
            assert!(!refused(&Error::new(kind, text)), "{text}");
        }
    }
}
