//! Release notifications over sharded pub/sub.
//!
//! When a lock whose waiters queue on the server is released, the release script hands the lock
//! to the head of the queue and publishes `token:fence:ms` (the new owner's token, its fencing
//! token and the hand-off lease in ms; releases of earlier versions publish `token:fence`) on the
//! lock's channel `{ns:key}:released` (`SPUBLISH`, in the key's own hash slot, so
//! a cluster delivers it within one shard). One subscriber connection per client, opened on
//! first need, multiplexes the channels of every key this process waits on; the waiting task
//! named by a message takes the [`Grant`] at once instead of finding it at its next poll.
//! Subscriptions outlive their last waiter by [`LINGER`](channels::LINGER) (so steady
//! contention does not pay a subscribe per wait), then are dropped: they stay bounded by the keys
//! waited on.
//!
//! Inside: [`message`] is the wire format, `channels` who watches what, `listener` the
//! subscriber connection's task.
//!
//! The semaphore and the read-write lock publish on a channel of their own
//! (`Rules::release_announcement`), the same `token:fence:ms` for each waiter their release
//! hands over to, or an empty message, which wakes the channel's waiter whoever it is (the
//! readers a release does not name). A bare `token` names a waiter without a grant: it tries
//! again at once (a multi-key caller, which a release never hands one key alone, and which
//! watches the channel of each of its keys).
//!
//! Notifications are an optimisation, never needed for correctness: waiters keep polling at a
//! bounded interval, so a message lost to a reconnect, a failover or a missing ACL permission
//! costs at most one poll. After the subscriber reconnects, it subscribes again and wakes every
//! waiter once (releases may have slipped past while it was away).

mod channels;
mod listener;
mod message;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::clients::Client;
use fred::interfaces::{ClientLike, PubsubInterface};
use fred::types::config::ReconnectPolicy;
use tokio::sync::Notify;
use tokio::time::Instant;

use channels::{
    Channel, Shared, Watcher, deliver, denied_until, forget_subscriptions, is_subscribed,
    mark_requested, named_recently,
};
use listener::spawn_listener;
pub(crate) use message::{Grant, channel};

/// How long a channel whose `SSUBSCRIBE` an ACL denied is left unasked (its waiters poll).
const DENIAL_BACKOFF: Duration = Duration::from_secs(30);

/// How many releases found by polling, with no message in between, make the subscriber
/// connection reconnect (see [`Watch::missed_release`]).
const MISSES_BEFORE_RECONNECT: u32 = 2;

/// One client's subscriber connection and the channels its waiters watch.
#[derive(Debug)]
pub(crate) struct Notifier {
    /// The client whose configuration the subscriber copies.
    template: Client,
    shared: Arc<Shared>,
    /// The subscriber connection while it lives: opened on first need, and opened again when
    /// its tasks ended (the runtime that ran them shut down, as each `#[tokio::test]`'s does).
    /// Shared with the task opening it, which puts it here.
    subscriber: Arc<std::sync::Mutex<Option<Subscriber>>>,
    /// The task opening a subscriber connection, while one does: one at a time. It outlives the
    /// waiter that started it (a waiter gives it a second at most), so on a slow link the next
    /// waiter finds the connection open; it gives up after the client's connect timeout.
    opening: tokio::sync::Mutex<Option<Opening>>,
    /// Set by [`Notifier::close`] (and on drop): no subscriber connection is kept afterwards.
    closed: Arc<AtomicBool>,
}

/// A task opening the subscriber connection; aborted (which closes the connection it was
/// opening) when dropped before it ends.
#[derive(Debug)]
struct Opening(tokio::task::JoinHandle<()>);

impl Drop for Opening {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A subscriber connection and the tasks that drive it and read its messages.
#[derive(Debug)]
struct Subscriber {
    client: Client,
    connection: fred::types::ConnectHandle,
    listener: tokio::task::JoinHandle<()>,
}

impl Drop for Subscriber {
    /// However it goes (closed, replaced, or dropped with a task cut short), its tasks end with
    /// it: left running, the connection would reconnect for the life of the process.
    fn drop(&mut self) {
        self.listener.abort();
        self.connection.abort();
    }
}

impl Subscriber {
    /// Whether its tasks still run (they end with their runtime, or when the connection
    /// gave up reconnecting).
    fn is_alive(&self) -> bool {
        !self.connection.is_finished() && !self.listener.is_finished()
    }
}

/// Whether a watch's channel is subscribed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subscribed {
    /// It was before this call: no release can have slipped past unnoticed.
    Already,
    /// Just now: a release may have happened before, so try again once.
    New,
    /// Notifications are unavailable (connection, ACL, server version): poll.
    Unavailable,
}

