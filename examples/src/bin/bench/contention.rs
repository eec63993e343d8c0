//! Contention on one key: in the bench process and in worker processes, sage-lock and rslock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fred::clients::Client;
use rslock::LockManager;
use sage_lock::{LockClient, LockError, Locks};
use sage_lock_examples::percentile;
use serde_json::json;

use crate::measure::{Probe, duration_us, nanos, ping_after_spin, run_for, spin, to_f64};
use crate::peer;
use crate::report::{Goal, Report};
use crate::{CONTENDERS, CRITICAL_SECTION, Plan, RSLOCK_NESTED, SAGE_NESTED};

/// How the critical section of the contention scenario spends its millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// Busy-wait exactly 1 ms (holds a runtime worker, like CPU-bound work).
    Spin,
    /// `tokio::time::sleep(1 ms)`, which sleeps up to the next timer tick (≈ 2 ms).
    Sleep,
}

pub(crate) async fn contention_suite(
    report: &mut Report,
    client: &LockClient,
    locks: &Locks<str>,
    manager: &LockManager,
    plan: &Plan,
    rtt_us: f64,
) -> anyhow::Result<()> {
    let ideal = 1e6 / (duration_us(CRITICAL_SECTION) + rtt_us);
    let fred = client.fred();
    let mut details = serde_json::Map::new();

    for body in [Body::Spin, Body::Sleep] {
        let stats_before = client.stats();
        let probe = Probe::start(fred).await?;
        let (sections, held_ns) = sage_contention(locks, plan.window, body).await?;
        let usage = probe.stop(fred).await?;
        let stats = client.stats();
        let acquisitions = to_f64(sections.max(1));
        let rate = to_f64(sections) / usage.elapsed_s;
        let mean_body_us = to_f64(held_ns) / 1000.0 / acquisitions;
        let busy = to_f64(stats.busy_retries - stats_before.busy_retries) / acquisitions;
        let round_trips = usage.round_trips(SAGE_NESTED) / acquisitions;
        let scenario = match body {
            Body::Spin => format!("sage-lock contention, {CONTENDERS} tasks, 1 key"),
            Body::Sleep => "sage-lock contention, sleep(1ms) body".to_owned(),
        };
        match body {
            Body::Spin => report_spin_contention(report, &scenario, rate, ideal, round_trips),
            Body::Sleep => {
                let ideal_here = 1e6 / (mean_body_us + rtt_us);
                report.ratio(
                    &scenario,
                    "critical sections/s / 1/(measured body + RTT)",
                    (rate, "/s"),
                    rate / ideal_here,
                    None,
                );
                report.info("", "round trips per acquisition", round_trips, "");
            }
        }
        report.info("", "busy retries per acquisition", busy, "");
        report.info(
            "",
            "commands incl. inside scripts per acq.",
            usage.commands.total() / acquisitions,
            "",
        );
        report.info("", "measured critical section (mean)", mean_body_us, "us");
        if body == Body::Spin {
            report.info("", "ideal 1/(1 ms + PING RTT)", ideal, "/s");
        }
        details.insert(
            format!("sage_lock_{body:?}").to_lowercase(),
            json!({"critical_sections_per_s": rate, "ideal_per_s": ideal,
                   "busy_retries_per_acquisition": busy, "mean_body_us": mean_body_us,
                   "usage": usage.json(sections, SAGE_NESTED)}),
        );
    }

    for (label, retry_delay) in [
        ("default retry, 3 x 0-200ms", None),
        ("retry 3 x 0-2ms", Some(Duration::from_millis(2))),
    ] {
        let mut manager = manager.clone();
        if let Some(delay) = retry_delay {
            manager.set_retry(3, delay);
        }
        let probe = Probe::start(fred).await?;
        let sections = peer::contention(&manager, plan.window).await?;
        let usage = probe.stop(fred).await?;
        let rate = to_f64(sections) / usage.elapsed_s;
        let round_trips = usage.round_trips(RSLOCK_NESTED) / to_f64(sections.max(1));
        let scenario = format!("rslock contention, {label}");
        report_spin_contention(report, &scenario, rate, ideal, round_trips);
        details.insert(
            format!("rslock, {label}"),
            json!({"critical_sections_per_s": rate, "usage": usage.json(sections, RSLOCK_NESTED)}),
        );
    }
    report.detail("contention", details.into());
    Ok(())
}

