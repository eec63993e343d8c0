//! The bounded pool of dedicated connections.
//!
//! `WAIT` blocks the connection it runs on, so replica-acknowledged lock operations never use the
//! shared, auto-pipelined connection. They borrow one of at most `max_connections` dedicated
//! connections instead, created lazily. Time spent waiting for a free one counts against the
//! caller's deadline (the acquisition wait or the usable lease).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::retry::remaining;

/// Why no dedicated connection could be had.
#[derive(Debug)]
pub(crate) enum PoolError {
    /// Every connection stayed busy until the deadline.
    Exhausted,
    /// A new connection failed to connect.
    Connect(fred::error::Error),
}

/// A bounded set of exclusive connections, cloned from the shared client's configuration.
#[derive(Debug)]
pub(crate) struct DedicatedPool {
    template: Client,
    permits: Arc<Semaphore>,
    idle: Mutex<Vec<Client>>,
    max_connections: usize,
    generation: std::sync::atomic::AtomicU64,
}

/// A dedicated connection on loan; give it back with [`DedicatedPool::put_back`] when it is known
/// to be idle, or drop it to close it.
#[derive(Debug)]
pub(crate) struct Loan {
    pub(crate) conn: Client,
    /// Frees the pool slot when the loan ends.
    _permit: OwnedSemaphorePermit,
    /// The pool's generation when the loan began: a loan from before a
    /// [`DedicatedPool::discard_idle`] is closed, not returned.
    generation: u64,
}

impl DedicatedPool {
    pub(crate) fn new(template: Client, max_connections: usize) -> Self {
        DedicatedPool {
            template,
            permits: Arc::new(Semaphore::new(max_connections)),
            idle: Mutex::new(Vec::new()),
            max_connections,
            generation: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(crate) fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// Borrows a connection, waiting for a free slot and connecting a new one if needed, all
    /// before `deadline`.
    pub(crate) async fn take(&self, deadline: Instant) -> Result<Loan, PoolError> {
        let permit =
            tokio::time::timeout_at(deadline, Arc::clone(&self.permits).acquire_owned()).await;
        let Ok(Ok(permit)) = permit else {
            return Err(PoolError::Exhausted);
        };
        let reused = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        if let Some(conn) = reused {
            if conn.is_connected() {
                return Ok(Loan {
                    conn,
                    _permit: permit,
                    generation: self.generation(),
                });
            }
            close_in_background(conn);
        }
        let conn = self.template.clone_new();
        let connect_time = remaining(deadline).max(Duration::from_millis(1));
        match tokio::time::timeout(connect_time, conn.init()).await {
            Ok(Ok(_task)) => Ok(Loan {
                conn,
                _permit: permit,
                generation: self.generation(),
            }),
            Ok(Err(error)) => Err(PoolError::Connect(error)),
            Err(_) => {
                close_in_background(conn);
                Err(PoolError::Exhausted)
            }
        }
    }

    /// Returns an idle, healthy connection for reuse.
    pub(crate) fn put_back(&self, loan: Loan) {
        let Loan {
            conn,
            _permit,
            generation,
        } = loan;
        if generation != self.generation() {
            close_in_background(conn);
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
    }

    fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Closes idle connections in the background, so the next loans connect afresh (after a
    /// failover, idle connections may still point at the old primary).
    pub(crate) fn discard_idle(&self) {
        // Loans out now were taken before this: they are closed when they come back.
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        for conn in self.take_idle() {
            close_in_background(conn);
        }
    }

    fn take_idle(&self) -> Vec<Client> {
        self.idle
            .lock()
            .map(|mut idle| std::mem::take(&mut *idle))
            .unwrap_or_default()
    }

    /// Closes idle connections.
    pub(crate) async fn close(&self) {
        for conn in self.take_idle() {
            let _ = tokio::time::timeout(Duration::from_secs(1), conn.quit()).await;
        }
    }
}

/// A dedicated connection borrowed from a [`LockClient`](crate::LockClient)'s pool for blocking
/// work of your own (`WAIT`, `BLPOP`, `MULTI`/`EXEC`, ...). It counts against
/// `max_connections` together with replica-acknowledged lock operations, and goes back to the
/// pool when dropped. Dereferences to a fred [`Client`].
///
/// Leave it idle before dropping it: a connection dropped while a blocking command is still
/// running should be closed instead, with [`DedicatedConnection::discard`].
///
/// Borrowed with [`LockClient::dedicated_connection`](crate::LockClient::dedicated_connection)
/// (see its example).
#[derive(Debug)]
pub struct DedicatedConnection {
    conn: Client,
    /// The pool slot; `None` once discarded.
    permit: Option<OwnedSemaphorePermit>,
    generation: u64,
    pool: std::sync::Weak<DedicatedPool>,
}

impl DedicatedConnection {
    pub(crate) fn new(loan: Loan, pool: std::sync::Weak<DedicatedPool>) -> Self {
        DedicatedConnection {
            conn: loan.conn,
            permit: Some(loan._permit),
            generation: loan.generation,
            pool,
        }
    }

    /// Closes the connection instead of returning it to the pool.
    pub fn discard(mut self) {
        self.permit = None;
        close_in_background(self.conn.clone());
    }
}

impl std::ops::Deref for DedicatedConnection {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.conn
    }
}

impl Drop for DedicatedConnection {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        match self.pool.upgrade() {
            Some(pool) if self.conn.is_connected() => {
                pool.put_back(Loan {
                    conn: self.conn.clone(),
                    _permit: permit,
                    generation: self.generation,
                });
            }
            _ => close_in_background(self.conn.clone()),
        }
    }
}

/// Closes a connection whose state is unknown (e.g. a `WAIT` may still block it).
pub(crate) fn close_in_background(conn: Client) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(1), conn.quit()).await;
        });
    }
}