impl Notifier {
    /// A notifier whose subscriber connection copies `template`'s configuration.
    pub(crate) fn new(template: Client) -> Self {
        Notifier {
            template,
            shared: Arc::default(),
            subscriber: Arc::default(),
            opening: tokio::sync::Mutex::new(None),
            closed: Arc::default(),
        }
    }

    /// Watches the release channel of `lock_key` on behalf of the local waiter with `token`.
    pub(crate) fn watch(&self, lock_key: &[u8], token: Bytes) -> Watch<'_> {
        let channel = channel(lock_key);
        let wake = Arc::new(Notify::new());
        if let Ok(mut channels) = self.shared.channels.lock() {
            let entry = channels.entry(channel.clone()).or_insert_with(|| Channel {
                watchers: Vec::new(),
                recent: std::collections::VecDeque::new(),
                subscribed: false,
                requested: false,
                idle_since: Instant::now(),
                denied_until: None,
            });
            let mut grant = None;
            if let Some(named) = named_recently(entry, &token) {
                grant = named;
                wake.notify_one();
            }
            entry.watchers.push(Watcher {
                token: token.clone(),
                wake: Arc::clone(&wake),
                grant,
            });
        }
        Watch {
            notifier: self,
            channel,
            wake,
        }
    }

    /// A release by this process named `head` as the next owner of `lock_key` (and handed it
    /// `grant`): wakes it now if it is this process's waiter (the message that follows is then
    /// skipped as a duplicate).
    pub(crate) fn wake_local(&self, lock_key: &[u8], head: &[u8], grant: Option<Grant>) {
        deliver(&self.shared, &channel(lock_key), head, grant);
    }

    /// Closes the subscriber connection, if one was opened; none is opened afterwards.
    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        // A connection still being opened is abandoned (and closed with its task).
        self.opening.lock().await.take();
        let live = self.subscriber.lock().ok().and_then(|mut s| s.take());
        if let Some(subscriber) = live {
            let _ = tokio::time::timeout(Duration::from_secs(1), subscriber.client.quit()).await;
        }
    }

    /// The subscriber connection, if it is open and its tasks still run.
    fn live_subscriber(&self) -> Option<Client> {
        let live = self.subscriber.lock().ok()?;
        live.as_ref()
            .filter(|s| s.is_alive())
            .map(|s| s.client.clone())
    }

    /// How many channels are tracked (subscribed or lingering), for tests.
    pub(crate) fn tracked(&self) -> usize {
        self.shared.channels.lock().map_or(0, |c| c.len())
    }

    /// How many local waiters watch a channel, for tests.
    pub(crate) fn watchers(&self) -> usize {
        self.shared
            .channels
            .lock()
            .map_or(0, |c| c.values().map(|e| e.watchers.len()).sum())
    }

    /// The live subscriber connection, opened (again) if needed; `None` when it is not open by
    /// `deadline` (notifications are then unavailable for now: waiters poll). An opening that
    /// `deadline` cuts short goes on in the background, for the next waiter.
    async fn subscriber(&self, deadline: Instant) -> Option<Client> {
        if let Some(client) = self.live_subscriber() {
            return Some(client);
        }
        let mut opening = tokio::time::timeout_at(deadline, self.opening.lock())
            .await
            .ok()?;
        loop {
            if let Some(client) = self.live_subscriber() {
                return Some(client);
            }
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            let Some(task) = opening.as_mut() else {
                // A subscriber whose tasks ended took its subscriptions with it.
                if let Some(dead) = self.subscriber.lock().ok().and_then(|mut s| s.take()) {
                    tracing::debug!("the subscriber connection's tasks ended; opening another");
                    drop(dead);
                    forget_subscriptions(&self.shared);
                }
                *opening = Some(Opening(tokio::spawn(open_subscriber(
                    self.template.clone(),
                    Arc::clone(&self.shared),
                    Arc::clone(&self.subscriber),
                    Arc::clone(&self.closed),
                ))));
                continue;
            };
            let ended = tokio::time::timeout_at(deadline, &mut task.0).await.ok()?;
            opening.take();
            if ended.is_ok() {
                // Opened, or failed within its budget (the next waiter tries again).
                return self.live_subscriber();
            }
            // Its runtime shut down before it ended: open another in this one.
        }
    }
}

