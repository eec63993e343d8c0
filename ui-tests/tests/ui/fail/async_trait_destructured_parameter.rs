use sage_lock::{LockClient, locked};

pub struct Ledger {
    pub locks: LockClient,
}

#[async_trait::async_trait]
pub trait Post {
    async fn post(&self, pair: (u64, u64)) -> anyhow::Result<u64>;
}

#[async_trait::async_trait]
impl Post for Ledger {
    #[locked(key = "post:{a}", wait = "2s", client = self.locks)]
    async fn post(&self, (a, b): (u64, u64)) -> anyhow::Result<u64> {
        Ok(a + b)
    }
}

fn main() {}