/// [`CONTENDERS`] tasks on one key; returns the critical sections run and the nanoseconds spent in them.
async fn sage_contention(
    locks: &Locks<str>,
    window: Duration,
    body: Body,
) -> anyhow::Result<(u64, u64)> {
    let held_ns = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + window;
    let key = match body {
        Body::Spin => "contended-spin",
        Body::Sleep => "contended-sleep",
    };
    let (locks, held) = (locks.clone(), Arc::clone(&held_ns));
    let sections = run_for(CONTENDERS, window, move |_| {
        let (locks, held) = (locks.clone(), Arc::clone(&held));
        async move {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let critical_section = async {
                let start = Instant::now();
                match body {
                    Body::Spin => spin(CRITICAL_SECTION),
                    Body::Sleep => tokio::time::sleep(CRITICAL_SECTION).await,
                }
                held.fetch_add(nanos(start.elapsed()), Ordering::Relaxed);
            };
            match locks.with_lock(key, left, critical_section).await {
                Ok(()) => Ok(true),
                Err(LockError::TimedOut { .. }) => Ok(false),
                Err(error) => Err(error.into()),
            }
        }
    })
    .await?;
    Ok((sections, held_ns.load(Ordering::Relaxed)))
}

// --- multi-process contention ------------------------------------------------------------------

