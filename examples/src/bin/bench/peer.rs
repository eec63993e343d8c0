//! The reference peer, `rslock`: its throughput and contention scenarios, and its errors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rslock::LockManager;

use crate::measure::{run_for, spin};
use crate::{CONTENDERS, CRITICAL_SECTION, LEASE, THROUGHPUT_TASKS};

pub(crate) fn peer_error(error: rslock::LockError) -> anyhow::Error {
    anyhow::anyhow!("rslock: {error}")
}

pub(super) async fn throughput(manager: &LockManager, window: Duration) -> anyhow::Result<u64> {
    let keys: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..THROUGHPUT_TASKS)
            .map(|i| format!("rslock:tp:{i}").into_bytes())
            .collect(),
    );
    let manager = manager.clone();
    run_for(THROUGHPUT_TASKS, window, move |task| {
        let (manager, keys) = (manager.clone(), Arc::clone(&keys));
        async move {
            let lock = manager
                .lock(keys[task].as_slice(), LEASE)
                .await
                .map_err(peer_error)?;
            manager.unlock(&lock).await;
            Ok(true)
        }
    })
    .await
}

/// [`CONTENDERS`] tasks on one key with 1 ms spinning bodies. A busy `lock` (which makes its own retries)
/// is simply called again, as rslock's `acquire` does.
pub(super) async fn contention(manager: &LockManager, window: Duration) -> anyhow::Result<u64> {
    let manager = manager.clone();
    let deadline = Instant::now() + window;
    run_for(CONTENDERS, window, move |_| {
        let manager = manager.clone();
        async move {
            if Instant::now() >= deadline {
                return Ok(false);
            }
            match manager.lock(b"rslock:contended".as_slice(), LEASE).await {
                Ok(lock) => {
                    spin(CRITICAL_SECTION);
                    manager.unlock(&lock).await;
                    Ok(true)
                }
                Err(_) => Ok(false),
            }
        }
    })
    .await
}
