//! The subscriber connection's task: it reads release messages and wakes the waiters they name,
//! subscribes again after a reconnect, and drops channels that lingered idle (in a task beside
//! it, so that a long sweep holds up no message).

use std::sync::{Arc, Weak};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::clients::Client;
use fred::interfaces::{EventInterface, PubsubInterface};
use tokio::task::JoinHandle;

use super::channels::{LINGER, Shared, connection_reset, deliver, mark_requested, wake_all};
use super::message::parse_message;

/// Reads messages and reconnects of `client` until it closes or the notifier is gone; drops
/// channels that lingered idle.
pub(super) fn spawn_listener(client: &Client, shared: Weak<Shared>) -> JoinHandle<()> {
    let mut messages = client.message_rx();
    let mut reconnects = client.reconnect_rx();
    let client = client.clone();
    tokio::spawn(async move {
        let mut sweep = tokio::time::interval(LINGER / 2);
        // The sweep under way, beside the reading of messages (dropped with this task, it is
        // aborted): thousands of `SUNSUBSCRIBE`s must not hold up a release message.
        let mut sweeping = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                message = messages.recv() => match message {
                    Ok(message) => {
                        let Some(shared) = shared.upgrade() else { return };
                        deliver_message(&shared, message.channel.as_bytes(), &message.value);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        let Some(shared) = shared.upgrade() else { return };
                        wake_all(&shared);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                reconnect = reconnects.recv() => {
                    if matches!(reconnect, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                        return;
                    }
                    let Some(shared) = shared.upgrade() else { return };
                    resubscribe(&client, &shared).await;
                }
                _ = sweep.tick() => {
                    while sweeping.try_join_next().is_some() {}
                    if !sweeping.is_empty() {
                        // The last sweep is not through: it goes on, no second one beside it.
                        continue;
                    }
                    let Some(shared) = shared.upgrade() else { return };
                    let client = client.clone();
                    sweeping.spawn(async move { unsubscribe_idle(&client, &shared).await });
                }
            }
        }
    })
}

pub(super) fn deliver_message(shared: &Shared, channel: &[u8], payload: &fred::types::Value) {
    // Messages reach this connection: the releases polls found were not lost to it.
    shared.missed.store(0, std::sync::atomic::Ordering::Relaxed);
    if let Some(payload) = payload.as_bytes() {
        let (head, grant) = parse_message(payload);
        deliver(shared, channel, head, grant);
    }
}

/// How many `SSUBSCRIBE`s a resubscription after a reconnect keeps in flight at once.
const RESUBSCRIBE_IN_FLIGHT: usize = 256;

/// After a reconnect the server has forgotten the subscriptions: subscribe again the channels
/// waiters watch (one command per channel, which stays valid if slots moved; up to
/// [`RESUBSCRIBE_IN_FLIGHT`] at once, not one round trip after another) and wake every waiter
/// once. Idle channels are left to linger and be unsubscribed (see [`connection_reset`]).
async fn resubscribe(client: &Client, shared: &Arc<Shared>) {
    connection_reset(shared);
    let channels: Vec<Bytes> = match shared.channels.lock() {
        Ok(channels) => channels
            .iter()
            .filter(|(_, e)| !e.watchers.is_empty())
            .map(|(name, _)| name.clone())
            .collect(),
        Err(_) => return,
    };
    // Dropped with this task (the subscriber closed), the set aborts what is still in flight.
    let mut in_flight = tokio::task::JoinSet::new();
    for channel in channels {
        if in_flight.len() >= RESUBSCRIBE_IN_FLIGHT {
            in_flight.join_next().await;
        }
        let (client, shared) = (client.clone(), Arc::clone(shared));
        in_flight.spawn(async move { resubscribe_one(&client, &shared, channel).await });
    }
    while in_flight.join_next().await.is_some() {}
}

/// Unsubscribes the channels idle for [`LINGER`], one at a time. A channel leaves the records
/// only once its `SUNSUBSCRIBE` is answered, and only if no waiter came for it meanwhile: such a
/// waiter found it subscribed and relies on that, so it is subscribed again and its waiters are
/// woken to try again (a release may have slipped past in between).
async fn unsubscribe_idle(client: &Client, shared: &Shared) {
    let idle: Vec<Bytes> = match shared.channels.lock() {
        Ok(channels) => channels
            .iter()
            .filter(|(_, e)| e.watchers.is_empty() && e.idle_since.elapsed() >= LINGER)
            .map(|(name, _)| name.clone())
            .collect(),
        Err(_) => return,
    };
    for channel in idle {
        let answer =
            tokio::time::timeout(Duration::from_secs(1), client.sunsubscribe(channel.clone()))
                .await;
        // Unanswered (the connection is down or slow), the channel stays for the next sweep:
        // the server may still hold the subscription. Refused, it never will.
        let done = match answer {
            Ok(Ok(())) => true,
            Ok(Err(error)) => !connection_failure(&error),
            Err(_) => false,
        };
        let revived = match shared.channels.lock() {
            Ok(mut channels) => match channels.get_mut(&channel) {
                Some(entry) if entry.watchers.is_empty() => {
                    if done {
                        channels.remove(&channel);
                    }
                    false
                }
                // The unsubscription may have reached the server either way.
                Some(entry) => {
                    entry.subscribed = false;
                    true
                }
                None => false,
            },
            Err(_) => false,
        };
        if revived {
            resubscribe_one(client, shared, channel).await;
        }
        if !done {
            // The rest would wait as long: they wait for the next sweep.
            break;
        }
    }
}

/// Whether `error` says the command may not have reached the server (rather than that the
/// server refused it).
fn connection_failure(error: &fred::error::Error) -> bool {
    use fred::error::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::IO | ErrorKind::Timeout | ErrorKind::Canceled | ErrorKind::Routing
    )
}

/// Subscribes `channel` again for its waiters (after a reconnect, or when they came while it
/// was being unsubscribed) and wakes them: a release may have slipped past meanwhile.
async fn resubscribe_one(client: &Client, shared: &Shared, channel: Bytes) {
    mark_requested(shared, &channel);
    let ok = matches!(
        tokio::time::timeout(Duration::from_secs(1), client.ssubscribe(channel.clone())).await,
        Ok(Ok(()))
    );
    if let Ok(mut channels) = shared.channels.lock()
        && let Some(entry) = channels.get_mut(&channel)
    {
        entry.subscribed = ok;
        entry.watchers.iter().for_each(|w| w.wake.notify_one());
    }
}
