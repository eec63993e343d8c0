//! Uncontended latency: `PING`, sage-lock's `with_lock` and rslock, sequential round trips of one
//! task; and two floors: the same cycles' commands sent with bare fred, no lock library around them.

use std::time::{Duration, Instant};

use fred::clients::{Client, WithOptions};
use fred::interfaces::{ClientLike as _, KeysInterface as _, LuaInterface as _};
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Expiration, InfoKind, SetOptions, Value};
use rslock::LockManager;
use sage_lock::{LockClient, LockOptions, Locks};
use sage_lock_examples::percentile;
use serde_json::json;

use crate::measure::{Probe, Usage, nanos, to_f64};
use crate::peer::peer_error;
use crate::report::{Goal, Report};
use crate::{LEASE, NO_NESTED, Plan, RSLOCK_NESTED, SAGE_NESTED};

#[derive(Debug)]
pub(crate) struct Measured {
    pub(crate) p50_us: f64,
    p99_us: f64,
    ops: u64,
    usage: Usage,
}

#[derive(Debug)]
pub(crate) struct LatencySuite {
    pub(crate) ping: Measured,
    sage: Measured,
    rslock: Measured,
    /// sage-lock's two uncontended commands, sent with bare fred.
    fred_sage: Measured,
    /// rslock's two commands (`SET NX PX`, its compare-and-delete script), sent with bare fred.
    fred_rslock: Measured,
}

/// The uncontended branch of sage-lock's mutex acquire script (`primitives::mutex::rules`), on
/// its five keys and three arguments: the attempt, the grant marker, the fencing counter.
const FLOOR_ACQUIRE: &str = "
local holder = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if not holder then
  if redis.call('SET', KEYS[5], '', 'PX', '315360000000', 'GET') == 'q' then
    return {0, 0, 0}
  end
  return {1, redis.call('INCR', KEYS[2])}
end
return {0, redis.call('PTTL', KEYS[1]), 0}
";

/// Compare-and-delete of one key: sage-lock's uncontended release where the server has no
/// `DELIFEQ` (Redis), and rslock's unlock script.
const COMPARE_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// The floors' commands, prepared once: script SHAs, keys, and whether the server has `DELIFEQ`.
#[derive(Debug)]
struct Floor {
    fred: WithOptions<Client>,
    acquire: String,
    compare_delete: String,
    delifeq: bool,
    keys: Vec<String>,
}

impl Floor {
    async fn prepare(fred: &Client) -> anyhow::Result<Floor> {
        let info: String = fred.info(Some(InfoKind::Server)).await?;
        let delifeq = info
            .lines()
            .find_map(|line| line.trim().strip_prefix("valkey_version:"))
            .and_then(|version| version.split('.').next()?.parse::<u32>().ok())
            .is_some_and(|major| major >= 9);
        let keys = ["", ":fence", ":queue", ":waiters", ":since"]
            .iter()
            .map(|suffix| format!("{{bench:floor}}{suffix}"))
            .collect();
        // As sage-lock sends them: no fred timeout per command (a zero timeout is none).
        let untimed = Options {
            timeout: Some(Duration::ZERO),
            ..Options::default()
        };
        Ok(Floor {
            fred: fred.with_options(&untimed),
            acquire: fred.script_load(FLOOR_ACQUIRE).await?,
            compare_delete: fred.script_load(COMPARE_DELETE).await?,
            delifeq,
            keys,
        })
    }

    /// sage-lock's uncontended cycle, bare: the acquire script, then `DELIFEQ` (Valkey 9) or
    /// the compare-and-delete script.
    async fn sage_commands(&self) -> anyhow::Result<()> {
        let token = token();
        let args = vec![
            Value::from(token.as_str()),
            Value::from(LEASE_MS),
            Value::from(0),
        ];
        let granted: Vec<i64> = self
            .fred
            .evalsha(&self.acquire, self.keys.clone(), args)
            .await?;
        anyhow::ensure!(
            granted.first() == Some(&1),
            "floor: not granted: {granted:?}"
        );
        self.release(&token).await
    }

