use sage_lock::locked;

pub struct Service {
    pub url: String,
}

impl Service {
    #[locked(key = "account:{id}", wait = "2s", client = self.url)]
    pub async fn update(&self, id: u64) -> anyhow::Result<u64> {
        Ok(id)
    }
}

fn main() {}
