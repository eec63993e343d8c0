//! The fencing-aware store the critical sections write to: a standalone server that no fault
//! touches, holding one counter per lock key.
//!
//! A critical section does a fenced read (refused, and nothing recorded, if a higher token was
//! seen; else its token becomes the highest seen), then a fenced write of `value + 1` (refused if
//! a higher token was seen since; else the value is set, `accepted` is incremented and the token
//! appended to `log`). Fencing the read too means that two overlapping holders can never both
//! have their read-modify-write accepted unless one read after the other wrote, so a correct
//! lock plus a correct fence give `value == accepted` for every key.

use sage_lock::fred::clients::Client;
use sage_lock::fred::interfaces::{ClientLike as _, LuaInterface as _};
use sage_lock::fred::types::config::Config;

use crate::Reply;

const READ: &str = r"
local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < highest then
  return {0, highest}
end
redis.call('SET', KEYS[2], ARGV[1])
return {1, tonumber(redis.call('GET', KEYS[1]) or '0')}
";

const WRITE: &str = r"
local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < highest then
  redis.call('INCR', KEYS[4])
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
redis.call('INCR', KEYS[3])
redis.call('RPUSH', KEYS[5], ARGV[1])
return 1
";

/// The store's keys for one lock key: value, highest token, accepted, rejected, token log.
fn keys(key: &str) -> Vec<String> {
    ["value", "highest", "accepted", "rejected", "log"]
        .iter()
        .map(|part| format!("store:{key}:{part}"))
        .collect()
}

/// A worker's connection to the store.
#[derive(Debug)]
pub struct StoreClient {
    client: Client,
}

impl StoreClient {
    pub async fn connect(port: u16) -> Result<StoreClient, String> {
        let config = Config::from_url(&format!("redis://127.0.0.1:{port}"))
            .map_err(|e| format!("store url: {e}"))?;
        let client = Client::new(config, None, None, None);
        client
            .init()
            .await
            .map_err(|e| format!("connecting to the store on port {port}: {e}"))?;
        Ok(StoreClient { client })
    }

    /// The fenced read: `Some(value)`, or `None` when a higher token was seen.
    pub async fn read(&self, key: &str, token: u64) -> Result<Option<i64>, String> {
        let mut all = keys(key);
        all.truncate(2);
        let reply: Vec<i64> = self
            .client
            .eval(READ, all, vec![token.to_string()])
            .await
            .map_err(|e| format!("store read: {e}"))?;
        Ok(match reply.as_slice() {
            [1, value] => Some(*value),
            _ => None,
        })
    }

    /// The fenced write of `value`: `true` when accepted.
    pub async fn write(&self, key: &str, token: u64, value: i64) -> Result<bool, String> {
        let accepted: i64 = self
            .client
            .eval(WRITE, keys(key), vec![token.to_string(), value.to_string()])
            .await
            .map_err(|e| format!("store write: {e}"))?;
        Ok(accepted == 1)
    }

    pub async fn quit(&self) {
        let _ = self.client.quit().await;
    }
}

/// What the store holds for one lock key after the run.
#[derive(Clone, Debug, Default)]
pub struct KeyState {
    pub value: i64,
    pub accepted: i64,
    pub rejected: i64,
    /// Tokens of the accepted writes, in the order the store accepted them.
    pub log: Vec<u64>,
}

/// Reads the state of `key` from the store on `port`.
pub fn snapshot(port: u16, key: &str) -> Result<KeyState, String> {
    let names = keys(key);
    let int = |name: &str| -> Result<i64, String> {
        let reply = crate::cmd(port, &["GET", name])?.into_result()?;
        Ok(if reply.is_nil() {
            0
        } else {
            reply
                .as_int()
                .ok_or_else(|| format!("store {name}: not an integer: {reply}"))?
        })
    };
    let log = crate::cmd(port, &["LRANGE", &names[4], "0", "-1"])?.into_result()?;
    let log = log
        .as_array()
        .unwrap_or_default()
        .iter()
        .map(Reply::as_int)
        .map(|t| t.and_then(|t| u64::try_from(t).ok()))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| format!("store {}: malformed token log", names[4]))?;
    Ok(KeyState {
        value: int(&names[0])?,
        accepted: int(&names[2])?,
        rejected: int(&names[3])?,
        log,
    })
}
