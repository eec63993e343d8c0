//! New dedicated connections that finish connecting after their caller gave up.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::time::Instant;

use super::{DedicatedPool, Loan, is_replica};

/// How long a new connection may go on connecting after its caller gave up: a connect takes a
/// few round trips (about 600 ms at 200 ms round trips), and a node that takes longer is more
/// likely frozen, whose replacement must find the pool's slots free soon.
const BACKGROUND_CONNECT: Duration = Duration::from_secs(1);

impl DedicatedPool {
    /// Lets `loan`, a new connection its caller's deadline cut while it connected, go on
    /// connecting in the background (for a moment) and then join the idle
    /// connections. Until then it keeps its slot and counts as unanswered (see
    /// [`DedicatedPool::mark_unanswered`]). So waits shorter than a connect (long round trips)
    /// grow the pool instead of opening and dropping a connection each: audit 52, at 200 ms
    /// round trips, saw every such wait open a connection that none used, while renewals found
    /// no idle one and lost their leases. A connection that fails or times out is closed, as is
    /// one (through Sentinel) that reached a replica.
    ///
    /// It gives up after [`BACKGROUND_CONNECT`], or once the pool forgets its idle connections:
    /// a frozen primary never finishes a connect, and its replacement must find slots free.
    pub(super) fn finish_in_background(self: &Arc<Self>, mut loan: Loan) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // dropping the loan aborts its connection
        };
        self.mark_unanswered(&mut loan);
        let pool = Arc::clone(self);
        let until = Instant::now()
            + self
                .template
                .connection_config()
                .connection_timeout
                .min(BACKGROUND_CONNECT);
        runtime.spawn(async move {
            if !connected(&pool, &loan, until).await
                || (pool.route.is_some() && is_replica(&loan.conn, until).await)
            {
                if let Some(task) = loan.link.as_mut().and_then(|link| link.task.take()) {
                    task.abort();
                }
                return;
            }
            if !loan.conn.is_clustered() {
                let id = tokio::time::timeout_at(
                    until,
                    loan.conn.custom::<Value, Value>(
                        CustomCommand::new_static("CLIENT", ClusterHash::FirstKey, false),
                        vec![Value::from("ID")],
                    ),
                )
                .await;
                match (id, loan.link.as_mut()) {
                    (Ok(Ok(id)), Some(link)) => link.id = id.as_i64(),
                    // Unanswered: its state is unknown, so it is closed (dropped).
                    _ => return,
                }
            }
            pool.put_back(loan);
        });
    }
}

/// Whether `loan`'s connection connects before `until` (or the pool closes, its task ends, or
/// the pool forgets its idle connections: a failover may be under way, and the slot is needed
/// for one to the new primary).
async fn connected(pool: &DedicatedPool, loan: &Loan, until: Instant) -> bool {
    loop {
        if loan.conn.is_connected() {
            return true;
        }
        let ended = loan.link.as_ref().is_none_or(super::Link::ended);
        let forgotten = loan.generation != pool.generation();
        if ended || forgotten || pool.is_closed() || Instant::now() >= until {
            return false;
        }
        // Checked again at least every 50 ms: the notification may come before this listens.
        let _ = tokio::time::timeout(Duration::from_millis(50), loan.conn.wait_for_connect()).await;
    }
}