/// Opens a subscriber connection copying `template`'s configuration, within the template's
/// connect timeout, and puts it in `slot`, unless the notifier was closed meanwhile (the
/// connection is then closed).
async fn open_subscriber(
    template: Client,
    shared: Arc<Shared>,
    slot: Arc<std::sync::Mutex<Option<Subscriber>>>,
    closed: Arc<AtomicBool>,
) {
    let policy = template
        .client_reconnect_policy()
        .unwrap_or_else(|| ReconnectPolicy::new_exponential(0, 20, 1_000, 2));
    let mut perf = template.perf_config();
    // A burst of releases must not overflow the message channel.
    perf.broadcast_channel_capacity = perf.broadcast_channel_capacity.max(1024);
    let budget = template
        .connection_config()
        .connection_timeout
        .max(Duration::from_secs(1));
    let client = Client::new(
        template.client_config(),
        Some(perf),
        Some(template.connection_config().clone()),
        Some(policy),
    );
    // Given up (or aborted with this task), the connection task is aborted too: left running,
    // it would connect and reconnect in the background for the life of the process, a
    // connection that `close` never reaches.
    let mut task = AbortOnDrop(Some(client.connect()));
    match tokio::time::timeout(budget, client.wait_for_connect()).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::debug!(%error, "no subscriber connection; waiters poll");
            let _ = tokio::time::timeout(Duration::from_secs(1), client.quit()).await;
            return;
        }
        Err(_) => {
            tracing::debug!(
                ?budget,
                "no subscriber connection within the connect timeout; waiters poll"
            );
            return;
        }
    }
    let Some(connection) = task.0.take() else {
        return;
    };
    // Listening starts after the initial connection (which fred also reports as a reconnect)
    // and before any subscription.
    let listener = spawn_listener(&client, Arc::downgrade(&shared));
    let subscriber = Subscriber {
        client,
        connection,
        listener,
    };
    // Checked under the slot's lock, which `close` takes after setting the flag: either it
    // finds this subscriber there, or this finds the flag set.
    let refused = match slot.lock() {
        Ok(mut live) if !closed.load(Ordering::Acquire) => {
            *live = Some(subscriber);
            None
        }
        _ => Some(subscriber),
    };
    if let Some(subscriber) = refused {
        let _ = tokio::time::timeout(Duration::from_secs(1), subscriber.client.quit()).await;
    }
}

impl Drop for Notifier {
    /// The client is gone without [`Notifier::close`]: the subscriber connection closes too
    /// (left to its task, it would stay open, reconnecting, for the life of the process).
    fn drop(&mut self) {
        // Set first: an opening task that ends now closes its connection instead of keeping it.
        self.closed.store(true, Ordering::Release);
        self.opening.get_mut().take();
        // Its tasks end with it.
        drop(self.subscriber.lock().ok().and_then(|mut s| s.take()));
    }
}

/// A connection task that is aborted when this is dropped while it still holds it.
struct AbortOnDrop(Option<fred::types::ConnectHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// One local waiter's interest in a key's release channel; dropped, it lets the channel linger
/// and then be unsubscribed.
#[derive(Debug)]
pub(crate) struct Watch<'a> {
    notifier: &'a Notifier,
    channel: Bytes,
    /// This watch's own (identifies its [`Watcher`]).
    wake: Arc<Notify>,
}

