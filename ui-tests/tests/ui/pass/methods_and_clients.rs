//! Inherent methods with every receiver, and every accepted client expression.
use std::sync::Arc;

use sage_lock::{LockClient, locked};

pub struct Service {
    pub locks: LockClient,
    pub shared: Arc<LockClient>,
    pub borrowed: &'static LockClient,
    pub tenant: String,
}

impl Service {
    #[locked(key = "a:{id}", wait = "2s", client = self.locks)]
    pub async fn by_ref(&self, id: u64) -> anyhow::Result<u64> {
        Ok(id)
    }

    #[locked(key = "b:{self.tenant}", wait = "2s", client = self.shared)]
    pub async fn by_mut(&mut self, tenant: String) -> anyhow::Result<()> {
        self.tenant = tenant;
        Ok(())
    }

    #[locked(key = "c", wait = "2s", client = self.borrowed)]
    pub async fn by_value(self) -> anyhow::Result<String> {
        Ok(self.tenant)
    }

    #[locked(key = "d", wait = "2s", client = &self.locks)]
    pub async fn boxed(self: Box<Self>) -> anyhow::Result<String> {
        Ok(self.tenant)
    }

    #[locked(key = "e", try_lock, client = Arc::clone(&self.shared))]
    pub async fn arc_self(self: Arc<Self>) -> anyhow::Result<Option<usize>> {
        Ok(self.tenant.len())
    }

    #[locked(key = "f:{id}", wait = "2s", client = self.locks)]
    pub async fn returns_self(&self, id: u64) -> anyhow::Result<Self> {
        let _ = id;
        Ok(Self {
            locks: self.locks.clone(),
            shared: Arc::clone(&self.shared),
            borrowed: self.borrowed,
            tenant: self.tenant.clone(),
        })
    }
}

fn main() {
    let _ = (
        Service::by_ref,
        Service::by_mut,
        Service::by_value,
        Service::boxed,
    );
    let _ = (Service::arc_self, Service::returns_self);
}
