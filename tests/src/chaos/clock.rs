//! The machine's monotonic clock (`CLOCK_MONOTONIC`), comparable across processes.
//!
//! `std::time::Instant` reads the same clock but cannot be written to a file and read back by
//! another process, so histories store these nanosecond readings instead.

use std::time::Duration;

/// Nanoseconds of `CLOCK_MONOTONIC` (since boot, excluding suspend).
pub fn now_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// A duration in nanoseconds.
pub fn ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Nanoseconds as milliseconds, for messages.
pub fn as_ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}
