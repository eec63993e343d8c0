//! Draws two SVG charts of a `bench --both` run, for Redis and Valkey:
//!
//! - the contended scenarios: critical sections per worker process (4 processes × 2 tasks on one
//!   key) and the p99 wait, sage-lock next to rslock;
//! - the uncontended cycle: p50 latency in units of two `PING` round trips and 8-task throughput
//!   against rslock's, for rslock, sage-lock, and each one's two commands sent with bare fred
//!   (the floors, see `sage_lock_examples::floor`).
//!
//! ```text
//! cargo run -p sage-lock-examples --bin plot -- [--json-dir DIR] [--out FILE] [--uncontended-out FILE]
//! ```
//!
//! Reads `DIR/bench-redis.json` and `DIR/bench-valkey.json` (default `target/`, as written by
//! `bench --both`) and writes `FILE` (default `docs/bench-contention.svg`) and the uncontended
//! chart (default `docs/bench-uncontended.svg`).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use sage_lock_examples::{Usage, flag_value, workspace_root};
use serde_json::Value;

/// The figures of one server's run that the chart shows.
struct Run {
    server: &'static str,
    /// Sections per process, 4 × 2 tasks: (sage-lock, rslock).
    per_process: (Vec<f64>, Vec<f64>),
    /// p99 wait in ms, (1 × 8, 4 × 2): (sage-lock, rslock) each.
    p99: [(f64, f64); 2],
}

/// The uncontended figures of one server's run, per subject of [`SUBJECTS`].
struct Uncontended {
    server: &'static str,
    /// p50 of a lock+unlock cycle / (2 × PING p50), multi-thread runtime.
    latency: [f64; 4],
    /// Cycles/s of 8 tasks on 8 keys / rslock's.
    throughput: [f64; 4],
}

const SAGE: &str = "#2b6cb0";
const RSLOCK: &str = "#dd6b20";

/// The uncontended chart's subjects: label, JSON name, colour.
const SUBJECTS: [(&str, &str, &str); 4] = [
    ("rslock", "rslock", RSLOCK),
    (
        "rslock's commands on bare fred",
        "fred_with_rslock_commands",
        "#f6ad55",
    ),
    (
        "sage-lock's commands on bare fred",
        "fred_with_sage_lock_commands",
        "#90cdf4",
    ),
    ("sage-lock", "sage_lock", SAGE),
];

/// What this binary's command line may hold.
const USAGE: Usage<'static> = Usage {
    flags: &[],
    valued: &["--json-dir", "--out", "--uncontended-out"],
    text: "usage: cargo run -p sage-lock-examples --bin plot -- [--json-dir DIR] [--out FILE] [--uncontended-out FILE]",
};

fn main() -> anyhow::Result<()> {
    if !USAGE.check_command_line()? {
        return Ok(());
    }
    let dir =
        flag_value::<PathBuf>("--json-dir")?.unwrap_or_else(|| workspace_root().join("target"));
    let out = flag_value::<PathBuf>("--out")?
        .unwrap_or_else(|| workspace_root().join("docs").join("bench-contention.svg"));
    let uncontended_out = flag_value::<PathBuf>("--uncontended-out")?
        .unwrap_or_else(|| workspace_root().join("docs").join("bench-uncontended.svg"));
    let runs = ["redis", "valkey"]
        .into_iter()
        .map(|server| read(&dir, server))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let uncontended = ["redis", "valkey"]
        .into_iter()
        .map(|server| read_uncontended(&dir, server))
        .collect::<anyhow::Result<Vec<_>>>()?;
    write(&out, &svg(&runs))?;
    write(&uncontended_out, &uncontended_svg(&uncontended))?;
    Ok(())
}

