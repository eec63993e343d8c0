//! How many replicas must acknowledge a write on a primary: the replica-count floor.
//!
//! `WAIT n` only counts the replicas the primary lists *now*, and a primary does not know why a
//! replica left. During a Sentinel failover the replica being promoted (`REPLICAOF NO ONE`) leaves
//! the old primary's list first; the old primary keeps accepting writes until Sentinel moves the
//! other replicas to the new primary and, seconds later, demotes the old one. A write made in that
//! window and acknowledged by the replicas still attached is thrown away when those replicas
//! resync from the new primary, which never saw it: the lock key and its fencing `INCR` are gone,
//! and the new primary grants the same fencing token again (found by the chaos suite,
//! `--topology sentinel --server valkey --seconds 8 --seed 6`: token 5 granted twice, one update
//! lost).
//!
//! So the count a primary's writes need never drops on the primary's word alone: per node, the
//! client keeps the highest replica count it has seen (the *floor*), and requires
//! `max(listed now, floor, 1)` acknowledgements. A write while a replica is missing is then
//! `Ack::Short`: an acquisition undoes its grant and retries (then `TimedOut(NotAcknowledged)`),
//! a renewal retries until the usable lease runs out (then `LockLost(NotAcknowledged)`).
//!
//! The floor comes down to a smaller count once this client has seen the node list fewer
//! replicas continuously for [`REPLICA_LOSS_HOLD`] (the clock starts at the first `ROLE` that
//! shows the smaller count); a count back at or above the floor restores it at once. That is the
//! price of a replica that really died or was removed: writes on its primary are refused for
//! `REPLICA_LOSS_HOLD` after the client first notices (locks held meanwhile are lost when their
//! usable lease ends). Sentinel moves the remaining replicas to the promoted one within about a
//! second of promoting it (its `INFO` period during a failover), after which the old primary has
//! no acknowledging replica at all; the hold covers that window several times over. A ROLE that
//! shows the node is not a primary forgets its floor: a node promoted again starts afresh.
//!
//! The count alone is not enough: replicas are also tracked by identity (`ip:port` from `ROLE`).
//! A replica that a primary listed and no longer lists still counts as one that must
//! acknowledge, until it has been missing for [`REPLICA_LOSS_HOLD`] or is listed again; a
//! replica that joined meanwhile does not stand in for it. The chaos suite found why
//! (`--topology sentinel --server redis --seconds 120 --seed 7`, 7 tokens granted twice): Sentinel
//! promoted the old primary's only replica and, before that failover ended, attached the previous
//! failover's not yet demoted primary to the *old* primary (`+convert-to-slave`, because its
//! configuration still named the old one). The count was back to 1; grants acknowledged by that
//! newcomer were dropped when it resynced from the new primary a fraction of a second later.
//!
//! A `ROLE` counts only for the node that answered it: in a cluster, a round whose routing
//! changed while it was in flight, or whose `ROLE` lists the node it was meant for as a replica,
//! is not recorded and runs again (see [`crate::topology`]). Recorded under the wrong node, the
//! other node's replica list made the right one seem to have lost a replica, and its writes
//! needed one more acknowledgement than it could get for [`REPLICA_LOSS_HOLD`].
//!
//! The floor is learned, per client, from what it has observed (an idle client keeps its floor:
//! the hold runs only from the first `ROLE` showing the smaller count). A client that has seen no
//! `ROLE` yet (a new process, possibly arriving inside such a window) starts, through Sentinel,
//! from Sentinel's count of replicas that are up ([`crate::sentinel`]). What this does not cover:
//! a client without Sentinel (or whose Sentinels do not answer) starts from `ROLE`; identities
//! are what `ROLE` reports (a replica announcing another address counts as another replica);
//! and a failover that takes longer than the hold to move the remaining replicas (many replicas
//! with `parallel-syncs 1`, large datasets) reopens the window. Sentinel's view cannot replace
//! `ROLE`: it names the old primary (`SENTINEL GET-MASTER-ADDR-BY-NAME`) until the replicas are
//! reconfigured.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fred::types::config::Server;

/// How long a primary must be seen listing fewer replicas than before until sage-lock accepts
/// acknowledgement from the smaller set (see the README's "Limits": replicated deployments).
///
/// Until then, writes on that primary count as not acknowledged: a replica that left may have
/// been promoted, and a write it did not see would be lost in the failover.
///
/// ```
/// assert!(sage_lock::REPLICA_LOSS_HOLD >= std::time::Duration::from_secs(1));
/// ```
pub const REPLICA_LOSS_HOLD: Duration = Duration::from_secs(5);

