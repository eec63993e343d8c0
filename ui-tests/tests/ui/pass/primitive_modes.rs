//! `mode = "read" | "write"`, `permits = N` and `key = [..]`, waiting and with `try_lock`;
//! their futures are `Send`.
use sage_lock::locked;

#[locked(key = "report:{id}", wait = "2s", mode = "read")]
async fn read_report(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

#[locked(key = "report:{id}", try_lock, mode = "write", lease = "10s")]
async fn rebuild_report(id: u64) -> anyhow::Result<Option<u64>> {
    Ok(id)
}

#[locked(key = "export", wait = "1m", permits = 4)]
async fn export() -> anyhow::Result<()> {
    Ok(())
}

#[locked(key = "crawl", try_lock, permits = 1, namespace = "crawlers")]
async fn crawl() -> anyhow::Result<Option<()>> {
    Ok(())
}

#[locked(key = ["account:{from}", "account:{to}", audit], wait = "2s")]
async fn transfer(from: u64, to: u64, audit: &str) -> anyhow::Result<u64> {
    Ok(from + to + audit.len() as u64)
}

#[locked(key = [(from, to)], try_lock)]
async fn pair(from: u64, to: u64) -> anyhow::Result<Option<u64>> {
    Ok(from + to)
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

fn main() {
    drop(assert_send(read_report(1)));
    drop(assert_send(rebuild_report(1)));
    drop(assert_send(export()));
    drop(assert_send(crawl()));
    drop(assert_send(transfer(1, 2, "x")));
    drop(assert_send(pair(1, 2)));
}