/// One key, 1 ms spinning sections, 2 s waits, in worker processes started together: 1 process
/// of 8 tasks, then 4 processes of 2 tasks; sage-lock and rslock in turn.
pub(crate) async fn multi_process_suite(
    report: &mut Report,
    fred: &Client,
    url: &str,
    plan: &Plan,
    rtt_us: f64,
) -> anyhow::Result<()> {
    let mut details = serde_json::Map::new();
    // What a release costs on this machine right after a spinning body, next to the ideal's
    // round trip: the machine's share of the gap between the ideal and what any lock reaches.
    let handoff_rtt_us = ping_after_spin(fred, 500).await?;
    report.info(
        "server: PING right after a 1 ms spin",
        "round trip p50 (the hand-off's)",
        handoff_rtt_us,
        "us",
    );
    details.insert("ping_after_spin_p50_us".into(), json!(handoff_rtt_us));
    let rtts = (rtt_us, handoff_rtt_us);
    // (processes, tasks, goal for the share of ideal): the two contended shapes.
    for (processes, tasks, goal) in [(1, 8, 0.95), (4, 2, 0.9)] {
        let detail =
            process_contention(report, fred, url, plan, rtts, processes, tasks, goal).await?;
        details.insert(format!("{processes}x{tasks}"), detail);
    }
    report.detail("multi_process_contention", details.into());
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn process_contention(
    report: &mut Report,
    fred: &Client,
    url: &str,
    plan: &Plan,
    (rtt_us, handoff_rtt_us): (f64, f64),
    processes: usize,
    tasks: usize,
    goal: f64,
) -> anyhow::Result<serde_json::Value> {
    use sage_lock_examples::multiprocess::{self, Scenario, Subject};
    let scenario = Scenario {
        processes,
        tasks,
        run: if plan.samples < 6_000 {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(4)
        },
        section: CRITICAL_SECTION,
        wait: Duration::from_secs(2),
    };
    let ideal = scenario.run.as_secs_f64() * 1e6 / (duration_us(CRITICAL_SECTION) + rtt_us);
    // The same with the round trip a release pays on this machine after a spinning body.
    let machine_ideal =
        scenario.run.as_secs_f64() * 1e6 / (duration_us(CRITICAL_SECTION) + handoff_rtt_us);
    let mut details = serde_json::Map::new();
    let mut p99s = Vec::new();
    for (subject, label, nested) in [
        (Subject::SageLock, "sage-lock", SAGE_NESTED),
        (Subject::Rslock, "rslock", RSLOCK_NESTED),
    ] {
        let ns = format!("mp{processes}x{tasks}");
        let running = multiprocess::spawn(subject, url, &ns, scenario)?;
        tokio::time::sleep_until((running.starts_at - Duration::from_millis(50)).into()).await;
        let probe = Probe::start(fred).await?;
        let reports = running.finish().await?;
        let usage = probe.stop(fred).await?;
        let sections: Vec<u64> = reports.iter().map(|r| r.sections).collect();
        let total: u64 = sections.iter().sum();
        let timeouts: u64 = reports.iter().map(|r| r.timeouts).sum();
        let mut waits: Vec<u64> = reports.iter().flat_map(|r| r.waits_us.clone()).collect();
        waits.sort_unstable();
        let p99_ms = to_f64(percentile(&waits, 0.99)) / 1000.0;
        p99s.push(p99_ms);
        let fewest = sections.iter().copied().min().unwrap_or(0);
        let most = sections.iter().copied().max().unwrap_or(0).max(1);
        let acquisitions = to_f64(total.max(1));
        // Acquire-side commands: every command clients sent minus one release per
        // acquisition, plus the release notifications (SPUBLISH inside the release script).
        let commands = (usage.round_trips(nested) - acquisitions
            + usage.commands.calls("spublish"))
            / acquisitions;
        let per_process = sections
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" / ");
        let scenario_name = if processes == 1 {
            format!("{label}, 1 process x {tasks} tasks, 1 key")
        } else {
            format!("{label}, {processes} processes x {tasks} tasks, 1 key")
        };
        report.ratio(
            &scenario_name,
            "critical sections / ideal",
            (to_f64(total), ""),
            to_f64(total) / ideal,
            Some(Goal::AtLeast(goal)),
        );
        report.ratio(
            "",
            "critical sections / ideal with the hand-off's PING",
            (to_f64(total), ""),
            to_f64(total) / machine_ideal,
            None,
        );
        if processes > 1 {
            report.ratio(
                "",
                &format!("fewest/most per process ({per_process})"),
                (to_f64(fewest), ""),
                to_f64(fewest) / to_f64(most),
                Some(Goal::AtLeast(0.8)),
            );
        }
        report.ratio(
            "",
            "waits timed out (2 s)",
            (to_f64(timeouts), ""),
            to_f64(timeouts),
            Some(Goal::AtMost(0.0)),
        );
        report.info("", "p99 wait", p99_ms, "ms");
        report.ratio(
            "",
            "server commands per acquisition (notifications incl.)",
            (commands, ""),
            commands,
            Some(Goal::AtMost(3.0)),
        );
        details.insert(
            label.to_owned(),
            json!({"sections_per_process": sections, "timeouts": timeouts,
                   "p99_wait_ms": p99_ms, "ideal_sections": ideal,
                   "ideal_sections_with_handoff_ping": machine_ideal,
                   "commands_per_acquisition": commands,
                   "usage": usage.json(total, nested)}),
        );
    }
    if let [sage, rslock] = p99s[..] {
        report.ratio(
            &format!("p99 wait, {processes} x {tasks} tasks"),
            "sage-lock / rslock",
            (sage, "ms"),
            sage / rslock.max(f64::MIN_POSITIVE),
            Some(Goal::AtMost(1.0)),
        );
    }
    Ok(details.into())
}

/// The two goal rows of the 1 ms-spin contention scenario, the same for every subject.
fn report_spin_contention(
    report: &mut Report,
    scenario: &str,
    rate: f64,
    ideal: f64,
    round_trips: f64,
) {
    report.ratio(
        scenario,
        "critical sections/s (1 ms spin) / ideal",
        (rate, "/s"),
        rate / ideal,
        None,
    );
    report.ratio(
        "",
        "round trips per acquisition",
        (round_trips, ""),
        round_trips,
        Some(Goal::AtMost(4.0)),
    );
}