fn write(path: &std::path::Path, svg: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

fn read_uncontended(dir: &std::path::Path, server: &'static str) -> anyhow::Result<Uncontended> {
    let (path, document) = load(dir, server)?;
    let details = &document["details"];
    let number = |value: &Value, what: &str| {
        value
            .as_f64()
            .with_context(|| format!("{}: no {what}", path.display()))
    };
    let latency = &details["latency, multi-thread runtime"];
    let two_pings = 2.0 * number(&latency["ping"]["p50_us"], "PING p50")?;
    let throughput = &details["throughput"];
    let rslock_rate = number(&throughput["rslock"]["cycles_per_s"], "rslock's throughput")?;
    let mut figures = Uncontended {
        server,
        latency: [0.0; 4],
        throughput: [0.0; 4],
    };
    for (i, (_, name, _)) in SUBJECTS.iter().enumerate() {
        figures.latency[i] = number(&latency[name]["p50_us"], &format!("{name} p50"))? / two_pings;
        figures.throughput[i] = number(
            &throughput[name]["cycles_per_s"],
            &format!("{name} throughput"),
        )? / rslock_rate;
    }
    Ok(figures)
}

/// Per server, two panels of horizontal bars (one per subject): latency in units of 2·PING
/// with the goal (1.2) marked, and throughput against rslock's with parity (1.0) marked.
fn uncontended_svg(runs: &[Uncontended]) -> String {
    let (width, row_height) = (900.0, 150.0);
    let height = 50.0 + row_height * to_f64(runs.len());
    let mut s = header(
        (width, height),
        "Uncontended lock+unlock: each library, and its two commands sent with bare fred",
    );
    for (row, run) in runs.iter().enumerate() {
        let top = 45.0 + row_height * to_f64(row);
        hbars(
            &mut s,
            (10.0, top),
            &format!("{}: p50 / (2 × PING p50), 1 task", run.server),
            &run.latency,
            (2.0, 1.2, "goal 1.2"),
        );
        hbars(
            &mut s,
            (470.0, top),
            &format!("{}: cycles/s, 8 tasks on 8 keys / rslock's", run.server),
            &run.throughput,
            (1.4, 1.0, "rslock"),
        );
    }
    s.push_str("</svg>\n");
    s
}

/// One panel at `(x, y)`: a labelled bar per subject, scaled so that `max` fills the panel, and
/// a dashed mark at `mark` named `mark_label`.
fn hbars(
    s: &mut String,
    (x, y): (f64, f64),
    title: &str,
    values: &[f64; 4],
    (max, mark, mark_label): (f64, f64, &str),
) {
    let (label_width, bar_span, bar) = (210.0, 190.0, 18.0);
    let max = values.iter().copied().fold(max, f64::max);
    let _ = write!(
        s,
        r#"<text x="{x}" y="{}" font-weight="bold">{title}</text>"#,
        y + 12.0
    );
    let left = x + label_width;
    for (i, ((label, _, color), value)) in SUBJECTS.iter().zip(values).enumerate() {
        let by = y + 22.0 + (bar + 5.0) * to_f64(i);
        let w = bar_span * value / max;
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text><rect x="{left:.1}" y="{by:.1}" width="{w:.1}" height="{bar}" fill="{color}"/><text x="{:.1}" y="{:.1}" font-size="11">{value:.2}</text>"#,
            left - 6.0,
            by + 13.0,
            left + w + 4.0,
            by + 13.0
        );
    }
    let mark_x = left + bar_span * mark / max;
    let bottom = y + 22.0 + (bar + 5.0) * 4.0;
    let _ = write!(
        s,
        r##"<line x1="{mark_x:.1}" y1="{:.1}" x2="{mark_x:.1}" y2="{bottom:.1}" stroke="#444" stroke-dasharray="4 3"/><text x="{mark_x:.1}" y="{:.1}" font-size="10" text-anchor="middle">{mark_label}</text>"##,
        y + 18.0,
        bottom + 11.0
    );
}

/// The JSON file `bench --both` wrote for `server` in `dir`, and its path.
fn load(dir: &std::path::Path, server: &str) -> anyhow::Result<(PathBuf, Value)> {
    let path = dir.join(format!("bench-{server}.json"));
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} (run `bench --both` first)", path.display()))?;
    let document =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok((path, document))
}

fn read(dir: &std::path::Path, server: &'static str) -> anyhow::Result<Run> {
    let (path, document) = load(dir, server)?;
    let contention = &document["details"]["multi_process_contention"];
    let shape = |shape: &str, subject: &str| &contention[shape][subject];
    let sections = |subject: &str| -> anyhow::Result<Vec<f64>> {
        shape("4x2", subject)["sections_per_process"]
            .as_array()
            .with_context(|| format!("{}: no 4x2 sections for {subject}", path.display()))
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
    };
    let p99 = |shape_name: &str| -> anyhow::Result<(f64, f64)> {
        let get = |subject: &str| {
            shape(shape_name, subject)["p99_wait_ms"]
                .as_f64()
                .with_context(|| format!("{}: no {shape_name} p99 for {subject}", path.display()))
        };
        Ok((get("sage-lock")?, get("rslock")?))
    };
    Ok(Run {
        server,
        per_process: (sections("sage-lock")?, sections("rslock")?),
        p99: [p99("1x8")?, p99("4x2")?],
    })
}

