//! The end-of-run correctness check: counters against reported increments, overlaps, fencing.

use std::collections::BTreeMap;

use fred::interfaces::KeysInterface as _;
use sage_lock::LockClient;
use sage_lock_examples::ThrowawayServer;
use sage_lock_examples::cleanup::{delete_keys, lock_keys};

use crate::{Settings, WorkerView, data_keys, key_name};

/// The end-of-run correctness check.
#[derive(Debug, Default)]
pub(crate) struct Check {
    /// key -> (counter in Redis, increments reported by workers)
    pub(crate) counters: BTreeMap<String, (u64, u64)>,
    pub(crate) overlaps: u64,
    pub(crate) lost_updates: u64,
    pub(crate) fence_regressions: u64,
}

/// Removes the run's data keys (counters, owner markers, fences) from the server, and the keys
/// its locks leave behind (each key's fencing counter, `:since` marker, and the queue of
/// waiters an interrupted run cut off): the run's namespaces are its own, so nothing of it is
/// left on a server the user pointed the demo at. One `DEL` per key: in a cluster the keys lie
/// in several hash slots, which one `DEL` cannot span (`CROSSSLOT`).
pub(crate) async fn remove_data(
    client: &LockClient,
    run: &str,
    settings: &Settings,
) -> anyhow::Result<()> {
    let mut namespaces = vec![format!("demo-{run}")];
    if settings.break_exclusivity {
        namespaces.extend((0..=settings.workers).map(|id| format!("demo-{run}-worker-{id}")));
    }
    let mut keys: Vec<Vec<u8>> = Vec::new();
    for index in 0..settings.keys {
        let key = key_name(index);
        let (counter_key, owner_key, fence_key) = data_keys(run, &key);
        keys.extend([counter_key, owner_key, fence_key].map(String::into_bytes));
        for namespace in &namespaces {
            keys.extend(lock_keys(namespace, &key));
        }
    }
    delete_keys(client.fred(), keys).await?;
    Ok(())
}

/// After Ctrl-C: removes the run's data keys from `server`.
pub(crate) async fn clean_up(
    server: &ThrowawayServer,
    run: &str,
    settings: &Settings,
) -> anyhow::Result<()> {
    let client = LockClient::connect(server.url()).await?;
    remove_data(&client, run, settings).await?;
    client.quit().await;
    Ok(())
}

impl Check {
    pub(crate) async fn new(
        server: &ThrowawayServer,
        run: &str,
        settings: &Settings,
        views: &[WorkerView],
    ) -> anyhow::Result<Check> {
        let client = LockClient::connect(server.url()).await?;
        let mut check = Check::default();
        for index in 0..settings.keys {
            let key = key_name(index);
            let (counter_key, ..) = data_keys(run, &key);
            let stored: Option<u64> = client.fred().get(&counter_key).await?;
            let reported: u64 = views
                .iter()
                .filter_map(|v| v.done.as_ref())
                .filter_map(|d| d["increments"][&key].as_u64())
                .sum();
            let stored = stored.unwrap_or(0);
            check.lost_updates += reported.abs_diff(stored);
            check.counters.insert(key, (stored, reported));
        }
        remove_data(&client, run, settings).await?;
        for done in views.iter().filter_map(|v| v.done.as_ref()) {
            check.overlaps += done["overlaps"].as_u64().unwrap_or(0);
            check.fence_regressions += done["fence_regressions"].as_u64().unwrap_or(0);
        }
        client.quit().await;
        Ok(check)
    }

    pub(crate) fn exclusive(&self) -> bool {
        self.overlaps == 0 && self.lost_updates == 0 && self.fence_regressions == 0
    }
}
