use sage_lock::locked;

pub trait Ledger {
    #[locked(key = "post:{id}", wait = "2s")]
    async fn post(&self, id: u64) -> anyhow::Result<u64>;
}

fn main() {}
