//! Cluster redirections (`MOVED`, `ASK`) of lock scripts, handled by the lock layer.
//!
//! fred follows no redirection for a lock client (`max_redirections = 0`, set with
//! `max_command_attempts = 1` where the client is built). If it did, a script redirected inside
//! the replicated pipeline (`ROLE`, `EVALSHA`, `WAIT`) would run on the slot's new owner while
//! `ROLE` and `WAIT` ran on the old one, whose replicas would "acknowledge" a write they never
//! saw; and with one write attempt per command, fred's `ASKING` finds no attempt left and the
//! client's connection task ends for good (every later command on it hangs). Instead a
//! redirected script comes back as an error, nothing of it having run, and:
//!
//! - after `MOVED`, fred has refreshed its routing before reporting the error: the caller runs
//!   the whole attempt again, all of it on the slot's new owner ([`after_redirection`]);
//! - after `ASK` (the slot is migrating and the lock's keys have left its owner) the routing is
//!   unchanged: the attempt fails with a transient error and the engine retries within its
//!   deadline until the migration ends. (Following `ASK` with `ASKING` would not help: the
//!   importing node answers `TRYAGAIN` to a multi-key script while any of its keys is missing,
//!   and the lock scripts always name keys that usually do not exist, such as the waiter queue.)

use fred::clients::Client;
use fred::error::{Error, ErrorKind};
use fred::interfaces::{ClientLike, ClusterInterface};
use fred::types::config::Server;

/// How many redirections one call follows before it reports the last one.
pub(crate) const MAX_REDIRECTIONS: u32 = 3;

/// The owner of `slot` per `conn`'s cached routing (in a cluster; else `None`).
pub(crate) fn owner(conn: &Client, slot: u16) -> Option<Server> {
    if conn.is_clustered() {
        conn.cached_cluster_state()
            .and_then(|routing| routing.get_server(slot).cloned())
    } else {
        None
    }
}

/// True when fred reports a redirection it did not follow (`MOVED` or `ASK`): the command did
/// not run.
pub(crate) fn is_redirection(error: &Error) -> bool {
    *error.kind() == ErrorKind::Routing && error.details().starts_with("Too many redirections")
}

/// True for a pipeline result that is a redirection (see [`is_redirection`]).
pub(crate) fn is_redirected<T>(result: &Result<T, Error>) -> bool {
    result.as_ref().err().is_some_and(is_redirection)
}

/// After an attempt sent to `tried` (the slot's owner then) was redirected: `Ok` when the
/// routing now names another owner (`MOVED`: run the whole attempt again), else a transient
/// error saying the slot is migrating (`ASK`, or a routing refresh that has not seen the move
/// yet).
pub(crate) fn after_redirection(
    conn: &Client,
    slot: u16,
    tried: Option<&Server>,
) -> Result<(), Error> {
    if owner(conn, slot).as_ref() != tried {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Routing,
        format!(
            "hash slot {slot} is being migrated (ASK) or its new owner is not known yet \
             (retried until the migration ends or the call's deadline passes)"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirections_are_told_apart() {
        let routing = Error::new(ErrorKind::Routing, "Too many redirections.");
        assert!(is_redirection(&routing));
        assert!(is_redirected::<()>(&Err(routing)));
        let other = Error::new(ErrorKind::Routing, "Max attempts reached.");
        assert!(!is_redirection(&other));
        assert!(!is_redirected(&Ok(1)));
    }

    #[test]
    fn migrating_error_is_transient() {
        let error = Error::new(ErrorKind::Routing, "hash slot 1 is being migrated");
        assert_eq!(
            crate::retry::classify(&error),
            crate::retry::Failure::Transient
        );
    }
}
