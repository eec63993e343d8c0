//! Checks a run's histories, fault records and store contents.
//!
//! - Store: for every key `value == accepted` (no lost update), the accepted tokens never go
//!   down, and every write a worker saw accepted is counted.
//! - Overlaps: two critical sections (acquired .. body done) on one key that overlap in time,
//!   unless both are readers of a read-write lock, must be explained by a reported `LockLost` of one of them, a pause of one holder (SIGSTOP by the
//!   nemesis, or a recorded runtime stall of at least a quarter lease), or a data-losing fault
//!   (restart, failover) whose window, plus one lease, meets the overlap. Anything else is a
//!   violation. On a semaphore key, more than its permits of holders at once must be explained
//!   the same way: holders that lost their lease or were paused do not count. Recorded sections lie inside the real holding intervals (acquired is recorded
//!   after the grant, done before the release), so a recorded overlap is a real one.
//! - Fencing tokens: no token is granted twice for one key, except after a data-losing fault.
//! - Loss reports: every `LockLost` must come within lease/3 + the detection bound of a cause:
//!   the end of a pause of its process (bound 0; a loss recorded during the pause counts, as the
//!   process records it the moment it resumes), or a server or network fault (bound: the
//!   fault's duration plus one lease, the longest a usable lease can outlive its last renewal),
//!   plus [`SCHED_SLACK`] for a shared machine. Others are late loss reports.
//! - Recovery: every worker's probe after the quiet period acquired within 2 × lease.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::clock::{as_ms, ns};
use super::faults::{Class, FaultKind, FaultRecord};
use super::history::{Event, Hold, PROCESS, Record, WriteOutcome};
use super::store::KeyState;
use super::store_keys;

/// Scheduling slack allowed on top of every detection bound (a loaded 2-core machine).
pub const SCHED_SLACK: Duration = Duration::from_millis(250);