    /// rslock's cycle, bare: `SET NX PX`, then its compare-and-delete script.
    async fn rslock_commands(&self) -> anyhow::Result<()> {
        let token = token();
        let set: Option<String> = self
            .fred
            .set(
                "bench:floor:rslock",
                token.as_str(),
                Some(Expiration::PX(LEASE_MS)),
                Some(SetOptions::NX),
                false,
            )
            .await?;
        anyhow::ensure!(set.is_some(), "floor: SET NX refused");
        let deleted: i64 = self
            .fred
            .evalsha(&self.compare_delete, "bench:floor:rslock", token.as_str())
            .await?;
        anyhow::ensure!(deleted == 1, "floor: not deleted");
        Ok(())
    }

    async fn release(&self, token: &str) -> anyhow::Result<()> {
        let key = self.keys[0].as_str();
        let deleted: i64 = if self.delifeq {
            let command = CustomCommand::new_static("DELIFEQ", ClusterHash::FirstKey, false);
            self.fred.custom(command, vec![key, token]).await?
        } else {
            self.fred.evalsha(&self.compare_delete, key, token).await?
        };
        anyhow::ensure!(deleted == 1, "floor: not deleted");
        Ok(())
    }
}

/// The lease of the floors' keys, ms.
const LEASE_MS: i64 = 10_000;

/// A random owner token of 32 hex digits, as sage-lock's and rslock's are about as long.
fn token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Sequential round trips of one task: `PING`, `with_lock` (empty body), rslock `lock`+`unlock`.
pub(crate) async fn latency_suite(
    fred: &Client,
    locks: &Locks<str>,
    manager: &LockManager,
    plan: &Plan,
) -> anyhow::Result<LatencySuite> {
    let batch = plan.samples / plan.rounds as usize;
    let floor = Floor::prepare(fred).await?;
    let mut samples: [Vec<u64>; 5] = Default::default();
    let mut usage: [Usage; 5] = Default::default();
    for round in 0..=plan.rounds {
        // Round 0 warms up connections, scripts and allocators.
        let warm_up = round == 0;
        let count = if warm_up { 200 } else { batch };
        for (subject, (times, total)) in samples.iter_mut().zip(&mut usage).enumerate() {
            let probe = Probe::start(fred).await?;
            for _ in 0..count {
                let start = Instant::now();
                match subject {
                    0 => {
                        let _: String = fred.ping(None).await?;
                    }
                    1 => locks.with_lock("latency", LEASE, async {}).await?,
                    2 => {
                        let lock = manager
                            .lock(b"rslock:latency".as_slice(), LEASE)
                            .await
                            .map_err(peer_error)?;
                        manager.unlock(&lock).await;
                    }
                    3 => floor.sage_commands().await?,
                    _ => floor.rslock_commands().await?,
                }
                if !warm_up {
                    times.push(nanos(start.elapsed()));
                }
            }
            let measured = probe.stop(fred).await?;
            if !warm_up {
                total.add(measured);
            }
        }
    }
    let [ping, sage, rslock, fred_sage, fred_rslock] = samples;
    let [ping_u, sage_u, rslock_u, fred_sage_u, fred_rslock_u] = usage;
    Ok(LatencySuite {
        ping: Measured::of(ping, ping_u),
        sage: Measured::of(sage, sage_u),
        rslock: Measured::of(rslock, rslock_u),
        fred_sage: Measured::of(fred_sage, fred_sage_u),
        fred_rslock: Measured::of(fred_rslock, fred_rslock_u),
    })
}

impl Measured {
    fn of(mut samples: Vec<u64>, usage: Usage) -> Measured {
        samples.sort_unstable();
        Measured {
            p50_us: to_f64(percentile(&samples, 0.50)) / 1000.0,
            p99_us: to_f64(percentile(&samples, 0.99)) / 1000.0,
            ops: samples.len() as u64,
            usage,
        }
    }
}

