//! What the parent prints: the progress line or bar while workers run, and the summary at the end.

use std::io::Write as _;
use std::time::Duration;

use sage_lock_examples::percentile;

use crate::WorkerView;
use crate::check::Check;

pub(crate) fn progress_text(views: &[WorkerView], elapsed: Duration) -> String {
    let total: u64 = views.iter().map(|v| v.ops).sum();
    let overlaps: u64 = views.iter().map(|v| v.overlaps).sum();
    let per_worker: Vec<String> = views
        .iter()
        .enumerate()
        .map(|(i, v)| format!("w{i} {}", v.ops))
        .collect();
    format!(
        "{:5.1}s  {total} critical sections  ({})  overlaps {overlaps}",
        elapsed.as_secs_f64(),
        per_worker.join(" · ")
    )
}

pub(crate) fn draw_bar(views: &[WorkerView], elapsed: Duration, seconds: f64, finished: bool) {
    const WIDTH: usize = 30;
    let fraction = if finished {
        1.0
    } else {
        (elapsed.as_secs_f64() / seconds).clamp(0.0, 1.0)
    };
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let filled = ((WIDTH as f64) * fraction).round() as usize;
    let bar = format!("{}{}", "█".repeat(filled), "░".repeat(WIDTH - filled));
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r\x1b[2K\x1b[36m{bar}\x1b[0m {}",
        progress_text(views, elapsed)
    );
    let _ = err.flush();
}

#[allow(clippy::cast_precision_loss)]
fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

pub(crate) fn print_summary(views: &[WorkerView], check: &Check) {
    let field = |done: &serde_json::Value, name: &str| done[name].as_u64().unwrap_or(0);
    println!();
    println!(
        "{:<8} {:>8} {:>12} {:>12} {:>13} {:>9} {:>7} {:>9} {:>9}",
        "worker",
        "ops",
        "p50 wait ms",
        "p99 wait ms",
        "busy retries",
        "renewals",
        "losses",
        "timeouts",
        "overlaps"
    );
    let mut all_waits = Vec::new();
    let mut totals = [0_u64; 6];
    for (id, view) in views.iter().enumerate() {
        let Some(done) = &view.done else {
            println!("w{id:<7} (no report)");
            continue;
        };
        let mut waits: Vec<u64> = done["waits_us"]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
            .unwrap_or_default();
        waits.sort_unstable();
        let row = [
            field(done, "ops"),
            field(done, "busy_retries"),
            field(done, "renewals"),
            field(done, "losses"),
            field(done, "timeouts"),
            field(done, "overlaps"),
        ];
        for (total, value) in totals.iter_mut().zip(row) {
            *total += value;
        }
        println!(
            "w{id:<7} {:>8} {:>12.2} {:>12.2} {:>13} {:>9} {:>7} {:>9} {:>9}",
            row[0],
            ms(percentile(&waits, 0.50)),
            ms(percentile(&waits, 0.99)),
            row[1],
            row[2],
            row[3],
            row[4],
            row[5]
        );
        all_waits.extend(waits);
    }
    all_waits.sort_unstable();
    println!(
        "{:<8} {:>8} {:>12.2} {:>12.2} {:>13} {:>9} {:>7} {:>9} {:>9}",
        "total",
        totals[0],
        ms(percentile(&all_waits, 0.50)),
        ms(percentile(&all_waits, 0.99)),
        totals[1],
        totals[2],
        totals[3],
        totals[4],
        totals[5]
    );
    println!();
    println!("{:<8} {:>14} {:>14}  check", "key", "counter", "increments");
    for (key, (stored, reported)) in &check.counters {
        let verdict = if stored == reported { "ok" } else { "MISMATCH" };
        println!("{key:<8} {stored:>14} {reported:>14}  {verdict}");
    }
    println!();
    // With no critical section run there is nothing to call correct (the parent says why).
    if check.exclusive() && totals[0] > 0 {
        println!(
            "CORRECT: every counter equals its increments, 0 overlaps, fencing tokens strictly increasing"
        );
    }
}
