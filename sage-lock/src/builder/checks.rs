//! The builder's numeric settings, checked before anything connects.

use std::time::Duration;

use crate::error::LockError;

/// Refuses a pool of no connections, a renewal call of no leases, and timeouts too short for
/// fred (which counts whole milliseconds), naming the setting.
pub(super) fn check_limits(
    max_connections: usize,
    renewal_batch_limit: usize,
    command_timeout: Duration,
    connect_timeout: Duration,
) -> Result<(), LockError> {
    if max_connections == 0 {
        return Err(LockError::invalid(
            "max_connections",
            "must be at least 1, got 0",
        ));
    }
    if renewal_batch_limit == 0 {
        return Err(LockError::invalid(
            "renewal_batch_limit",
            "must be at least 1 lease per renewal call, got 0",
        ));
    }
    // fred counts whole milliseconds: less would be no time at all.
    for (argument, timeout, example) in [
        ("command_timeout", command_timeout, "Duration::from_secs(5)"),
        (
            "connect_timeout",
            connect_timeout,
            "Duration::from_secs(10)",
        ),
    ] {
        if timeout < Duration::from_millis(1) {
            return Err(LockError::invalid(
                argument,
                format!("must be at least 1ms, e.g. {example}; got {timeout:?}"),
            ));
        }
    }
    Ok(())
}
