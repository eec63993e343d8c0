use sage_lock::locked;

#[locked(key = "nightly-report", try_lock, hold_at_least = "9000h")]
async fn nightly_report() -> anyhow::Result<Option<()>> {
    Ok(())
}

fn main() {}
