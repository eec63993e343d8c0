//! Floors (for the `bench` and `cycle` bins): the uncontended cycle's two commands sent with bare fred, no lock library around
//! them. sage-lock's commands on bare fred are what any library on fred pays for sage-lock's
//! server work; rslock's commands on bare fred separate fred's client cost from redis-rs's.

use std::time::Duration;

use fred::clients::{Client, WithOptions};
use fred::interfaces::{ClientLike as _, KeysInterface as _, LuaInterface as _};
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand, Expiration, InfoKind, SetOptions, Value};

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

/// The lease of the floors' keys, ms.
const LEASE_MS: i64 = 10_000;

/// The floors' commands, prepared once: script SHAs, each task's keys, and whether the server
/// has `DELIFEQ`.
#[derive(Debug)]
pub struct Floor {
    fred: WithOptions<Client>,
    acquire: String,
    compare_delete: String,
    delifeq: bool,
    /// Per task: the five keys of sage-lock's acquire (lock, fence, queue, waiters, marker).
    sage_keys: Vec<Vec<String>>,
    /// Per task: rslock's one key.
    rslock_keys: Vec<String>,
}

impl Floor {
    /// Loads the scripts and lays out keys for `tasks` tasks (each cycles on its own keys).
    pub async fn prepare(fred: &Client, tasks: usize) -> anyhow::Result<Floor> {
        let info: String = fred.info(Some(InfoKind::Server)).await?;
        let delifeq = info
            .lines()
            .find_map(|line| line.trim().strip_prefix("valkey_version:"))
            .and_then(|version| version.split('.').next()?.parse::<u32>().ok())
            .is_some_and(|major| major >= 9);
        let sage_keys = (0..tasks)
            .map(|task| {
                ["", ":fence", ":queue", ":waiters", ":since"]
                    .iter()
                    .map(|suffix| format!("{{bench:floor:{task}}}{suffix}"))
                    .collect()
            })
            .collect();
        let rslock_keys = (0..tasks)
            .map(|task| format!("bench:floor:rslock:{task}"))
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
            sage_keys,
            rslock_keys,
        })
    }

    /// sage-lock's uncontended cycle on task `task`'s keys, bare: the acquire script, then
    /// `DELIFEQ` (Valkey 9) or the compare-and-delete script.
    pub async fn sage_commands(&self, task: usize) -> anyhow::Result<()> {
        let keys = &self.sage_keys[task];
        let token = token();
        let args = vec![
            Value::from(token.as_str()),
            Value::from(LEASE_MS),
            Value::from(0),
        ];
        let granted: Vec<i64> = self.fred.evalsha(&self.acquire, keys.clone(), args).await?;
        anyhow::ensure!(
            granted.first() == Some(&1),
            "floor: not granted: {granted:?}"
        );
        let key = keys[0].as_str();
        let deleted: i64 = if self.delifeq {
            let command = CustomCommand::new_static("DELIFEQ", ClusterHash::FirstKey, false);
            self.fred.custom(command, vec![key, token.as_str()]).await?
        } else {
            self.fred
                .evalsha(&self.compare_delete, key, token.as_str())
                .await?
        };
        anyhow::ensure!(deleted == 1, "floor: not deleted");
        Ok(())
    }

    /// rslock's cycle on task `task`'s key, bare: `SET NX PX`, then its compare-and-delete
    /// script.
    pub async fn rslock_commands(&self, task: usize) -> anyhow::Result<()> {
        let key = self.rslock_keys[task].as_str();
        let token = token();
        let set: Option<String> = self
            .fred
            .set(
                key,
                token.as_str(),
                Some(Expiration::PX(LEASE_MS)),
                Some(SetOptions::NX),
                false,
            )
            .await?;
        anyhow::ensure!(set.is_some(), "floor: SET NX refused");
        let deleted: i64 = self
            .fred
            .evalsha(&self.compare_delete, key, token.as_str())
            .await?;
        anyhow::ensure!(deleted == 1, "floor: not deleted");
        Ok(())
    }
}

/// A random owner token of 32 hex digits, as long as sage-lock's.
fn token() -> String {
    format!("{:032x}", rand::random::<u128>())
}