impl Watch<'_> {
    /// Makes sure the channel is subscribed, spending at most until `deadline`.
    pub(crate) async fn subscribe(&self, deadline: Instant) -> Subscribed {
        let shared = &self.notifier.shared;
        if is_subscribed(shared, &self.channel) && self.notifier.live_subscriber().is_some() {
            return Subscribed::Already;
        }
        if denied_until(shared, &self.channel).is_some_and(|until| Instant::now() < until) {
            // Denied by the ACL a moment ago: poll, without asking again on every attempt.
            return Subscribed::Unavailable;
        }
        let Some(subscriber) = self.notifier.subscriber(deadline).await else {
            return Subscribed::Unavailable;
        };
        // Before it is sent: dropped (cancelled) or cut short below, this watch may leave the
        // server subscribed.
        mark_requested(shared, &self.channel);
        let subscribe = subscriber.ssubscribe(self.channel.clone());
        match tokio::time::timeout_at(deadline, subscribe).await {
            Ok(Ok(())) => {
                if let Ok(mut channels) = shared.channels.lock()
                    && let Some(entry) = channels.get_mut(&self.channel)
                {
                    entry.subscribed = true;
                }
                Subscribed::New
            }
            Ok(Err(error)) => {
                if error.details().starts_with("NOPERM") {
                    self.denied(&error);
                } else {
                    tracing::debug!(%error, "SSUBSCRIBE failed; waiters poll");
                }
                Subscribed::Unavailable
            }
            Err(_) => Subscribed::Unavailable,
        }
    }

    /// An ACL denied the channel's `SSUBSCRIBE`: its waiters poll, and it is not asked again
    /// for [`DENIAL_BACKOFF`]; the first denial of the client is warned about.
    fn denied(&self, error: &fred::error::Error) {
        let shared = &self.notifier.shared;
        if let Ok(mut channels) = shared.channels.lock()
            && let Some(entry) = channels.get_mut(&self.channel)
        {
            entry.denied_until = Some(Instant::now() + DENIAL_BACKOFF);
        }
        if shared.denied.swap(true, Ordering::AcqRel) {
            tracing::debug!(%error, "SSUBSCRIBE denied; waiters poll");
        } else {
            tracing::warn!(
                channel = %String::from_utf8_lossy(&self.channel),
                %error,
                "the ACL denies SSUBSCRIBE on this client's release channels: its waiters \
                 poll (a hand-off reaches them up to 500 ms later) instead of being woken by \
                 releases; grant +ssubscribe and the channels &{{NAMESPACE:*}}:released (see the \
                 README's \"Security: TLS and ACL\")"
            );
        }
    }

    /// A release this watch should have heard of was found by a poll instead: the server may
    /// have dropped the subscription (a slot that moved to another node unsubscribes its shard
    /// channels, and fred does not pass that on). The next watch subscribes the channel again,
    /// which is harmless if it was not dropped. After [`MISSES_BEFORE_RECONNECT`] such releases
    /// with no message in between, the subscriber connection itself may be on the wrong node
    /// (a Sentinel's demoted primary): it reconnects, to the current primary, and subscribes
    /// every watched channel again.
    pub(crate) fn missed_release(&self) {
        let shared = &self.notifier.shared;
        if let Ok(mut channels) = shared.channels.lock()
            && let Some(entry) = channels.get_mut(&self.channel)
        {
            entry.subscribed = false;
        }
        let missed = shared.missed.fetch_add(1, Ordering::Relaxed) + 1;
        if missed < MISSES_BEFORE_RECONNECT {
            return;
        }
        shared.missed.store(0, Ordering::Relaxed);
        let (Some(subscriber), Ok(runtime)) = (
            self.notifier.live_subscriber(),
            tokio::runtime::Handle::try_current(),
        ) else {
            return;
        };
        tracing::debug!(
            missed,
            "waiters found releases by polling: reconnecting the subscriber connection"
        );
        runtime.spawn(async move {
            let _ =
                tokio::time::timeout(Duration::from_secs(5), subscriber.force_reconnection()).await;
        });
    }

    /// Resolves when a release names this waiter as the next owner (or a permit is stored).
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.wake.notified()
    }

    /// The grant a release handed to this waiter since the last call, if any.
    pub(crate) fn take_grant(&self) -> Option<Grant> {
        let mut channels = self.notifier.shared.channels.lock().ok()?;
        let entry = channels.get_mut(&self.channel)?;
        entry
            .watchers
            .iter_mut()
            .find(|w| Arc::ptr_eq(&w.wake, &self.wake))?
            .grant
            .take()
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if let Ok(mut channels) = self.notifier.shared.channels.lock()
            && let Some(entry) = channels.get_mut(&self.channel)
        {
            entry.watchers.retain(|w| !Arc::ptr_eq(&w.wake, &self.wake));
            if entry.watchers.is_empty() {
                entry.idle_since = Instant::now();
                // Never subscribed: nothing to linger for, or to unsubscribe. One that may be
                // (even unconfirmed) lingers until the listener's sweep unsubscribes it.
                if !entry.subscribed && !entry.requested {
                    channels.remove(&self.channel);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
