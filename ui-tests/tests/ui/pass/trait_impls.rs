//! Native `async fn` in trait impls (with `Send` futures required by the trait), and
//! `#[async_trait]` impls, in both modes.
use sage_lock::{LockClient, locked};

pub struct Ledger {
    pub locks: LockClient,
}

#[allow(async_fn_in_trait)] // `local` is meant for single-threaded callers
pub trait Post {
    fn post(&self, id: u64) -> impl Future<Output = anyhow::Result<u64>> + Send;
    fn try_post(&self, id: u64) -> impl Future<Output = anyhow::Result<Option<u64>>> + Send;
    async fn local(&self, id: u64) -> anyhow::Result<u64>;
}

impl Post for Ledger {
    #[locked(key = "post:{id}", wait = "2s", client = self.locks)]
    async fn post(&self, id: u64) -> anyhow::Result<u64> {
        Ok(id)
    }

    #[locked(key = "post:{id}", try_lock, client = self.locks)]
    async fn try_post(&self, id: u64) -> anyhow::Result<Option<u64>> {
        Ok(id)
    }

    #[locked(key = "post:{id}", wait = "2s", client = self.locks)]
    async fn local(&self, id: u64) -> anyhow::Result<u64> {
        Ok(id)
    }
}

#[async_trait::async_trait]
pub trait Journal {
    async fn write(&self, id: u64, text: &str) -> anyhow::Result<usize>;
    async fn try_write(&self, id: u64) -> anyhow::Result<Option<u64>>;
    async fn consume(self, id: u64) -> anyhow::Result<u64>
    where
        Self: Sized;
    async fn defaulted(&self, id: u64) -> anyhow::Result<u64> {
        Ok(id)
    }
}

#[async_trait::async_trait]
impl Journal for Ledger {
    #[locked(key = "journal:{id}:{text}", wait = "2s", client = self.locks)]
    async fn write(&self, id: u64, text: &str) -> anyhow::Result<usize> {
        anyhow::ensure!(id > 0, "no id");
        Ok(text.len())
    }

    #[locked(key = "journal:{id}", try_lock, client = self.locks)]
    async fn try_write(&self, id: u64) -> anyhow::Result<Option<u64>> {
        anyhow::ensure!(id > 0, "no id");
        if id == 1 {
            return Ok(1);
        }
        Ok(id)
    }

    #[locked(key = "journal:{id}", wait = "2s", client = self.locks.clone())]
    async fn consume(self, id: u64) -> anyhow::Result<u64> {
        drop(self);
        Ok(id)
    }

    #[locked(key = "journal:{id}", wait = "2s", client = self.locks)]
    async fn defaulted(&self, id: u64) -> anyhow::Result<u64> {
        Ok(id + 1)
    }
}

fn main() {
    let _ = <Ledger as Post>::post;
    let _ = <Ledger as Journal>::write;
}
