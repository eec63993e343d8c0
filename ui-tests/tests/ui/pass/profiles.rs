//! `profile = "..."`: no `wait` needed (it may come from the profile), arguments written in the
//! attribute override the profile, in every mode and on methods; the profiles named here are
//! registered for `check_profiles`.
use sage_lock::{LockClient, global, locked};

#[locked(profile = "account-updates", key = "account:{id}")]
async fn from_profile(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

#[locked(key = "a", profile = "reports.daily", lease = "10s", wait = "2s", namespace = "n", replica_ack = false)]
async fn overridden() -> anyhow::Result<()> {
    Ok(())
}

#[locked(profile = "jobs_v2", key = "job:{name}", try_lock)]
async fn job(name: &str) -> anyhow::Result<Option<usize>> {
    Ok(name.len())
}

struct Service {
    locks: LockClient,
}

impl Service {
    #[locked(profile = "account-updates", key = "svc:{id}", client = self.locks)]
    async fn method(&self, id: u64) -> anyhow::Result<u64> {
        Ok(id)
    }
}

fn main() {
    drop(from_profile(1));
    drop(overridden());
    drop(job("x"));
    let _ = Service::method;
    // Nothing installed: every profile named above is missing.
    let message = global::check_profiles().expect_err("no profiles installed").to_string();
    for name in ["account-updates", "reports.daily", "jobs_v2"] {
        assert!(message.contains(&format!("{name:?} (used by")), "{message}");
    }
}
