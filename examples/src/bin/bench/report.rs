//! The report: its rows and goals, the table on stdout and the JSON file.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;

use crate::measure::{Usage, to_f64};

/// One line of the report; an empty scenario continues the one above.
#[derive(Debug, Clone)]
struct Row {
    scenario: String,
    metric: String,
    value: f64,
    unit: &'static str,
    ratio: Option<f64>,
    goal: Option<Goal>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Goal {
    AtMost(f64),
    AtLeast(f64),
}

impl Goal {
    fn met(self, ratio: f64) -> bool {
        match self {
            Goal::AtMost(limit) => ratio <= limit,
            Goal::AtLeast(limit) => ratio >= limit,
        }
    }

    fn text(self) -> String {
        match self {
            Goal::AtMost(limit) => format!("<= {limit}"),
            Goal::AtLeast(limit) => format!(">= {limit}"),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Report {
    rows: Vec<Row>,
    details: serde_json::Map<String, serde_json::Value>,
}

impl Report {
    pub(crate) fn info(&mut self, scenario: &str, metric: &str, value: f64, unit: &'static str) {
        self.rows.push(Row {
            scenario: scenario.to_owned(),
            metric: metric.to_owned(),
            value,
            unit,
            ratio: None,
            goal: None,
        });
    }

    pub(crate) fn ratio(
        &mut self,
        scenario: &str,
        metric: &str,
        (value, unit): (f64, &'static str),
        ratio: f64,
        goal: Option<Goal>,
    ) {
        self.rows.push(Row {
            scenario: scenario.to_owned(),
            metric: metric.to_owned(),
            value,
            unit,
            ratio: Some(ratio),
            goal,
        });
    }

    /// Round trips, client CPU, server CPU and server execution time per operation.
    pub(crate) fn costs(
        &mut self,
        scenario: &str,
        op: &str,
        usage: &Usage,
        ops: u64,
        nested: &[&str],
    ) {
        let ops = to_f64(ops.max(1));
        self.info(
            scenario,
            &format!("round trips per {op}"),
            usage.round_trips(nested) / ops,
            "",
        );
        self.info(
            "",
            &format!("client CPU per {op}"),
            usage.client_cpu_s * 1e6 / ops,
            "us",
        );
        self.info(
            "",
            &format!("server CPU per {op}"),
            usage.server_cpu_s * 1e6 / ops,
            "us",
        );
        self.info(
            "",
            &format!("server command execution per {op}"),
            usage.commands.exec_us(nested) / ops,
            "us",
        );
    }

    pub(crate) fn detail(&mut self, name: &str, value: serde_json::Value) {
        self.details.insert(name.to_owned(), value);
    }
}

fn format_value(value: f64, unit: &str) -> String {
    let number = if value.abs() >= 1000.0 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    };
    if unit.is_empty() {
        number
    } else {
        format!("{number} {unit}")
    }
}

pub(crate) fn print_table(report: &Report) {
    let width = |f: fn(&Row) -> usize| report.rows.iter().map(f).max().unwrap_or(8).max(8);
    let scenario_width = width(|r| r.scenario.len());
    let metric_width = width(|r| r.metric.len());
    println!();
    println!(
        "{:<scenario_width$}  {:<metric_width$}  {:>12}  {:>7}  {:>7}  met?",
        "scenario", "metric", "value", "ratio", "goal"
    );
    println!("{}", "-".repeat(scenario_width + metric_width + 40));
    for row in &report.rows {
        if !row.scenario.is_empty() && !std::ptr::eq(row, &report.rows[0]) {
            println!();
        }
        let ratio = row.ratio.map_or_else(String::new, |r| format!("{r:.2}"));
        let goal = row.goal.map_or_else(String::new, Goal::text);
        let met = match (row.ratio, row.goal) {
            (Some(ratio), Some(goal)) if goal.met(ratio) => "yes",
            (Some(_), Some(_)) => "NO",
            _ => "",
        };
        println!(
            "{:<scenario_width$}  {:<metric_width$}  {:>12}  {ratio:>7}  {goal:>7}  {met}",
            row.scenario,
            row.metric,
            format_value(row.value, row.unit),
        );
    }
}

pub(crate) fn write_json(report: &Report, path: &Path, total: Duration) -> anyhow::Result<()> {
    let mut scenario = String::new();
    let rows: Vec<serde_json::Value> = report
        .rows
        .iter()
        .map(|row| {
            if !row.scenario.is_empty() {
                scenario.clone_from(&row.scenario);
            }
            json!({
                "scenario": scenario,
                "metric": row.metric,
                "value": row.value,
                "unit": row.unit,
                "ratio": row.ratio,
                "goal": row.goal.map(Goal::text),
                "met": match (row.ratio, row.goal) {
                    (Some(ratio), Some(goal)) => Some(goal.met(ratio)),
                    _ => None,
                },
            })
        })
        .collect();
    let document = json!({
        "rows": rows,
        "details": report.details,
        "duration_s": total.as_secs_f64(),
    });
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, serde_json::to_string_pretty(&document)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
