//! `#[tracing::instrument]` before and after `#[locked]`, in both modes (`instrument` above a
//! `try_lock` function did not compile: its fake return has the declared type, helper 28).
#![deny(warnings)]
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

#[tracing::instrument]
#[locked(key = "c:{id}", try_lock)]
async fn instrument_first_try(id: u64) -> anyhow::Result<Option<u64>> {
    tracing::info!("inside");
    Ok(id)
}

#[tracing::instrument(err, ret)]
#[locked(key = "d:{id}", try_lock)]
async fn instrument_first_try_err(id: u64) -> Result<Option<u64>, sage_lock::LockError> {
    if id == 0 {
        return Ok(1);
    }
    Ok(id)
}

#[locked(key = "e:{id}", wait = "1s")]
#[tracing::instrument]
async fn locked_first_wait(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

#[async_trait::async_trait]
trait Audit {
    async fn audit(&self, id: u64) -> anyhow::Result<Option<u64>>;
}

#[derive(Debug)]
struct Auditor;

#[async_trait::async_trait]
impl Audit for Auditor {
    #[tracing::instrument]
    #[locked(key = "f:{id}", try_lock)]
    async fn audit(&self, id: u64) -> anyhow::Result<Option<u64>> {
        Ok(id)
    }
}

#[async_trait::async_trait]
trait Settle {
    async fn settle(&self, id: u64) -> anyhow::Result<Option<()>>;
}

struct Settler(sage_lock::LockClient);

#[async_trait::async_trait]
impl Settle for Settler {
    #[tracing::instrument(skip(self))]
    #[locked(key = "g:{id}", try_lock, client = self.0)]
    async fn settle(&self, id: u64) -> anyhow::Result<Option<()>> {
        Ok(())
    }
}

/// A parameter used only in the key (it was "unused" in an `#[async_trait]` impl: its rebinding
/// moved into the body, helper 28).
#[async_trait::async_trait]
trait Check {
    async fn check(&self, id: u64, tries: u32) -> anyhow::Result<Option<()>>;
}

#[async_trait::async_trait]
impl Check for Settler {
    #[locked(key = "h:{id}:{tries}", try_lock, client = self.0)]
    async fn check(&self, id: u64, tries: u32) -> anyhow::Result<Option<()>> {
        Ok(())
    }
}

fn main() {
    drop(instrument_first(1));
    drop(locked_first(1));
    drop(instrument_first_try(1));
    drop(instrument_first_try_err(1));
    drop(locked_first_wait(1));
    drop(Auditor.audit(1));
}
