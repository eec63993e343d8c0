//! The slot layout [`Locks::scan`](crate::Locks::scan) checks around each pass in a cluster:
//! each primary's own word on the slots it serves, migrates and imports (the `myself` line of
//! its `CLUSTER NODES`). A pass is complete only when no slot was migrating before it and the
//! layout after it is the same: a lock's keys that moved from a primary not yet scanned to one
//! already scanned are seen by neither `SCAN`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// How many slots an error names before it says how many more there are.
const NAMED_SLOTS: usize = 8;

/// The primaries' slots, as each reports its own: by node address, the slot fields of its
/// `myself` line (`0-5460`, `[42->-id]` migrating away, `[42-<-id]` importing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Layout(BTreeMap<String, Vec<String>>);

impl Layout {
    /// Records `node`'s reply to `CLUSTER NODES`; `None` when it has no `myself` line.
    pub(super) fn add(&mut self, node: String, cluster_nodes: &str) -> Option<()> {
        let line = cluster_nodes.lines().find(|line| {
            line.split_whitespace()
                .nth(2)
                .is_some_and(|flags| flags.split(',').any(|flag| flag == "myself"))
        })?;
        let fields = line.split_whitespace().skip(8).map(str::to_owned).collect();
        self.0.insert(node, fields);
        Some(())
    }

    /// The slots some primary marks migrating or importing: for each, who says what.
    pub(super) fn moving(&self) -> BTreeMap<u16, Vec<String>> {
        let mut moving: BTreeMap<u16, Vec<String>> = BTreeMap::new();
        for (node, fields) in &self.0 {
            for field in fields {
                let Some(marker) = field.strip_prefix('[') else {
                    continue;
                };
                let (slot, state) = if let Some((slot, _)) = marker.split_once("->-") {
                    (slot, "MIGRATING")
                } else if let Some((slot, _)) = marker.split_once("-<-") {
                    (slot, "IMPORTING")
                } else {
                    continue;
                };
                if let Ok(slot) = slot.parse() {
                    moving
                        .entry(slot)
                        .or_default()
                        .push(format!("{state} on {node}"));
                }
            }
        }
        moving
    }

    /// Each served slot's primary.
    fn owners(&self) -> BTreeMap<u16, &str> {
        let mut owners = BTreeMap::new();
        for (node, fields) in &self.0 {
            for field in fields.iter().filter(|field| !field.starts_with('[')) {
                let (start, end) = field.split_once('-').unwrap_or((field, field));
                if let (Ok(start), Ok(end)) = (start.parse::<u16>(), end.parse::<u16>()) {
                    for slot in start..=end {
                        owners.insert(slot, node.as_str());
                    }
                }
            }
        }
        owners
    }

    /// What changed from `self` to `after`: the slots that moved or are moving, each with why.
    pub(super) fn changes(&self, after: &Layout) -> BTreeMap<u16, Vec<String>> {
        let mut changes = after.moving();
        let (before, now) = (self.owners(), after.owners());
        for slot in before.keys().chain(now.keys()) {
            let (was, is) = (before.get(slot), now.get(slot));
            if was != is {
                let text = format!(
                    "moved from {} to {} during the pass",
                    was.unwrap_or(&"no primary"),
                    is.unwrap_or(&"no primary")
                );
                changes.entry(*slot).or_default().push(text);
            }
        }
        for list in changes.values_mut() {
            list.dedup();
        }
        changes
    }
}

/// `slots` for an error: the first few by number, with who said what, and how many more.
pub(super) fn describe(slots: &BTreeMap<u16, Vec<String>>) -> String {
    let mut text = String::new();
    for (index, (slot, why)) in slots.iter().enumerate() {
        if index == NAMED_SLOTS {
            let _ = write!(text, "; and {} more slots", slots.len() - NAMED_SLOTS);
            break;
        }
        if index > 0 {
            text.push_str("; ");
        }
        let _ = write!(text, "hash slot {slot} ({})", why.join(", "));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-2 \
                     [3->-b1]\nb1 127.0.0.1:7001@17001 master - 0 0 2 connected 3-5\n";
    const B: &str = "a1 127.0.0.1:7000@17000 master - 0 0 1 connected 0-2\n\
                     b1 127.0.0.1:7001@17001 myself,master - 0 0 2 connected 4-5 [3-<-a1]\n";

    #[test]
    fn reads_each_nodes_own_line() {
        let mut layout = Layout::default();
        assert_eq!(layout.add("a".into(), A), Some(()));
        assert_eq!(layout.add("b".into(), B), Some(()));
        assert_eq!(layout.add("c".into(), "no such line\n"), None);
        let moving = layout.moving();
        assert_eq!(moving.keys().copied().collect::<Vec<_>>(), vec![3]);
        assert_eq!(moving[&3], vec!["MIGRATING on a", "IMPORTING on b"]);
        assert_eq!(layout.owners().len(), 5);
        assert!(describe(&moving).contains("hash slot 3 (MIGRATING on a, IMPORTING on b)"));
    }

    #[test]
    fn a_slot_that_moved_is_a_change() {
        let mut before = Layout::default();
        before.add("a".into(), "x 1:1@2 myself,master - 0 0 1 connected 0-2\n");
        let mut after = Layout::default();
        after.add("a".into(), "x 1:1@2 myself,master - 0 0 1 connected 0-1\n");
        assert!(before.changes(&before).is_empty());
        let changes = before.changes(&after);
        assert_eq!(changes.keys().copied().collect::<Vec<_>>(), vec![2]);
        assert!(describe(&changes).contains("moved from a to no primary"));
    }
}
