//! Hand-offs: how a waiter trusts a grant a release made to it on the server, announced by
//! notification, without asking the server again.

use std::sync::Arc;
use std::time::Duration;

use super::HANDOFF_LEASE;
use super::hold::safety_lead;
use crate::key::LockKeys;
use crate::lease::{Lease, drift};
use crate::notify::Grant;
use crate::options::LockSettings;

/// The lease of a hold a release handed to this waiter, queued at `queued_at` by an attempt
/// that took `round_trip`; `None` when too little of it may be left to trust without asking the
/// server (the next attempt confirms it, and gets the whole lease).
pub(super) fn handed_off(
    grant: Grant,
    queued_at: std::time::Instant,
    round_trip: Duration,
    settings: &LockSettings,
    keys: &Arc<LockKeys>,
) -> Option<Lease> {
    // The server set the hand-off lease no earlier than this process's own release was sent,
    // nor than this waiter's last busy attempt.
    let since = grant.since.map_or(queued_at, |since| since.max(queued_at));
    // The release set the hand-off lease it says (earlier versions: always the longest).
    let granted_for = settings.lease.min(grant.lease.unwrap_or(HANDOFF_LEASE));
    let margin = drift(settings.lease);
    let valid_until = since + granted_for.saturating_sub(margin);
    let now = std::time::Instant::now();
    // Beyond what the hold's safety net keeps in reserve (a long lease's margin can exceed half
    // the hand-off lease), a quarter of the hand-off lease must be left, and three of this
    // waiter's round trips: the first renewal, due a third of the way through what is left,
    // must be answered before the rest runs out.
    let reserve = safety_lead(settings.lease, margin);
    let needed = (granted_for / 4).max(round_trip.saturating_mul(3));
    if valid_until.saturating_duration_since(now) < reserve + needed {
        return None;
    }
    // Held from now on, as far as the minimum hold and `held_for` are concerned.
    Some(Lease::new(
        Arc::clone(keys),
        Arc::clone(&settings.namespace),
        grant.fence,
        now,
        valid_until,
        margin,
    ))
}
