//! Renewing the leases of one unit at once, outside the schedule, and waiting for the answer:
//! the multi-key lock confirms the keys it took earlier before its body starts.

use super::Renewal;
use super::batch::{Batch, Outcome, Place};
use crate::connection::Connection;
use crate::error::LossReason;

/// Renews `parts` (the keys of one unit, all in one hash slot) in one call now: `Ok` when every
/// one was renewed, else the first part that was not, and why: lost (another owner's token, or
/// none), or not confirmed (a transient failure, replicas that did not acknowledge, a slot that
/// moved). The leases' own schedule is left as it is.
pub(crate) async fn confirm(
    conn: &Connection,
    parts: &[Renewal],
) -> Result<(), (usize, LossReason)> {
    let Some(first) = parts.first() else {
        return Ok(());
    };
    let mut batch = Batch::new(first, &Place::Slot(first.slot));
    for (id, part) in (0_u64..).zip(parts) {
        batch.add(id, part);
    }
    for (id, outcome) in batch.renew(conn).await.outcomes {
        match outcome {
            Outcome::Renewed => {}
            Outcome::Lost(reason)
            | Outcome::Retry(reason)
            | Outcome::Elsewhere(reason)
            | Outcome::Closed(reason) => {
                return Err((usize::try_from(id).unwrap_or(0), reason));
            }
        }
    }
    Ok(())
}
