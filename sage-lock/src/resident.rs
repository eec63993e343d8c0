//! What a client keeps in memory for keys, waiters, channels and holds, counted: for tests that
//! a long-running service's bookkeeping goes back to empty once it is idle. Not a public API
//! (reached through `sage_lock::__private`).

use crate::client::LockClient;

/// How many records of each kind one client keeps right now (see [`resident`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resident {
    /// Keys with local waiters (the engine's waiter map).
    pub waiter_keys: usize,
    /// Release channels tracked by the notifier (watched, or lingering before `SUNSUBSCRIBE`).
    pub channels: usize,
    /// Local waiters watching a release channel.
    pub watchers: usize,
    /// Leases registered with the renewer.
    pub renewals: usize,
    /// Of those, the ones queued for their next renewal.
    pub renewal_queue: usize,
    /// Releases under way (cancelled holders' background releases included).
    pub releases: usize,
    /// Idle connections in the dedicated pool (at most `max_connections`).
    pub idle_connections: usize,
    /// Keys whose last fencing token is remembered (at most 8,192: best-effort detection).
    pub fenced_keys: usize,
}

impl Resident {
    /// The same counts without the bounded caches (idle connections, remembered fencing
    /// tokens), which a client keeps by design: all zero once nothing is held or waited for
    /// and lingering channels are dropped.
    #[must_use]
    pub fn per_use(self) -> Resident {
        Resident {
            idle_connections: 0,
            fenced_keys: 0,
            ..self
        }
    }
}

/// The records `client` keeps right now.
#[must_use]
pub fn resident(client: &LockClient) -> Resident {
    let engine = &client.inner;
    let (renewals, renewal_queue) = engine.renewer.registered();
    Resident {
        waiter_keys: engine.waiters.keys(),
        channels: engine.notifier.tracked(),
        watchers: engine.notifier.watchers(),
        renewals,
        renewal_queue,
        releases: engine.releases.under_way(),
        idle_connections: engine.conn.pool.idle(),
        fenced_keys: engine.fences.remembered(),
    }
}
