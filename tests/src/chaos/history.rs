//! Per-process history files: one event per line, `<monotonic ns> <task> <event> <fields...>`.
//!
//! Each line is written with one `write` call on an unbuffered file, so a worker killed with
//! SIGKILL leaves every event it recorded before the kill (at worst a torn last line, which
//! [`read`] skips).

use std::fmt;
use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::str::FromStr;
use std::sync::Mutex;

use super::clock::now_ns;

/// Task number used for process-wide events (start, stalls, the recovery probe).
pub const PROCESS: u32 = u32::MAX;

/// How a critical section's fenced write to the store went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The store took the increment.
    Accepted,
    /// The store refused the write: a higher token had been seen.
    Rejected,
    /// The store refused the fenced read: a higher token had been seen.
    ReadRejected,
    /// The store call failed.
    Failed,
    /// The section does not write (a reader, a permit holder).
    NoWrite,
}

impl WriteOutcome {
    fn name(self) -> &'static str {
        match self {
            WriteOutcome::Accepted => "accepted",
            WriteOutcome::Rejected => "rejected",
            WriteOutcome::ReadRejected => "read-rejected",
            WriteOutcome::Failed => "failed",
            WriteOutcome::NoWrite => "no-write",
        }
    }
}

impl FromStr for WriteOutcome {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            WriteOutcome::Accepted,
            WriteOutcome::Rejected,
            WriteOutcome::ReadRejected,
            WriteOutcome::Failed,
            WriteOutcome::NoWrite,
        ]
        .into_iter()
        .find(|o| o.name() == s)
        .ok_or_else(|| format!("unknown write outcome {s:?}"))
    }
}

/// How a critical section holds its key: what it may overlap with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Alone (the mutex, a writer, each key of `with_locks`).
    Exclusive,
    /// With other readers, never with a writer.
    Shared,
    /// With at most `n - 1` other permit holders.
    Permit(u32),
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hold::Exclusive => write!(f, "x"),
            Hold::Shared => write!(f, "r"),
            Hold::Permit(n) => write!(f, "p{n}"),
        }
    }
}

impl FromStr for Hold {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "x" => Ok(Hold::Exclusive),
            "r" => Ok(Hold::Shared),
            _ => s
                .strip_prefix('p')
                .and_then(|n| n.parse().ok())
                .map(Hold::Permit)
                .ok_or_else(|| format!("unknown hold {s:?}")),
        }
    }
}

/// One recorded event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The worker process is up (its pid).
    Start(u32),
    /// A `with_lock` (`try` = `try_with_lock`) call on `key` begins.
    Invoke { key: String, try_lock: bool },
    /// The body started holding `key` with this fencing token (0: not known, for the later
    /// keys of `with_locks`).
    Acquired { key: String, token: u64, hold: Hold },
    /// The body finished its fenced read-modify-write; `valid`: the lease was still valid then.
    Done {
        key: String,
        token: u64,
        write: WriteOutcome,
        valid: bool,
    },
    /// The call returned `Ok` after running the body (the lock was released).
    Released { key: String },
    /// `try_with_lock` found the lock busy (`Ok(None)`).
    Busy { key: String },
    /// The call returned an error; `kind` is e.g. `lock_lost:not_owner`, `timed_out:busy`.
    Error { key: String, kind: String },
    /// The process's runtime did not run for `ms` milliseconds, ending now.
    Stall { ms: u64 },
    /// The recovery probe after the nemesis: acquired (`ok`) after `ms` milliseconds.
    Probe { ok: bool, ms: u64 },
}

/// An event with its time and task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub at: u64,
    pub task: u32,
    pub event: Event,
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ", self.at, self.task)?;
        match &self.event {
            Event::Start(pid) => write!(f, "start {pid}"),
            Event::Invoke { key, try_lock } => write!(f, "invoke {key} {}", u8::from(*try_lock)),
            Event::Acquired { key, token, hold } => write!(f, "acquired {key} {token} {hold}"),
            Event::Done {
                key,
                token,
                write,
                valid,
            } => write!(
                f,
                "done {key} {token} {} {}",
                write.name(),
                u8::from(*valid)
            ),
            Event::Released { key } => write!(f, "released {key}"),
            Event::Busy { key } => write!(f, "busy {key}"),
            Event::Error { key, kind } => write!(f, "error {key} {kind}"),
            Event::Stall { ms } => write!(f, "stall {ms}"),
            Event::Probe { ok, ms } => write!(f, "probe {} {ms}", u8::from(*ok)),
        }
    }
}

