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

fn section(process: usize, key: &str, hold: Hold, span: (u64, u64), lost: bool) -> Section {
    Section {
        process,
        task: 0,
        key: key.into(),
        token: process as u64 + 1,
        hold,
        start: span.0 * MS,
        end: span.1 * MS,
        lost,
    }
}

fn overlap_violations(sections: &[Section]) -> Vec<String> {
    let mut report = Report::default();
    let pauses = vec![Vec::new(); 8];
    check_overlaps(sections, &pauses, &[], 300 * MS, &mut report);
    report.violations
}

/// Readers may overlap each other, never a writer; a writer overlapping a reader is
/// explained by the reader's reported loss.
#[test]
fn readers_share_and_writers_do_not() {
    let read = |p, span| section(p, "rw-0", Hold::Shared, span, false);
    let write = |p, span, lost| section(p, "rw-0", Hold::Exclusive, span, lost);
    assert!(overlap_violations(&[read(0, (0, 10)), read(1, (5, 15))]).is_empty());
    assert_eq!(
        overlap_violations(&[read(0, (0, 10)), write(1, (5, 15), false)]).len(),
        1
    );
    assert_eq!(
        overlap_violations(&[write(0, (0, 10), false), read(1, (5, 15))]).len(),
        1
    );
    assert!(overlap_violations(&[read(0, (0, 10)), write(1, (5, 15), true)]).is_empty());
    assert!(overlap_violations(&[read(0, (0, 10)), write(1, (10, 15), false)]).is_empty());
}

/// A semaphore key with 2 permits: 2 holders at once are fine, 3 are a violation unless one
/// of them lost its lease.
#[test]
fn permits_are_counted_per_key() {
    let permit = |p, span, lost| section(p, "sem-0", Hold::Permit(2), span, lost);
    assert!(overlap_violations(&[permit(0, (0, 10), false), permit(1, (5, 15), false)]).is_empty());
    let three = [
        permit(0, (0, 10), false),
        permit(1, (2, 15), false),
        permit(2, (5, 20), false),
    ];
    assert_eq!(overlap_violations(&three).len(), 1);
    let mut explained = three.clone();
    explained[1].lost = true;
    assert!(overlap_violations(&explained).is_empty());
    let other_key = [
        permit(0, (0, 10), false),
        permit(1, (2, 15), false),
        section(2, "sem-1", Hold::Permit(2), (5, 20), false),
    ];
    assert!(overlap_violations(&other_key).is_empty());
}

/// `with_locks` records one section per key; an unknown token (0, in older histories) is
/// not counted as a token granted twice.
#[test]
fn several_keys_of_one_call_are_sections_of_their_own() {
    let records = vec![
        Record {
            at: MS,
            task: 0,
            event: Event::Acquired {
                key: "hot-0".into(),
                token: 4,
                hold: Hold::Exclusive,
            },
        },
        Record {
            at: MS,
            task: 0,
            event: Event::Acquired {
                key: "cold-1".into(),
                token: 0,
                hold: Hold::Exclusive,
            },
        },
        Record {
            at: 3 * MS,
            task: 0,
            event: Event::Released {
                key: "hot-0".into(),
            },
        },
    ];
    let histories: Vec<ProcessHistory> = ["w0g0", "w1g0"]
        .into_iter()
        .map(|name| ProcessHistory {
            name: name.into(),
            records: records.clone(),
            killed_at: None,
        })
        .collect();
    let mut sections = Vec::new();
    let mut report = Report::default();
    scan_process(
        0,
        &histories[0],
        &mut sections,
        &mut HashMap::new(),
        &mut report,
    );
    let keys: Vec<&str> = sections.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["hot-0", "cold-1"]);
    // The same call again, by another process, overlapping on `cold-1` only.
    let mut second = Vec::new();
    scan_process(
        1,
        &histories[1],
        &mut second,
        &mut HashMap::new(),
        &mut report,
    );
    second[0].key = "hot-1".into();
    sections.extend(second);
    let mut report = Report::default();
    check_tokens(&sections, &histories, &[], &mut report);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(overlap_violations(&sections).len(), 1);
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