/// What the client knows about one primary's replicas.
#[derive(Debug, Clone)]
struct NodeHint {
    /// The count the last `ROLE` listed: the first guess for `WAIT` (0: start over).
    last: i64,
    /// The highest count seen, until the node has listed fewer for [`REPLICA_LOSS_HOLD`].
    floor: i64,
    /// Since when `ROLE` has listed fewer than `floor` replicas.
    shrunk_since: Option<Instant>,
    /// Replicas (`ip:port`) the node listed before and does not list now, with since when:
    /// each still counts as a replica that must acknowledge, until it has been missing for
    /// [`REPLICA_LOSS_HOLD`] (or is listed again). A newcomer does not stand in for one.
    missing: HashMap<String, Instant>,
    /// The replicas the last `ROLE` listed.
    listed: Vec<String>,
}

impl NodeHint {
    fn new(last: i64, floor: i64) -> NodeHint {
        NodeHint {
            last,
            floor,
            shrunk_since: None,
            missing: HashMap::new(),
            listed: Vec::new(),
        }
    }

    /// The floor as of `now` (the hold may have passed since the last `ROLE`).
    fn floor_at(&self, now: Instant) -> i64 {
        match self.shrunk_since {
            Some(since) if now.saturating_duration_since(since) >= REPLICA_LOSS_HOLD => self.last,
            _ => self.floor,
        }
    }

    /// Replicas that left less than [`REPLICA_LOSS_HOLD`] before `now`.
    fn missing_at(&self, now: Instant) -> i64 {
        let recent = self
            .missing
            .values()
            .filter(|since| now.saturating_duration_since(**since) < REPLICA_LOSS_HOLD)
            .count();
        i64::try_from(recent).unwrap_or(i64::MAX)
    }

    /// Records the replicas a `ROLE` listed at `now`.
    fn observe_members(&mut self, listed: &[String], now: Instant) {
        for gone in self.listed.iter().filter(|id| !listed.contains(id)) {
            self.missing.entry(gone.clone()).or_insert(now);
        }
        for id in listed {
            self.missing.remove(id);
        }
        self.missing
            .retain(|_, since| now.saturating_duration_since(*since) < REPLICA_LOSS_HOLD);
        self.listed = listed.to_vec();
    }
}

/// Per-primary replica counts: the first guess for `WAIT` and the floor of what it must get.
/// Kept per node (not per slot), so a replica leaving costs one short `WAIT` per primary, not
/// per slot.
#[derive(Debug, Default)]
pub(crate) struct ReplicaHints(
    Mutex<HashMap<Option<Server>, NodeHint>>,
    /// The `WAIT`s that came back short since the last acknowledged one (see [`ShortWaits`]).
    Mutex<Option<ShortWaits>>,
);

/// `WAIT`s that came back short in a row: how many, when the last did, and its
/// (acknowledged, required).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShortWaits {
    in_a_row: u32,
    last_at: Instant,
    acknowledged: i64,
    required: i64,
}

/// Short `WAIT`s in a row that say the replicas are not acknowledging (a replica down, a
/// failover), not one slow acknowledgement on an overloaded machine.
const SHORT_IN_A_ROW: u32 = 2;

impl ReplicaHints {
    /// Records a `WAIT` that too few replicas acknowledged.
    pub(crate) fn came_back_short(&self, acknowledged: i64, required: i64) {
        if let Ok(mut last) = self.1.lock() {
            let in_a_row = last.map_or(0, |short| short.in_a_row) + 1;
            *last = Some(ShortWaits {
                in_a_row,
                last_at: Instant::now(),
                acknowledged,
                required,
            });
        }
    }

    /// Records a `WAIT` that enough replicas acknowledged.
    pub(crate) fn came_back_acknowledged(&self) {
        if let Ok(mut last) = self.1.lock()
            && last.is_some()
        {
            *last = None;
        }
    }

    /// The last `WAIT`'s (acknowledged, required) when the `WAIT`s have been coming back short
    /// ([`SHORT_IN_A_ROW`] or more in a row, the last within `within`): the replicas are not
    /// acknowledging now, and `WAIT`s hold their connections until they end.
    pub(crate) fn short_within(&self, within: Duration) -> Option<(i64, i64)> {
        let last = (*self.1.lock().ok()?)?;
        (last.in_a_row >= SHORT_IN_A_ROW && last.last_at.elapsed() <= within)
            .then_some((last.acknowledged, last.required))
    }

