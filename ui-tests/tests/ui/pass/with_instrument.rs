//! `#[tracing::instrument]` before and after `#[locked]`.
use sage_lock::locked;

#[tracing::instrument]
#[locked(key = "a:{id}", wait = "2s")]
async fn instrument_first(id: u64) -> anyhow::Result<u64> {
    tracing::info!("inside");
    Ok(id)
}

#[locked(key = "b:{id}", try_lock)]
#[tracing::instrument(err)]
async fn locked_first(id: u64) -> anyhow::Result<Option<u64>> {
    tracing::info!("inside");
    Ok(id)
}

fn main() {
    drop(instrument_first(1));
    drop(locked_first(1));
}
