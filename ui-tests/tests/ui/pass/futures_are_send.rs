//! The futures of `#[locked]` functions are `Send` when their bodies are: they can be spawned.
use sage_lock::{LockClient, locked};

#[locked(key = "a:{id}", wait = "2s")]
async fn global_client(id: u64) -> anyhow::Result<u64> {
    tokio::task::yield_now().await;
    Ok(id)
}

#[locked(key = "b:{id}", try_lock, client = client)]
async fn explicit_client(client: LockClient, id: u64) -> anyhow::Result<Option<u64>> {
    tokio::task::yield_now().await;
    Ok(id)
}

fn assert_send<T: Send + 'static>(_: &T) {}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let _guard = runtime.enter();
    let handle = tokio::spawn(global_client(1));
    handle.abort();
    assert_send(&global_client(1));
    let _ = |client: LockClient| assert_send(&explicit_client(client, 1));
}