/// The latency suite on a runtime of its own with a single thread (and its own connections), where
/// no reply has to wake another thread: it shows the client's own overhead without thread hops.
pub(crate) fn current_thread_latency(url: &str, plan: &Plan) -> anyhow::Result<LatencySuite> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = LockClient::connect(url).await?;
        let locks = client.lock_with::<str>(LockOptions::new().lease(LEASE).namespace("bench"))?;
        let manager = LockManager::new(vec![url.to_owned()]);
        let suite = latency_suite(client.fred(), &locks, &manager, plan).await;
        client.quit().await;
        suite
    })
}

pub(crate) fn report_latency(report: &mut Report, suite: &LatencySuite, runtime: &str) {
    let rtt = suite.ping.p50_us;
    report.info(
        &format!("server: PING, 1 task, {runtime} rt"),
        "round trip p50",
        rtt,
        "us",
    );
    report.info("", "round trip p99", suite.ping.p99_us, "us");
    report.costs("", "PING", &suite.ping.usage, suite.ping.ops, NO_NESTED);
    for (library, what, measured, nested) in [
        ("sage-lock", "with_lock", &suite.sage, SAGE_NESTED),
        ("rslock", "lock+unlock", &suite.rslock, RSLOCK_NESTED),
    ] {
        report.ratio(
            &format!("{library} uncontended, {runtime} rt"),
            &format!("{what} p50 / (2 x PING p50)"),
            (measured.p50_us, "us"),
            measured.p50_us / (2.0 * rtt),
            Some(Goal::AtMost(1.2)),
        );
        report.info("", &format!("{what} p99"), measured.p99_us, "us");
        report.costs("", "cycle", &measured.usage, measured.ops, nested);
    }
    report.ratio(
        &format!("p50 latency, {runtime} rt"),
        "sage-lock / rslock",
        (suite.sage.p50_us, "us"),
        suite.sage.p50_us / suite.rslock.p50_us.max(f64::MIN_POSITIVE),
        Some(Goal::AtMost(1.0)),
    );
    for (what, measured, nested) in [
        ("sage-lock's commands", &suite.fred_sage, SAGE_NESTED),
        ("rslock's commands", &suite.fred_rslock, RSLOCK_NESTED),
    ] {
        report.ratio(
            &format!("floor: bare fred, {what}, {runtime} rt"),
            "p50 / (2 x PING p50)",
            (measured.p50_us, "us"),
            measured.p50_us / (2.0 * rtt),
            None,
        );
        report.costs("", "cycle", &measured.usage, measured.ops, nested);
    }
    // Where a sage-lock cycle's time above rslock's goes, from the p50s of this run.
    report.info(
        &format!("p50 split, {runtime} rt"),
        "sage-lock's own code (sage-lock - its commands on bare fred)",
        suite.sage.p50_us - suite.fred_sage.p50_us,
        "us",
    );
    report.info(
        "",
        "its server work (its commands - rslock's, both on bare fred)",
        suite.fred_sage.p50_us - suite.fred_rslock.p50_us,
        "us",
    );
    report.info(
        "",
        "fred against redis-rs (rslock's commands on fred - rslock)",
        suite.fred_rslock.p50_us - suite.rslock.p50_us,
        "us",
    );
    report.detail(
        &format!("latency, {runtime} runtime"),
        json!({
            "ping": suite.ping.json(NO_NESTED),
            "sage_lock": suite.sage.json(SAGE_NESTED),
            "rslock": suite.rslock.json(RSLOCK_NESTED),
            "fred_with_sage_lock_commands": suite.fred_sage.json(SAGE_NESTED),
            "fred_with_rslock_commands": suite.fred_rslock.json(RSLOCK_NESTED),
        }),
    );
}

impl Measured {
    fn json(&self, nested: &[&str]) -> serde_json::Value {
        json!({"p50_us": self.p50_us, "p99_us": self.p99_us,
               "usage": self.usage.json(self.ops, nested)})
    }
}