fn field<T: FromStr>(parts: &[&str], i: usize, line: &str) -> Result<T, String> {
    parts
        .get(i)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("field {i} missing or malformed in history line {line:?}"))
}

impl FromStr for Record {
    type Err = String;
    fn from_str(line: &str) -> Result<Self, String> {
        let parts: Vec<&str> = line.split(' ').collect();
        let key = || field::<String>(&parts, 3, line);
        let flag = |i| field::<u8>(&parts, i, line).map(|v| v == 1);
        let event = match parts.get(2).copied() {
            Some("start") => Event::Start(field(&parts, 3, line)?),
            Some("invoke") => Event::Invoke {
                key: key()?,
                try_lock: flag(4)?,
            },
            Some("acquired") => Event::Acquired {
                key: key()?,
                token: field(&parts, 4, line)?,
                // Histories written before holds were recorded hold exclusively.
                hold: match parts.get(5) {
                    Some(_) => field(&parts, 5, line)?,
                    None => Hold::Exclusive,
                },
            },
            Some("done") => Event::Done {
                key: key()?,
                token: field(&parts, 4, line)?,
                write: field(&parts, 5, line)?,
                valid: flag(6)?,
            },
            Some("released") => Event::Released { key: key()? },
            Some("busy") => Event::Busy { key: key()? },
            Some("error") => Event::Error {
                key: key()?,
                kind: field(&parts, 4, line)?,
            },
            Some("stall") => Event::Stall {
                ms: field(&parts, 3, line)?,
            },
            Some("probe") => Event::Probe {
                ok: flag(3)?,
                ms: field(&parts, 4, line)?,
            },
            other => return Err(format!("unknown event {other:?} in history line {line:?}")),
        };
        Ok(Record {
            at: field(&parts, 0, line)?,
            task: field(&parts, 1, line)?,
            event,
        })
    }
}

/// The writer side: appends records to a file, one `write` per line.
#[derive(Debug)]
pub struct History {
    file: Mutex<File>,
}

impl History {
    /// Creates (truncates) the history file at `path`.
    pub fn create(path: &Path) -> Result<History, String> {
        let file = File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
        Ok(History {
            file: Mutex::new(file),
        })
    }

    /// Records `event` of `task`, stamped now.
    pub fn record(&self, task: u32, event: Event) {
        let line = format!(
            "{}\n",
            Record {
                at: now_ns(),
                task,
                event
            }
        );
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A history that cannot be written is reported by the checker as missing events.
        let _ = file.write_all(line.as_bytes());
    }
}

/// Reads a history file. A torn last line (the process was killed mid-write) is skipped; any
/// other malformed line is an error.
pub fn read(path: &Path) -> Result<Vec<Record>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut records = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match line.parse::<Record>() {
            Ok(record) => records.push(record),
            Err(_) if i + 1 == lines.len() && !complete => {}
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    Ok(records)
}

/// Turns an error's name into one history field (no spaces).
pub fn field_text(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        for event in [
            Event::Start(42),
            Event::Invoke {
                key: "hot-0".into(),
                try_lock: true,
            },
            Event::Acquired {
                key: "hot-0".into(),
                token: 7,
                hold: Hold::Exclusive,
            },
            Event::Acquired {
                key: "rw-0".into(),
                token: 8,
                hold: Hold::Shared,
            },
            Event::Acquired {
                key: "sem-1".into(),
                token: 0,
                hold: Hold::Permit(2),
            },
            Event::Done {
                key: "sem-1".into(),
                token: 0,
                write: WriteOutcome::NoWrite,
                valid: true,
            },
            Event::Done {
                key: "hot-0".into(),
                token: 7,
                write: WriteOutcome::ReadRejected,
                valid: false,
            },
            Event::Error {
                key: "cold-1".into(),
                kind: "lock_lost:not_owner".into(),
            },
            Event::Stall { ms: 120 },
            Event::Probe { ok: true, ms: 12 },
        ] {
            let record = Record {
                at: 123,
                task: 3,
                event,
            };
            assert_eq!(record.to_string().parse::<Record>(), Ok(record));
        }
        let earlier: Record = "5 1 acquired hot-0 3"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            earlier.event,
            Event::Acquired {
                key: "hot-0".into(),
                token: 3,
                hold: Hold::Exclusive
            }
        );
    }
}
