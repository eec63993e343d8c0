//! A dedicated connection on loan from the pool, the wrapper users borrow, and how a
//! connection is closed.

use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::ConnectHandle;
use tokio::sync::OwnedSemaphorePermit;

/// What a pooled connection owns besides its client: the task that drives it (aborted when the
/// connection is closed, so nothing keeps reconnecting) and its server-side `CLIENT ID`.
#[derive(Debug)]
pub(crate) struct Link {
    pub(super) task: Option<ConnectHandle>,
    /// `CLIENT ID` of the connection (not in a cluster, where a client has one per node).
    pub(crate) id: Option<i64>,
}

impl Link {
    pub(crate) fn new(task: Option<ConnectHandle>) -> Self {
        Link { task, id: None }
    }

    /// Whether the connection's task has ended: it was aborted, gave up, or the runtime it ran
    /// on shut down. The connection is then dead, whatever its client's state says.
    pub(super) fn ended(&self) -> bool {
        self.task.as_ref().is_some_and(ConnectHandle::is_finished)
    }
}

/// A dedicated connection on loan; give it back with [`DedicatedPool::put_back`](super::DedicatedPool::put_back) when it is known
/// to be idle, or drop it to close it (in the background).
#[derive(Debug)]
pub(crate) struct Loan {
    pub(crate) conn: Client,
    /// `None` once returned or closed.
    pub(super) link: Option<Link>,
    /// Frees the pool slot when the loan ends.
    pub(super) _permit: Option<OwnedSemaphorePermit>,
    /// The pool's generation when the loan began: a loan from before a
    /// [`DedicatedPool::discard_idle`](super::DedicatedPool::discard_idle) is closed, not returned.
    pub(super) generation: u64,
    /// The pool's count of unanswered loans, once this one is counted in it.
    pub(super) unanswered: Option<Arc<std::sync::atomic::AtomicUsize>>,
}

impl Loan {
    /// The connection's `CLIENT ID`, when known.
    pub(crate) fn client_id(&self) -> Option<i64> {
        self.link.as_ref().and_then(|link| link.id)
    }

    /// Closes the connection: `QUIT` (briefly), then its task is aborted.
    pub(crate) async fn close(mut self) {
        if let Some(link) = self.link.take() {
            close(self.conn.clone(), link).await;
        }
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        if let Some(link) = self.link.take() {
            close_in_background(self.conn.clone(), link);
        }
        if let Some(count) = self.unanswered.take() {
            count.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// A dedicated connection borrowed from a [`LockClient`](crate::LockClient)'s pool for blocking
/// work of your own (`WAIT`, `BLPOP`, `MULTI`/`EXEC`, ...). It counts against
/// `max_connections` together with replica-acknowledged lock operations. Dereferences to a fred
/// [`Client`].
///
/// Dropped, it is closed (in the background) and its slot freed at once: whatever you did on it
/// (a `SELECT`, an `AUTH` as another user, a name, an open `MULTI`, a blocking command still
/// running) never reaches lock operations, which connect afresh as the URL's user, in the URL's
/// database.
///
/// Through Sentinel it is a connection to the address the primary had when it was opened (not
/// resolved through the Sentinels again when it reconnects): after a failover, drop it and take
/// a new one, which reaches the new primary.
///
/// Borrowed with [`LockClient::dedicated_connection`](crate::LockClient::dedicated_connection)
/// (see its example).
#[derive(Debug)]
pub struct DedicatedConnection {
    /// Closes the connection and frees its slot when dropped.
    loan: Loan,
    conn: Client,
}

impl DedicatedConnection {
    pub(crate) fn new(loan: Loan) -> Self {
        DedicatedConnection {
            conn: loan.conn.clone(),
            loan,
        }
    }

    /// Closes the connection: the same as dropping it.
    pub fn discard(self) {
        drop(self.loan);
    }
}

impl std::ops::Deref for DedicatedConnection {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.conn
    }
}

/// `QUIT` (waiting at most a moment: a blocked connection answers late), then abort the task.
/// A connection whose task has ended (it never connected) has nothing to close: no `QUIT`,
/// which fred would only answer with a warning in the service's logs.
pub(super) async fn close(conn: Client, mut link: Link) {
    if link.task.as_ref().is_some_and(|task| !task.is_finished()) {
        let _ = tokio::time::timeout(Duration::from_millis(250), conn.quit()).await;
    }
    if let Some(task) = link.task.take() {
        task.abort();
    }
}

/// Closes a connection whose state is unknown (e.g. a `WAIT` may still block it); without a
/// runtime, its task is aborted at once.
pub(crate) fn close_in_background(conn: Client, mut link: Link) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(close(conn, link));
        }
        Err(_) => {
            if let Some(task) = link.task.take() {
                task.abort();
            }
        }
    }
}
