//! What an acquisition's attempts found so far: the reason it gives if its wait runs out, and
//! what bounds the delay before its next attempt.

use std::time::Duration;

use crate::error::TimeoutReason;

/// How long a last attempt cut by the deadline may have gone unanswered and the timeout still
/// blame the holder ([`Findings::cut_unanswered`]).
pub(super) const SILENT_AFTER: Duration = Duration::from_millis(250);

/// The last answer (or failure) an acquisition's attempts got.
#[derive(Debug, Default)]
pub(super) struct Findings {
    /// The last transient failure, if the last attempt failed.
    last_transient: Option<String>,
    /// The holder's remaining lease, when the last answer was "busy" and said it.
    pub(super) holder_pttl: Option<Duration>,
    /// Whether the last answer was "busy" (a holder exists, whatever its TTL).
    pub(super) busy: bool,
    /// The last grant was not acknowledged by enough replicas: (acknowledged, required).
    short: Option<(i64, i64)>,
}

impl Findings {
    /// The last attempt failed (or its grant came too late to use), transiently.
    pub(super) fn transient(&mut self, what: String) {
        *self = Findings {
            last_transient: Some(what),
            ..Findings::default()
        };
    }

    /// The last grant was acknowledged by too few replicas.
    pub(super) fn short(&mut self, acknowledged: i64, required: i64) {
        *self = Findings {
            short: Some((acknowledged, required)),
            ..Findings::default()
        };
    }

    /// The lock is held by another, whose lease has `pttl_ms` left (the server's `PTTL`).
    pub(super) fn busy(&mut self, pttl_ms: i64) {
        *self = Findings {
            busy: true,
            // A holder key without TTL (PTTL -1) or one that just expired (-2) tells nothing
            // about when it ends: the normal capped backoff applies, not a 1 ms poll. A PTTL of
            // 0 is a lease in its last millisecond: it ends now.
            holder_pttl: u64::try_from(pttl_ms).ok().map(Duration::from_millis),
            ..Findings::default()
        };
    }

    /// The last attempt, after "busy" answers, was cut by the deadline unanswered after
    /// `unanswered_for`: from [`SILENT_AFTER`] on, the server stopped answering (paused, frozen,
    /// overloaded) for much of the wait, which the earlier "busy" does not explain, so the
    /// timeout says so instead.
    pub(super) fn cut_unanswered(&mut self, unanswered_for: Duration) {
        if self.busy && unanswered_for >= SILENT_AFTER {
            self.transient(format!(
                "the last attempt got no answer in the {unanswered_for:.1?} before the wait ran \
                 out, after answers that the lock was held (the server paused, frozen or \
                 overloaded, or, on a replicated deployment, a replica not acknowledging)"
            ));
        }
    }

    /// The last attempt of a `wait` was cut by the deadline unanswered, with nothing found
    /// before it, while calls to this server have taken `typical` lately (zero: unknown): when
    /// that is longer than the whole wait, the wait was shorter than a round trip, and the
    /// timeout says so instead of blaming the server.
    pub(super) fn cut_before_a_round_trip(&mut self, wait: Duration, typical: Duration) {
        let found_nothing = !self.busy && self.last_transient.is_none() && self.short.is_none();
        if found_nothing && typical > wait {
            self.transient(format!(
                "no reply within the {wait:?} wait: calls to this server have taken \
                 {typical:.1?} lately (round trips, replica acknowledgements included); give \
                 waits more time than that"
            ));
        }
    }

    /// The last grant's (acknowledged, required), when too few replicas acknowledged it.
    pub(super) fn short_ack(&self) -> Option<(i64, i64)> {
        self.short
    }

    /// Why the wait ran out, from what the attempts found.
    pub(super) fn timeout_reason(&self) -> TimeoutReason {
        if let Some((acknowledged, required)) = self.short {
            return TimeoutReason::NotAcknowledged {
                acknowledged,
                required,
            };
        }
        match (&self.last_transient, self.busy) {
            (_, true) => TimeoutReason::Busy,
            (Some(error), false) => TimeoutReason::Unavailable(error.clone()),
            (None, false) => {
                TimeoutReason::Unavailable("no reply from the server within the wait".into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_answer_names_the_reason() {
        let mut findings = Findings::default();
        assert!(matches!(
            findings.timeout_reason(),
            TimeoutReason::Unavailable(_)
        ));
        findings.transient("connection reset".into());
        assert!(
            matches!(findings.timeout_reason(), TimeoutReason::Unavailable(e) if e == "connection reset")
        );
        findings.busy(1_500);
        assert!(matches!(findings.timeout_reason(), TimeoutReason::Busy));
        assert_eq!(findings.holder_pttl, Some(Duration::from_millis(1_500)));
        findings.short(0, 1);
        assert!(matches!(
            findings.timeout_reason(),
            TimeoutReason::NotAcknowledged {
                acknowledged: 0,
                required: 1
            }
        ));
        assert_eq!(findings.holder_pttl, None);
        // A holder without a TTL says nothing about when it ends.
        findings.busy(-1);
        assert_eq!(findings.holder_pttl, None);
        assert!(findings.busy);
    }

    /// Only a wait shorter than calls here typically take, whose attempts found nothing,
    /// blames the wait's length.
    #[test]
    fn a_cut_shorter_than_a_call_blames_the_wait() {
        let (cut, call) = (Duration::from_millis(100), Duration::from_millis(400));
        let mut findings = Findings::default();
        findings.cut_before_a_round_trip(cut, call);
        let TimeoutReason::Unavailable(why) = findings.timeout_reason() else {
            panic!("{:?}", findings.timeout_reason());
        };
        assert!(why.contains("have taken 400.0ms lately"), "{why}");
        for mut findings in [Findings::default(), Findings::default()] {
            findings.cut_before_a_round_trip(call, cut);
            findings.cut_before_a_round_trip(cut, Duration::ZERO);
            assert!(findings.last_transient.is_none());
        }
        let mut busy = Findings::default();
        busy.busy(1_000);
        busy.cut_before_a_round_trip(cut, call);
        assert!(matches!(busy.timeout_reason(), TimeoutReason::Busy));
    }

    /// An attempt that lands in the last millisecond of the holder's lease reads a PTTL of 0:
    /// the holder ends now, so the next attempt comes at once. Before, 0 counted as "tells
    /// nothing" and a queued waiter slept its whole poll (500 ms) past the expiry: a test of a
    /// lock left by a shut-down runtime saw it taken 1.5 s into a 1 s lease.
    #[test]
    fn a_lease_in_its_last_millisecond_ends_now() {
        let mut findings = Findings::default();
        findings.busy(0);
        assert_eq!(findings.holder_pttl, Some(Duration::ZERO));
    }
}
