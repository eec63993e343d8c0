//! Deadlines, backoff with jitter, and which failures are worth retrying.

use std::time::Duration;

use fred::error::{Error, ErrorKind};
use rand::Rng;
use tokio::time::Instant;

/// The detail text of a command (or a connection) cut short by the caller's deadline.
pub(crate) const DEADLINE_REACHED: &str = "no reply before the deadline";

/// How a failed command should be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Connection loss, routing change or a temporary refusal: retry within the deadline.
    /// The command may or may not have run; callers resolve that by token, never by blind resend
    /// of a non-idempotent command.
    Transient,
    /// Anything else (permissions, wrong type, syntax, bad configuration): return at once.
    Permanent,
}

/// Server error prefixes that mean "try again shortly".
const TRANSIENT_PREFIXES: [&str; 9] = [
    "LOADING",
    "BUSY",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "NOREPLICAS",
    "READONLY",
    "MOVED",
    "ASK",
];

/// Sorts a client error into [`Failure::Transient`] or [`Failure::Permanent`].
pub(crate) fn classify(error: &Error) -> Failure {
    if crate::connection::is_closed_error(error) {
        // The client was closed by `quit`: no retry can succeed.
        return Failure::Permanent;
    }
    match error.kind() {
        ErrorKind::IO
        | ErrorKind::Timeout
        | ErrorKind::Canceled
        | ErrorKind::Cluster
        | ErrorKind::Routing
        | ErrorKind::Backpressure
        | ErrorKind::Sentinel => Failure::Transient,
        // sage-lock's commands reply with raw values, which fred never converts: a parse error
        // is fred's own, reading the `CLUSTER SLOTS` of a cluster in the middle of a failover
        // (a node listed without an address). The next attempt refreshes the routing again.
        ErrorKind::Parse => Failure::Transient,
        ErrorKind::Unknown | ErrorKind::Protocol => {
            let details = error.details().trim_start();
            let is_transient = TRANSIENT_PREFIXES.iter().any(|prefix| {
                details.starts_with(prefix)
                    && details[prefix.len()..]
                        .chars()
                        .next()
                        .is_none_or(|c| c == ' ')
            });
            // fred reports a command it could not send (disconnected, max attempts 1) this way,
            // a cluster routing refresh that got no usable `CLUSTER SLOTS`, and a node it
            // connected to whose `CLUSTER INFO` state is not `ok` (both: a failover).
            // "channel closed" and "Failed to send command to router": the connection's task
            // ended with the runtime that ran it, while another runtime still uses the client;
            // the next attempt starts the connection again on the caller's runtime.
            let unsent = details.starts_with("Failed to route")
                || details.starts_with("Failed to send command to router")
                || details == "channel closed"
                || details.starts_with("Too many failed write attempts")
                || details.starts_with("Invalid or missing CLUSTER SLOTS")
                || details.starts_with("Invalid or missing cluster state")
                || details.contains("connection")
                || at_maxclients(error);
            // A script's `ASK`: it reached a key of a slot being migrated away that is no longer
            // on this node ("ERR Script attempted to access a non local key ..." on Redis, "ERR
            // Attempted to access a non local key ..." on Valkey). The attempt is retried (with
            // its token, as a lost reply is) until the migration ends.
            let migrating = details.starts_with("ERR ")
                && details.contains("ttempted to access a non local key");
            if is_transient || unsent || migrating {
                Failure::Transient
            } else {
                Failure::Permanent
            }
        }
        _ => Failure::Permanent,
    }
}

/// True when the server refused a new connection because it is at its `maxclients` limit (a
/// transient failure: connections close, the limit may be raised).
pub(crate) fn at_maxclients(error: &Error) -> bool {
    error.details().contains("max number of clients reached")
}

/// How a transient failure reads in a timeout: the error, and what to do about a server at its
/// connection limit.
pub(crate) fn transient_text(error: &Error) -> String {
    if at_maxclients(error) {
        format!("{error} ({AT_MAXCLIENTS})")
    } else {
        error.to_string()
    }
}

/// What to do about a server that refuses connections at its `maxclients` limit.
pub(crate) const AT_MAXCLIENTS: &str = "the server is at its maxclients limit: raise maxclients \
     (CONFIG SET maxclients N), or open fewer connections (fewer clients, a smaller \
     LockClientBuilder::max_connections)";

/// What to do about a write the server refused for want of memory (`OOM`), if it was that.
pub(crate) fn out_of_memory_hint(error: &Error) -> Option<&'static str> {
    error.details().trim_start().starts_with("OOM").then_some(
        "the server reached maxmemory and, with maxmemory-policy noeviction, refuses writes: \
         free memory or raise maxmemory (see the README on maxmemory-policy)",
    )
}

/// True when the server refused a write because the node is a replica.
pub(crate) fn is_readonly(error: &Error) -> bool {
    error.details().trim_start().starts_with("READONLY")
}

