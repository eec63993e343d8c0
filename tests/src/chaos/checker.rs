//! Checks a run's histories, fault records and store contents.
//!
//! - Store: for every key `value == accepted` (no lost update), the accepted tokens never go
//!   down, and every write a worker saw accepted is counted.
//! - Overlaps: two critical sections (acquired .. body done) on one key that overlap in time must
//!   be explained by a reported `LockLost` of one of them, a pause of one holder (SIGSTOP by the
//!   nemesis, or a recorded runtime stall of at least a quarter lease), or a data-losing fault
//!   (restart, failover) whose window, plus one lease, meets the overlap. Anything else is a
//!   violation. Recorded sections lie inside the real holding intervals (acquired is recorded
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

use super::all_keys;
use super::clock::{as_ms, ns};
use super::faults::{Class, FaultKind, FaultRecord};
use super::history::{Event, PROCESS, Record, WriteOutcome};
use super::store::KeyState;

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
    token: u64,
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
    let mut open: HashMap<u32, Section> = HashMap::new();
    let mut last = 0;
    for r in &history.records {
        last = r.at;
        match &r.event {
            Event::Acquired { key, token } => {
                if let Some(prev) = open.remove(&r.task) {
                    sections.push(prev);
                }
                open.insert(
                    r.task,
                    Section {
                        process: p,
                        task: r.task,
                        key: key.clone(),
                        token: *token,
                        start: r.at,
                        end: u64::MAX,
                        lost: false,
                    },
                );
            }
            Event::Done { write, valid, .. } => {
                if let Some(section) = open.get_mut(&r.task) {
                    section.end = r.at;
                    if *write == WriteOutcome::Accepted {
                        *accepted_seen.entry(section.key.clone()).or_default() += 1;
                    }
                }
                report.count(format!("writes {write:?}").to_lowercase());
                if !valid {
                    report.count("bodies that ended after their usable lease");
                }
            }
            Event::Released { .. } => {
                if let Some(section) = open.remove(&r.task) {
                    sections.push(section);
                }
            }
            Event::Error { kind, .. } => {
                report.count(format!("error {kind}"));
                if let Some(mut section) = open.remove(&r.task) {
                    section.lost = kind.starts_with("lock_lost");
                    section.end = section.end.min(r.at);
                    sections.push(section);
                }
            }
            _ => {}
        }
    }
    for (_, mut section) in open.drain() {
        if section.end == u64::MAX {
            section.end = history.killed_at.unwrap_or(last);
        }
        sections.push(section);
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
            for a in &active {
                let (from, to) = (s.start, a.end.min(s.end));
                let paused = |x: &Section| {
                    pauses[x.process]
                        .iter()
                        .any(|&(ps, pe)| ps < to && pe > x.start)
                };
                let data_loss = faults
                    .iter()
                    .any(|f| f.kind.loses_data() && f.start < to && f.end + lease_ns > from);
                let reason = if a.lost || s.lost {
                    "a reported LockLost"
                } else if paused(a) || paused(s) {
                    "a paused holder"
                } else if data_loss {
                    "a data-losing fault"
                } else {
                    report.violations.push(format!(
                        "unexplained overlap on {key}: process {} task {} (token {}, {:.1}..{:.1} ms) \
                         and process {} task {} (token {}, {:.1}..{:.1} ms) overlap for {:.1} ms",
                        a.process, a.task, a.token, as_ms(a.start), as_ms(a.end),
                        s.process, s.task, s.token, as_ms(s.start), as_ms(s.end),
                        as_ms(to.saturating_sub(from)),
                    ));
                    continue;
                };
                report.count(format!("overlaps explained by {reason}"));
            }
            active.push(s);
        }
    }
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
    for s in sorted {
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
    for key in all_keys() {
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
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn lost_at(at: u64) -> ProcessHistory {
        ProcessHistory {
            name: "w0g0".into(),
            records: vec![Record {
                at,
                task: 1,
                event: Event::Error {
                    key: "hot-0".into(),
                    kind: "lock_lost:renewal_failed".into(),
                },
            }],
            killed_at: None,
        }
    }

    /// A loss its process records on resuming from a pause is explained by the pause, also a
    /// moment before the nemesis records the pause's end; one long after it is late.
    #[test]
    fn a_loss_at_the_end_of_a_pause_is_explained() {
        let lease = 300 * MS;
        let pause = vec![vec![(10_000 * MS, 10_700 * MS)]];
        for (at, late) in [
            (10_699 * MS, false),
            (10_800 * MS, false),
            (9_000 * MS, true),
            (12_000 * MS, true),
        ] {
            let mut report = Report::default();
            check_losses(&[lost_at(at)], &pause, &[], lease, &mut report);
            assert_eq!(report.late_losses.len(), usize::from(late), "{at}");
        }
    }
}