/// Two panels per server: grouped bars of sections per process, and grouped bars of p99 wait.
fn svg(runs: &[Run]) -> String {
    let (width, row_height) = (820.0, 230.0);
    let height = 60.0 + row_height * to_f64(runs.len());
    let mut s = header(
        (width, height),
        "One key, 1 ms sections, worker processes started together",
    );
    legend(&mut s, 10.0, 38.0);
    for (row, run) in runs.iter().enumerate() {
        let top = 60.0 + row_height * to_f64(row);
        let max_sections = run
            .per_process
            .0
            .iter()
            .chain(&run.per_process.1)
            .copied()
            .fold(1.0, f64::max);
        let groups: Vec<(String, f64, f64)> = run
            .per_process
            .0
            .iter()
            .zip(&run.per_process.1)
            .enumerate()
            .map(|(i, (sage, rslock))| (format!("process {}", i + 1), *sage, *rslock))
            .collect();
        panel(
            &mut s,
            (10.0, top),
            &format!(
                "{}: critical sections per process (4 × 2 tasks)",
                run.server
            ),
            &groups,
            max_sections,
            "",
        );
        let waits = vec![
            ("1 × 8 tasks".to_owned(), run.p99[0].0, run.p99[0].1),
            ("4 × 2 tasks".to_owned(), run.p99[1].0, run.p99[1].1),
        ];
        let max_wait = waits.iter().map(|w| w.1.max(w.2)).fold(1.0, f64::max);
        panel(
            &mut s,
            (430.0, top),
            &format!("{}: p99 wait (ms)", run.server),
            &waits,
            max_wait,
            " ms",
        );
    }
    s.push_str("</svg>\n");
    s
}

/// An SVG document's opening: its size, a white background and `title`.
fn header((width, height): (f64, f64), title: &str) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="20" font-size="14" font-weight="bold">{title}</text>"#
    );
    s
}

fn legend(s: &mut String, x: f64, y: f64) {
    for (i, (name, color)) in [("sage-lock", SAGE), ("rslock", RSLOCK)].iter().enumerate() {
        let x = x + 110.0 * to_f64(i);
        let _ = write!(
            s,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{color}"/><text x="{}" y="{y}">{name}</text>"#,
            y - 10.0,
            x + 16.0
        );
    }
}

/// One panel at `(x, y)`: for each group two bars (sage-lock, rslock) scaled to `max`.
fn panel(
    s: &mut String,
    (x, y): (f64, f64),
    title: &str,
    groups: &[(String, f64, f64)],
    max: f64,
    unit: &str,
) {
    let (plot_height, bar) = (150.0, 22.0);
    let base = y + 25.0 + plot_height;
    let _ = write!(
        s,
        r#"<text x="{x}" y="{}" font-weight="bold">{title}</text>"#,
        y + 12.0
    );
    let _ = write!(
        s,
        r##"<line x1="{x}" y1="{base}" x2="{}" y2="{base}" stroke="#444"/>"##,
        x + 380.0
    );
    let step = 370.0 / to_f64(groups.len().max(1));
    for (i, (label, sage, rslock)) in groups.iter().enumerate() {
        let gx = x + 10.0 + step * to_f64(i);
        for (j, (value, color)) in [(*sage, SAGE), (*rslock, RSLOCK)].iter().enumerate() {
            let h = plot_height * value / max;
            let bx = gx + (bar + 2.0) * to_f64(j);
            let _ = write!(
                s,
                r#"<rect x="{bx:.1}" y="{:.1}" width="{bar}" height="{h:.1}" fill="{color}"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{value:.0}{unit}</text>"#,
                base - h,
                bx + bar / 2.0,
                base - h - 3.0
            );
        }
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{label}</text>"#,
            gx + bar + 1.0,
            base + 15.0
        );
    }
}

fn to_f64(n: usize) -> f64 {
    f64::from(u32::try_from(n).unwrap_or(u32::MAX))
}