    /// The replica count to send with `WAIT` before this round's `ROLE` is known (at least 1).
    pub(crate) fn guess(&self, node: &Option<Server>) -> i64 {
        self.guess_at(node, Instant::now())
    }

    fn guess_at(&self, node: &Option<Server>, now: Instant) -> i64 {
        self.0
            .lock()
            .ok()
            .and_then(|map| {
                map.get(node).map(|h| {
                    h.last
                        .saturating_add(h.missing_at(now))
                        .max(h.floor_at(now))
                })
            })
            .unwrap_or(1)
            .max(1)
    }

    /// Records a `ROLE` of `node` (the replicas it lists, `ip:port`; `primary`: its role) and
    /// returns how many replicas must acknowledge a write it made: at least the listed count
    /// plus the replicas that left it recently, the floor, and 1.
    pub(crate) fn observe(&self, node: Option<Server>, primary: bool, listed: &[String]) -> i64 {
        self.observe_at(node, primary, listed, Instant::now())
    }

    fn observe_at(
        &self,
        node: Option<Server>,
        primary: bool,
        listed: &[String],
        now: Instant,
    ) -> i64 {
        let replicas = i64::try_from(listed.len()).unwrap_or(i64::MAX);
        let Ok(mut map) = self.0.lock() else {
            return replicas.max(1);
        };
        if !primary {
            map.remove(&node);
            return replicas.max(1);
        }
        let hint = map
            .entry(node.clone())
            .or_insert_with(|| NodeHint::new(replicas, replicas));
        hint.last = replicas;
        hint.observe_members(listed, now);
        let with_missing = replicas.saturating_add(hint.missing_at(now));
        if replicas >= hint.floor {
            hint.floor = replicas;
            hint.shrunk_since = None;
        } else {
            let since = *hint.shrunk_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= REPLICA_LOSS_HOLD {
                hint.floor = replicas;
                hint.shrunk_since = None;
            }
        }
        let required = with_missing.max(hint.floor).max(1);
        // The floor of 1 alone is not news (a primary without replicas always has it, and a
        // client without acknowledgement never waits for it): only replicas that left are.
        if with_missing.max(hint.floor) > replicas {
            tracing::debug!(
                node = ?node.as_ref().map(|node| format!("{}:{}", node.host, node.port)),
                ?listed,
                missing = ?hint.missing.keys().collect::<Vec<_>>(),
                floor = hint.floor,
                required,
                "more replicas must acknowledge than the primary lists"
            );
        }
        required
    }

    /// Raises `node`'s floor to `replicas` (what Sentinel knows of, for a client that has seen no
    /// `ROLE` of the node yet); a smaller count listed later must then last the hold like any.
    pub(crate) fn seed(&self, node: Option<Server>, replicas: i64) {
        if let Ok(mut map) = self.0.lock() {
            let hint = map
                .entry(node)
                .or_insert_with(|| NodeHint::new(0, replicas));
            hint.floor = hint.floor.max(replicas);
        }
    }

