//! Three Sentinels watching a [`Replicated`] primary with two replicas.

use std::time::Duration;

use super::{PROBE, Replicated, describe_all, field, info, launch_all, wait_until};
use crate::resp::{Reply, cmd_timeout};
use crate::server::{START_TIMEOUT, Server, ServerConfig, ServerKind};

/// The Sentinel service name of every [`SentinelSetup`].
pub const SENTINEL_SERVICE: &str = "mymaster";
/// Sentinel `down-after-milliseconds`.
pub const SENTINEL_DOWN_AFTER_MS: u64 = 1000;
/// Sentinel `failover-timeout`.
pub const SENTINEL_FAILOVER_TIMEOUT_MS: u64 = 3000;

/// A [`Replicated`] primary with 2 replicas, monitored by 3 Sentinels as [`SENTINEL_SERVICE`]
/// (quorum 2, `down-after-milliseconds` 1000, `failover-timeout` 3000).
#[derive(Debug)]
pub struct SentinelSetup {
    pub data: Replicated,
    pub sentinels: Vec<Server>,
}

impl SentinelSetup {
    /// Starts the data nodes and the Sentinels, and waits until every Sentinel sees the primary,
    /// both replicas and both other Sentinels.
    ///
    /// # Panics
    /// When something does not come up within 20 s.
    pub fn start(kind: ServerKind) -> SentinelSetup {
        let data = Replicated::start(kind, 2);
        let primary = data.primary.port();
        let config = ServerConfig::new(kind)
            .sentinel()
            .conf_line(format!(
                "sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {primary} 2"
            ))
            .conf_line(format!(
                "sentinel down-after-milliseconds {SENTINEL_SERVICE} {SENTINEL_DOWN_AFTER_MS}"
            ))
            .conf_line(format!(
                "sentinel failover-timeout {SENTINEL_SERVICE} {SENTINEL_FAILOVER_TIMEOUT_MS}"
            ))
            .conf_line(format!("sentinel parallel-syncs {SENTINEL_SERVICE} 1"));
        let sentinels = launch_all(vec![config; 3]);
        let setup = SentinelSetup { data, sentinels };
        if let Err(e) = setup.wait_settled(START_TIMEOUT) {
            panic!(
                "{kind} sentinels did not settle: {e}\n{}",
                describe_all(setup.sentinels.iter().chain(setup.data.servers()))
            );
        }
        setup
    }

    /// `redis-sentinel://127.0.0.1:S1?sentinelServiceName=mymaster&node=127.0.0.1:S2&node=127.0.0.1:S3`,
    /// as `fred::types::config::Config::from_url` parses it.
    pub fn url(&self) -> String {
        let mut ports = self.sentinels.iter().map(Server::port);
        let first = ports.next().unwrap_or_default();
        let mut url =
            format!("redis-sentinel://127.0.0.1:{first}?sentinelServiceName={SENTINEL_SERVICE}");
        for port in ports {
            url.push_str(&format!("&node=127.0.0.1:{port}"));
        }
        url
    }

    /// The primary's port per `SENTINEL get-master-addr-by-name`, from the first Sentinel that
    /// answers (frozen ones, [`Server::pause`], are not asked).
    ///
    /// # Panics
    /// When no Sentinel answers.
    pub fn current_primary_port(&self) -> u16 {
        let mut errors = Vec::new();
        for sentinel in self.sentinels.iter().filter(|s| !s.is_paused()) {
            match self.primary_port_per(sentinel.port()) {
                Ok(port) => return port,
                Err(e) => errors.push(e),
            }
        }
        panic!("no sentinel reports the primary: {errors:?}");
    }

    /// The data server that Sentinel reports as primary.
    pub fn current_primary(&self) -> &Server {
        let port = self.current_primary_port();
        self.data
            .server(port)
            .unwrap_or_else(|| panic!("sentinel reports unknown primary port {port}"))
    }

    fn primary_port_per(&self, sentinel_port: u16) -> Result<u16, String> {
        let reply = cmd_timeout(
            sentinel_port,
            &["SENTINEL", "get-master-addr-by-name", SENTINEL_SERVICE],
            PROBE,
        )?
        .into_result()?;
        reply
            .as_array()
            .and_then(|a| a.get(1))
            .and_then(Reply::as_int)
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| format!("sentinel {sentinel_port}: unexpected reply {reply}"))
    }

    /// Waits until every running Sentinel (not frozen, [`Server::pause`]) reports a primary other than `old_port`, all agree, that
    /// server says `role:master`, and every other running data server (except `old_port`) is its
    /// replica with the link up. Returns the new primary's port.
    ///
    /// A restarted old primary is turned into a replica by Sentinel only at its next `INFO` poll,
    /// up to 10 s later; send it `REPLICAOF` yourself when a test needs it sooner.
    pub fn wait_for_failover(&self, old_port: u16, timeout: Duration) -> Result<u16, String> {
        let mut new_port = 0;
        wait_until(timeout, || {
            let mut ports = Vec::new();
            for sentinel in self
                .sentinels
                .iter()
                .filter(|s| s.is_running() && !s.is_paused())
            {
                ports.push(self.primary_port_per(sentinel.port())?);
            }
            let Some(&first) = ports.first() else {
                return Err("no sentinel is running".to_owned());
            };
            if first == old_port || ports.iter().any(|&p| p != first) {
                return Err(format!(
                    "sentinels report primaries {ports:?} (old {old_port})"
                ));
            }
            let role = field(&info(first, "replication")?, "role", first)?;
            if role != "master" {
                return Err(format!("new primary {first} has role {role}"));
            }
            for replica in self
                .data
                .servers()
                .filter(|s| s.port() != first && s.port() != old_port && s.is_running())
            {
                let text = info(replica.port(), "replication")?;
                let master_port = field(&text, "master_port", replica.port())?;
                let link = field(&text, "master_link_status", replica.port())?;
                if master_port != first.to_string() || link != "up" {
                    return Err(format!(
                        "replica {}: master_port={master_port} master_link_status={link}",
                        replica.port()
                    ));
                }
            }
            new_port = first;
            Ok(())
        })?;
        Ok(new_port)
    }

    /// Waits until every running Sentinel (not frozen) sees the primary as `master` (not down), both replicas and
    /// the two other Sentinels.
    pub fn wait_settled(&self, timeout: Duration) -> Result<(), String> {
        let replicas = self.data.replicas.len().to_string();
        let others = (self.sentinels.len().saturating_sub(1)).to_string();
        wait_until(timeout, || {
            for sentinel in self
                .sentinels
                .iter()
                .filter(|s| s.is_running() && !s.is_paused())
            {
                let port = sentinel.port();
                let pairs = cmd_timeout(port, &["SENTINEL", "MASTER", SENTINEL_SERVICE], PROBE)?
                    .into_result()?
                    .to_pairs();
                let get = |k: &str| {
                    pairs
                        .iter()
                        .find(|(key, _)| key == k)
                        .map(|(_, v)| v.as_str())
                        .unwrap_or("")
                };
                if get("flags") != "master"
                    || get("num-slaves") != replicas
                    || get("num-other-sentinels") != others
                {
                    return Err(format!(
                        "sentinel {port}: flags={} num-slaves={} num-other-sentinels={}",
                        get("flags"),
                        get("num-slaves"),
                        get("num-other-sentinels")
                    ));
                }
            }
            Ok(())
        })
    }
}