/// Capped exponential backoff with jitter.
///
/// Each delay is drawn uniformly from `[d/2, d]` where `d` doubles from `initial` up to `cap`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
    cap: Duration,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, cap: Duration) -> Self {
        Backoff { next: initial, cap }
    }

    /// The next delay, never longer than `limit`.
    pub(crate) fn next_delay(&mut self, limit: Duration) -> Duration {
        let ceiling = self.next.min(self.cap);
        self.next = (self.next * 2).min(self.cap);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        let jittered = rand::rng().random_range(nanos / 2..=nanos.max(1));
        Duration::from_nanos(jittered).min(limit)
    }
}

/// The instant `duration` from now; a duration too large to represent (e.g. `Duration::MAX`)
/// means "about thirty years", never a panic.
pub(crate) fn deadline_after(duration: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(duration)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 24 * 60 * 60))
}

/// Time left until `deadline`, zero once it has passed.
pub(crate) fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// `duration` in whole milliseconds, as a server argument (saturating).
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// `duration` in milliseconds rounded up, as a server argument (saturating): never shorter than
/// asked, for a hold that must last at least `duration`.
pub(crate) fn millis_ceil(duration: Duration) -> i64 {
    i64::try_from(duration.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_ceil_never_rounds_down() {
        assert_eq!(millis_ceil(Duration::from_micros(1)), 1);
        assert_eq!(millis_ceil(Duration::from_millis(5)), 5);
        assert_eq!(millis_ceil(Duration::from_micros(5_001)), 6);
        assert_eq!(millis_ceil(Duration::MAX), i64::MAX);
    }

    /// fred refreshes its cluster routing (`CLUSTER SLOTS`) when a node fails or a slot moves,
    /// and fails the command in flight when that refresh gets no answer it can use: found by
    /// the chaos suite (`--topology cluster`, seed 1314 on Valkey: one acquisition each
    /// returned `Backend` with these) during cluster failovers. Connecting to a node, fred
    /// also checks `CLUSTER INFO` and refuses a node whose `cluster_state` is not `ok` (seed
    /// 1334 on Redis: 8 acquisitions returned `Backend` with it).
    #[test]
    fn a_failed_cluster_routing_refresh_is_transient() {
        for error in [
            Error::new(
                ErrorKind::Protocol,
                "Invalid or missing CLUSTER SLOTS response.",
            ),
            Error::new(ErrorKind::Protocol, "Invalid or missing cluster state."),
            Error::new(ErrorKind::Parse, "Could not convert to string."),
        ] {
            assert_eq!(classify(&error), Failure::Transient, "{error}");
        }
        // A reply sage-lock itself cannot read stays permanent.
        let ours = Error::new(ErrorKind::Protocol, "unexpected reply to ROLE");
        assert_eq!(classify(&ours), Failure::Permanent);
    }

    #[test]
    fn transient_server_errors_are_recognised() {
        for text in [
            "LOADING Redis is loading",
            "TRYAGAIN x",
            "NOREPLICAS Not enough",
            "READONLY",
            // The temporary refusals: a script running too long, a cluster without quorum or
            // coverage, a replica cut off from its primary (`replica-serve-stale-data no`).
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "BUSY",
            "CLUSTERDOWN The cluster is down",
            "CLUSTERDOWN Hash slot not served",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            // A new (dedicated) connection refused at the server's connection limit.
            "ERR max number of clients reached",
            // A script that reached a key of a slot being migrated away which is no longer
            // here (an `ASK` for a script): chaos, cluster Redis, seed 1338, one acquisition
            // returned `Backend` with it.
            "ERR Script attempted to access a non local key in a cluster node script: \
             6b6b61e6e239775237da93ebd39984b853fc42ab, on @user_script:84.",
            // Valkey's wording of the same: chaos, cluster Valkey, seed 1370, one acquisition
            // returned `Backend` with it.
            "ERR Attempted to access a non local key in a cluster node script: on \
             @user_script:84.",
        ] {
            assert_eq!(
                classify(&Error::new(ErrorKind::Unknown, text)),
                Failure::Transient,
                "{text}"
            );
        }
        for text in [
            "NOPERM this user has no permissions",
            "WRONGTYPE Operation",
            "BUSYKEY x",
            "BUSYGROUP Consumer Group name already exists",
        ] {
            assert_eq!(
                classify(&Error::new(ErrorKind::Unknown, text)),
                Failure::Permanent,
                "{text}"
            );
        }
        assert_eq!(
            classify(&Error::new(ErrorKind::IO, "reset")),
            Failure::Transient
        );
        assert_eq!(
            classify(&Error::new(ErrorKind::Auth, "bad")),
            Failure::Permanent
        );
    }

    #[test]
    fn huge_durations_do_not_overflow() {
        assert!(deadline_after(Duration::MAX) > Instant::now() + Duration::from_secs(3600));
    }

    #[test]
    fn backoff_grows_to_cap_and_respects_limit() {
        let mut backoff = Backoff::new(Duration::from_millis(4), Duration::from_millis(64));
        let mut last = Duration::ZERO;
        for _ in 0..10 {
            last = backoff.next_delay(Duration::from_secs(1));
            assert!(last <= Duration::from_millis(64));
        }
        assert!(last >= Duration::from_millis(32));
        assert_eq!(
            backoff.next_delay(Duration::from_millis(1)),
            Duration::from_millis(1)
        );
    }
}