    /// A failover may be under way: the `WAIT` guesses start over low (a guess too low costs one
    /// more round trip; one too high makes `WAIT` block until its bound). The floors stay: they
    /// are what protects writes in a failover.
    pub(crate) fn forget_guesses(&self) {
        if let Ok(mut map) = self.0.lock() {
            for hint in map.values_mut() {
                hint.last = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` replicas, `127.0.0.1:7001` and up.
    fn n(count: u16) -> Vec<String> {
        (1..=count)
            .map(|i| format!("127.0.0.1:{}", 7000 + i))
            .collect()
    }

    #[test]
    fn a_replica_leaving_keeps_the_floor_for_the_hold() {
        let hints = ReplicaHints::default();
        let t0 = Instant::now();
        assert_eq!(hints.guess_at(&None, t0), 1, "no history: at least 1");
        assert_eq!(hints.observe_at(None, true, &n(2), t0), 2);
        // One replica leaves (promoted elsewhere, or dead): still 2, for the whole hold.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(hints.observe_at(None, true, &n(1), t1), 2);
        assert_eq!(hints.guess_at(&None, t1), 2);
        let almost = t1 + REPLICA_LOSS_HOLD - Duration::from_millis(1);
        assert_eq!(hints.observe_at(None, true, &n(1), almost), 2);
        // Forgetting the guesses keeps the floor.
        hints.forget_guesses();
        assert_eq!(hints.guess_at(&None, almost), 2);
        // Seen shrunk for the hold: the smaller count is accepted (the guess follows first).
        let after = t1 + REPLICA_LOSS_HOLD;
        assert_eq!(hints.guess_at(&None, after), 1);
        assert_eq!(hints.observe_at(None, true, &n(1), after), 1);
        assert_eq!(hints.observe_at(None, true, &n(0), after), 1, "at least 1");
    }

    #[test]
    fn a_returning_replica_restores_the_count_and_resets_the_clock() {
        let hints = ReplicaHints::default();
        let t0 = Instant::now();
        hints.observe_at(None, true, &n(2), t0);
        hints.observe_at(None, true, &n(1), t0);
        let back = t0 + REPLICA_LOSS_HOLD / 2;
        assert_eq!(hints.observe_at(None, true, &n(2), back), 2);
        // A second departure starts the hold again.
        let gone = back + Duration::from_millis(10);
        assert_eq!(hints.observe_at(None, true, &n(1), gone), 2);
        assert_eq!(
            hints.observe_at(None, true, &n(1), t0 + REPLICA_LOSS_HOLD),
            2
        );
        assert_eq!(
            hints.observe_at(None, true, &n(1), gone + REPLICA_LOSS_HOLD),
            1
        );
        // More replicas raise the floor at once.
        assert_eq!(
            hints.observe_at(None, true, &n(3), gone + REPLICA_LOSS_HOLD),
            3
        );
    }

    #[test]
    fn a_newcomer_does_not_stand_in_for_a_replica_that_left() {
        // Sentinel promotes the old primary's one replica (7001), then, before the failover
        // ends, attaches another node (7002) to the old primary: the count is back to 1, but
        // 7002 will resync from the new primary and drop what it acknowledged here.
        let hints = ReplicaHints::default();
        let t0 = Instant::now();
        let one = vec!["127.0.0.1:7001".to_owned()];
        let other = vec!["127.0.0.1:7002".to_owned()];
        assert_eq!(hints.observe_at(None, true, &one, t0), 1);
        assert_eq!(hints.observe_at(None, true, &[], t0), 1);
        let swapped = t0 + Duration::from_millis(900);
        assert_eq!(hints.observe_at(None, true, &other, swapped), 2);
        assert_eq!(hints.guess_at(&None, swapped), 2);
        // Seen directly, without the empty list in between, too.
        let direct = ReplicaHints::default();
        direct.observe_at(None, true, &one, t0);
        assert_eq!(direct.observe_at(None, true, &other, t0), 2);
        // Once the replica has been gone for the hold, the newcomer is enough.
        let later = t0 + REPLICA_LOSS_HOLD;
        assert_eq!(hints.observe_at(None, true, &other, later), 1);
        assert_eq!(direct.observe_at(None, true, &other, later), 1);
        // The one that left coming back clears it at once.
        let back = ReplicaHints::default();
        back.observe_at(None, true, &one, t0);
        assert_eq!(back.observe_at(None, true, &other, t0), 2);
        let both = [one[0].clone(), other[0].clone()];
        assert_eq!(back.observe_at(None, true, &both, t0), 2);
        assert_eq!(back.observe_at(None, true, &other, t0), 2, "it left again");
    }

    #[test]
    fn a_seeded_floor_needs_the_hold_to_come_down() {
        let hints = ReplicaHints::default();
        let t0 = Instant::now();
        hints.seed(None, 2);
        assert_eq!(hints.guess_at(&None, t0), 2);
        assert_eq!(hints.observe_at(None, true, &n(1), t0), 2);
        assert_eq!(
            hints.observe_at(None, true, &n(1), t0 + REPLICA_LOSS_HOLD),
            1
        );
        // A seed never lowers what was seen.
        hints.observe_at(None, true, &n(3), t0 + REPLICA_LOSS_HOLD);
        hints.seed(None, 1);
        assert_eq!(
            hints.observe_at(None, true, &n(3), t0 + REPLICA_LOSS_HOLD),
            3
        );
    }

    #[test]
    fn floors_are_per_node_and_a_demoted_node_forgets_its_own() {
        let hints = ReplicaHints::default();
        let t0 = Instant::now();
        let (a, b) = (
            Some(Server::new("10.0.0.1", 6379)),
            Some(Server::new("10.0.0.2", 6379)),
        );
        hints.observe_at(a.clone(), true, &n(2), t0);
        assert_eq!(hints.observe_at(b.clone(), true, &n(1), t0), 1);
        assert_eq!(hints.observe_at(a.clone(), true, &n(1), t0), 2);
        // `a` is a replica now; promoted again later, it starts from what it lists then.
        assert_eq!(hints.observe_at(a.clone(), false, &n(0), t0), 1);
        assert_eq!(hints.observe_at(a, true, &n(1), t0), 1);
    }
}
