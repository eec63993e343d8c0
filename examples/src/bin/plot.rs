//! Draws the contended scenarios of a `bench --both` run as an SVG chart: critical sections per
//! worker process (4 processes × 2 tasks on one key) and the p99 wait, sage-lock next to rslock,
//! for Redis and Valkey.
//!
//! ```text
//! cargo run -p sage-lock-examples --bin plot -- [--json-dir DIR] [--out FILE]
//! ```
//!
//! Reads `DIR/bench-redis.json` and `DIR/bench-valkey.json` (default `target/`, as written by
//! `bench --both`) and writes `FILE` (default `docs/bench-contention.svg`).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use sage_lock_examples::{flag_value, workspace_root};
use serde_json::Value;

/// The figures of one server's run that the chart shows.
struct Run {
    server: &'static str,
    /// Sections per process, 4 × 2 tasks: (sage-lock, rslock).
    per_process: (Vec<f64>, Vec<f64>),
    /// p99 wait in ms, (1 × 8, 4 × 2): (sage-lock, rslock) each.
    p99: [(f64, f64); 2],
}

const SAGE: &str = "#2b6cb0";
const RSLOCK: &str = "#dd6b20";

fn main() -> anyhow::Result<()> {
    let dir =
        flag_value::<PathBuf>("--json-dir")?.unwrap_or_else(|| workspace_root().join("target"));
    let out = flag_value::<PathBuf>("--out")?
        .unwrap_or_else(|| workspace_root().join("docs").join("bench-contention.svg"));
    let runs = ["redis", "valkey"]
        .into_iter()
        .map(|server| read(&dir, server))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(&out, svg(&runs)).with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

fn read(dir: &std::path::Path, server: &'static str) -> anyhow::Result<Run> {
    let path = dir.join(format!("bench-{server}.json"));
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} (run `bench --both` first)", path.display()))?;
    let document: Value = serde_json::from_str(&text)?;
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
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="20" font-size="14" font-weight="bold">One key, 1 ms sections, worker processes started together</text>"#
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
