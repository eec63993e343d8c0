//! What the renewer needs to know about one hold: where it lives on the server and how long
//! its lease is.

use std::sync::Arc;
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::config::Server;

use crate::lease::Lease;
use crate::observe::Metrics;

/// Where one hold lives on the server, for renewal.
#[derive(Debug, Clone)]
pub(crate) struct RenewTarget {
    /// The key that holds the token (or the set it is a member of).
    pub(crate) key: Bytes,
    pub(crate) kind: HoldKind,
}

/// How a hold is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldKind {
    /// The key's value is the owner's token; its TTL is the lease.
    Owner,
    /// The token is a member of a sorted set, scored by its expiry (server ms). Used by the
    /// primitives that keep several holders per key (semaphore, read lock).
    Member,
}

impl HoldKind {
    /// The hold kind's code in the renewal script's arguments.
    pub(super) fn code(self) -> &'static str {
        match self {
            HoldKind::Owner => "o",
            HoldKind::Member => "m",
        }
    }
}

/// What the renewer needs about one hold.
pub(crate) struct Renewal {
    /// The hash slot of the hold's keys.
    pub(crate) slot: u16,
    pub(crate) target: RenewTarget,
    pub(crate) token: Bytes,
    pub(crate) lease_duration: Duration,
    pub(crate) replica_ack: bool,
    pub(crate) lease: Lease,
    /// The primary that granted the lock (replicated deployments).
    pub(crate) granted_by: Option<Server>,
    pub(crate) metrics: Arc<Metrics>,
}