/// One process's history.
#[derive(Debug)]
pub struct ProcessHistory {
    pub name: String,
    pub records: Vec<Record>,
    pub killed_at: Option<u64>,
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Report {
    pub sections: usize,
    pub violations: Vec<String>,
    pub late_losses: Vec<String>,
    /// Counters for the detail lines (overlaps explained by reason, errors by kind, ...).
    pub counts: BTreeMap<String, u64>,
}

impl Report {
    fn count(&mut self, what: impl Into<String>) {
        *self.counts.entry(what.into()).or_default() += 1;
    }
}

#[derive(Debug, Clone)]
struct Section {
    process: usize,
    task: u32,
    key: String,
    /// 0 when not known (the later keys of `with_locks` in histories written before
    /// `Lease::fencing_token_of`).
    token: u64,
    hold: Hold,
    start: u64,
    end: u64,
    lost: bool,
}

/// A window `[start, end]` in which a process did not run.
type Window = (u64, u64);

/// Checks everything; `store` has the state of every key.
pub fn check(
    histories: &[ProcessHistory],
    faults: &[FaultRecord],
    store: &HashMap<String, KeyState>,
    lease: Duration,
) -> Report {
    let mut report = Report::default();
    let lease_ns = ns(lease);
    let faults: Vec<&FaultRecord> = faults.iter().filter(|f| f.skipped.is_none()).collect();
    let mut sections = Vec::new();
    let mut pauses: Vec<Vec<Window>> = Vec::new();
    let mut accepted_seen: HashMap<String, i64> = HashMap::new();
    for (p, history) in histories.iter().enumerate() {
        let mut windows: Vec<Window> = faults
            .iter()
            .filter(|f| {
                f.kind == FaultKind::PauseHolder && f.worker.as_deref() == Some(&history.name)
            })
            .map(|f| (f.start, f.end))
            .collect();
        for r in &history.records {
            if let Event::Stall { ms } = r.event {
                report.count("runtime stalls");
                if ms * 1_000_000 >= lease_ns / 4 {
                    windows.push((r.at.saturating_sub(ms * 1_000_000), r.at));
                }
            }
        }
        pauses.push(windows);
        scan_process(p, history, &mut sections, &mut accepted_seen, &mut report);
    }
    report.sections = sections.len();
    check_overlaps(&sections, &pauses, &faults, lease_ns, &mut report);
    check_tokens(&sections, histories, &faults, &mut report);
    check_losses(histories, &pauses, &faults, lease_ns, &mut report);
    check_store(store, &accepted_seen, &mut report);
    check_probes(histories, lease_ns, &mut report);
    report
}

/// Turns one process's records into sections; counts errors and accepted writes.
fn scan_process(
    p: usize,
    history: &ProcessHistory,
    sections: &mut Vec<Section>,
    accepted_seen: &mut HashMap<String, i64>,
    report: &mut Report,
) {
    // A task's open sections: one per key it holds (several for `with_locks`).
    let mut open: HashMap<u32, Vec<Section>> = HashMap::new();
    let mut acquiring: HashMap<u32, bool> = HashMap::new();
    let mut last = 0;
    for r in &history.records {
        last = r.at;
        match &r.event {
            Event::Acquired { key, token, hold } => {
                // A new call's first key closes what an earlier call left open (no end event).
                if !acquiring.get(&r.task).copied().unwrap_or(false)
                    && let Some(prev) = open.remove(&r.task)
                {
                    sections.extend(prev);
                }
                acquiring.insert(r.task, true);
                open.entry(r.task).or_default().push(Section {
                    process: p,
                    task: r.task,
                    key: key.clone(),
                    token: *token,
                    hold: *hold,
                    start: r.at,
                    end: u64::MAX,
                    lost: false,
                });
            }
            Event::Done {
                key, write, valid, ..
            } => {
                acquiring.insert(r.task, false);
                for section in open.get_mut(&r.task).into_iter().flatten() {
                    section.end = r.at;
                }
                if *write == WriteOutcome::Accepted {
                    *accepted_seen.entry(key.clone()).or_default() += 1;
                }
                report.count(format!("writes {write:?}").to_lowercase());
                if !valid {
                    report.count("bodies that ended after their usable lease");
                }
            }
            Event::Released { .. } => {
                acquiring.insert(r.task, false);
                if let Some(list) = open.remove(&r.task) {
                    sections.extend(list);
                }
            }
            Event::Error { kind, .. } => {
                acquiring.insert(r.task, false);
                report.count(format!("error {kind}"));
                for mut section in open.remove(&r.task).into_iter().flatten() {
                    section.lost = kind.starts_with("lock_lost");
                    section.end = section.end.min(r.at);
                    sections.push(section);
                }
            }
            Event::Invoke { .. } | Event::Busy { .. } => {
                acquiring.insert(r.task, false);
            }
            _ => {}
        }
    }
    for mut section in open.into_values().flatten() {
        if section.end == u64::MAX {
            section.end = history.killed_at.unwrap_or(last);
        }
        sections.push(section);
    }
}

/// Whether two sections on one key may not overlap.
fn conflict(a: &Section, b: &Section) -> bool {
    match (a.hold, b.hold) {
        (Hold::Shared, Hold::Shared) => false,
        // Counted per group, in `check_overlaps`.
        (Hold::Permit(_), Hold::Permit(_)) => false,
        _ => true,
    }
}

fn check_overlaps(
    sections: &[Section],
    pauses: &[Vec<Window>],
    faults: &[&FaultRecord],
    lease_ns: u64,
    report: &mut Report,
) {
    let mut by_key: HashMap<&str, Vec<&Section>> = HashMap::new();
    for s in sections {
        by_key.entry(s.key.as_str()).or_default().push(s);
    }
    for (key, mut list) in by_key {
        list.sort_by_key(|s| s.start);
        let mut active: Vec<&Section> = Vec::new();
        for s in list {
            active.retain(|a| a.end > s.start);
            // A holder that lost its lease, or did not run, explains an overlap with it.
            let excused = |x: &Section, to: u64| {
                x.lost
                    || pauses[x.process]
                        .iter()
                        .any(|&(ps, pe)| ps < to && pe > x.start)
            };
            let data_loss = |from: u64, to: u64| {
                faults
                    .iter()
                    .any(|f| f.kind.loses_data() && f.start < to && f.end + lease_ns > from)
            };
            for a in active.iter().filter(|a| conflict(a, s)) {
                let (from, to) = (s.start, a.end.min(s.end));
                let reason = if a.lost || s.lost {
                    "a reported LockLost"
                } else if excused(a, to) || excused(s, to) {
                    "a paused holder"
                } else if data_loss(from, to) {
                    "a data-losing fault"
                } else {
                    report.violations.push(format!(
                        "unexplained overlap on {key}: {} and {} overlap for {:.1} ms",
                        describe(a),
                        describe(s),
                        as_ms(to.saturating_sub(from)),
                    ));
                    continue;
                };
                report.count(format!("overlaps explained by {reason}"));
            }
            if let Hold::Permit(permits) = s.hold {
                // Everybody active now holds a permit of this key, as `s` does.
                let to = active.iter().map(|a| a.end).fold(s.end, u64::min);
                let counted: Vec<&Section> = active
                    .iter()
                    .copied()
                    .chain([s])
                    .filter(|x| !excused(x, to))
                    .collect();
                if active.len() + 1 > permits as usize {
                    if counted.len() <= permits as usize {
                        report.count("permits over the limit, explained by lost or paused holders");
                    } else if data_loss(s.start, to) {
                        report.count("permits over the limit, explained by a data-losing fault");
                    } else {
                        let holders: Vec<String> = counted.iter().map(|x| describe(x)).collect();
                        report.violations.push(format!(
                            "{} holders of {key} at once, {permits} permits: {}",
                            counted.len(),
                            holders.join(", ")
                        ));
                    }
                }
            }
            active.push(s);
        }
    }
}

/// A section for a violation message.
fn describe(s: &Section) -> String {
    format!(
        "process {} task {} ({}, token {}, {:.1}..{:.1} ms)",
        s.process,
        s.task,
        s.hold,
        s.token,
        as_ms(s.start),
        as_ms(s.end)
    )
}

/// A fencing token must never be granted twice for one key (it would let two holders past the
/// store's fence), unless a data-losing fault (the counter is a key like any other: a restart
/// without persistence or a failover can lose its last increments) came between the two grants;
/// those are counted, and the store checks still apply to them.
fn check_tokens(
    sections: &[Section],
    histories: &[ProcessHistory],
    faults: &[&FaultRecord],
    report: &mut Report,
) {
    let mut seen: HashMap<(&str, u64), &Section> = HashMap::new();
    let mut sorted: Vec<&Section> = sections.iter().collect();
    sorted.sort_by_key(|s| s.start);
    for s in sorted.into_iter().filter(|s| s.token != 0) {
        if let Some(first) = seen.insert((s.key.as_str(), s.token), s) {
            let data_loss = faults
                .iter()
                .any(|f| f.kind.loses_data() && f.start < s.start && f.end > first.start);
            if data_loss {
                report.count("fencing tokens granted again after a data-losing fault");
                continue;
            }
            report.violations.push(format!(
                "fencing token {} on {} granted twice: {} task {} at {:.1} ms and {} task {} at \
                 {:.1} ms",
                s.token,
                s.key,
                histories[first.process].name,
                first.task,
                as_ms(first.start),
                histories[s.process].name,
                s.task,
                as_ms(s.start)
            ));
        }
    }
}

fn check_losses(
    histories: &[ProcessHistory],
    pauses: &[Vec<Window>],
    faults: &[&FaultRecord],
    lease_ns: u64,
    report: &mut Report,
) {
    let slack = ns(SCHED_SLACK) + lease_ns / 3;
    for (p, history) in histories.iter().enumerate() {
        for r in &history.records {
            let Event::Error { key, kind } = &r.event else {
                continue;
            };
            if !kind.starts_with("lock_lost") {
                continue;
            }
            let t = r.at;
            // The pause's end is recorded once `SIGCONT` was sent: the resumed process may
            // record its loss a moment before that.
            let after_pause = pauses[p]
                .iter()
                .any(|&(start, end)| start <= t && t <= end + slack);
            let after_fault = faults.iter().any(|f| {
                f.kind.class() != Class::Process
                    && f.start <= t
                    && t - f.start <= (f.end - f.start) + lease_ns + slack
            });
            if !(after_pause || after_fault) {
                report.late_losses.push(format!(
                    "{} task {}: {kind} on {key} at {:.1} ms has no fault or pause within its \
                     detection bound",
                    history.name,
                    r.task,
                    as_ms(t)
                ));
            }
        }
    }
}

fn check_store(
    store: &HashMap<String, KeyState>,
    accepted_seen: &HashMap<String, i64>,
    report: &mut Report,
) {
    for key in store_keys() {
        let state = store.get(key).cloned().unwrap_or_default();
        if state.value != state.accepted {
            report.violations.push(format!(
                "lost update on {key}: store value {} but {} accepted increments",
                state.value, state.accepted
            ));
        }
        if let Some(w) = state.log.windows(2).find(|w| w[1] < w[0]) {
            report.violations.push(format!(
                "fencing on {key}: token {} accepted after token {}",
                w[1], w[0]
            ));
        }
        let seen = accepted_seen.get(key).copied().unwrap_or(0);
        if seen > state.accepted || state.log.len() as i64 != state.accepted {
            report.violations.push(format!(
                "store count on {key}: {} accepted, {} tokens logged, workers saw {seen} accepted",
                state.accepted,
                state.log.len()
            ));
        }
        *report.counts.entry("store accepted".into()).or_default() +=
            u64::try_from(state.accepted).unwrap_or(0);
        *report.counts.entry("store rejected".into()).or_default() +=
            u64::try_from(state.rejected).unwrap_or(0);
    }
}

fn check_probes(histories: &[ProcessHistory], lease_ns: u64, report: &mut Report) {
    for history in histories.iter().filter(|h| h.killed_at.is_none()) {
        let probe = history.records.iter().rev().find_map(|r| match r.event {
            Event::Probe { ok, ms } if r.task == PROCESS => Some((ok, ms)),
            _ => None,
        });
        match probe {
            Some((true, ms)) if ms * 1_000_000 <= 2 * lease_ns => {}
            Some((ok, ms)) => report.violations.push(format!(
                "{}: recovery probe {} after {ms} ms (bound 2 x lease = {:.0} ms)",
                history.name,
                if ok { "acquired" } else { "failed" },
                as_ms(2 * lease_ns)
            )),
            None => report
                .violations
                .push(format!("{}: no recovery probe recorded", history.name)),
        }
    }
}

#[cfg(test)]
mod tests;
