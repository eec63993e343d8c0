//! The channels a process watches and the waiters on each: who a release message wakes.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::bytes::Bytes;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::message::Grant;

/// How long a channel stays subscribed after its last local waiter left.
pub(super) const LINGER: Duration = Duration::from_secs(2);

/// How many of a channel's latest namings it remembers ([`Channel::recent`]): more than one
/// release names (a read-write lock's hands over to at most 32 readers at once).
const RECENT: usize = 64;

/// Every channel this process watches, by name.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) channels: Mutex<HashMap<Bytes, Channel>>,
    /// Releases waiters found by polling, though subscribed, since the last message came (see
    /// [`Watch::missed_release`](super::Watch::missed_release)).
    pub(super) missed: std::sync::atomic::AtomicU32,
    /// An ACL denied an `SSUBSCRIBE` (warned about once per client).
    pub(super) denied: std::sync::atomic::AtomicBool,
}

/// One watched channel.
#[derive(Debug)]
pub(super) struct Channel {
    /// The local tasks that wait on the server for this key (usually one: a process leaves the
    /// server to one task per key; a caller of several keys watches each of its keys).
    pub(super) watchers: Vec<Watcher>,
    /// The heads the latest messages (and this process's own releases) named, with their
    /// grants, oldest first, at most [`RECENT`]: a waiter that registers just after its message
    /// came (between its attempt's reply and its [`Notifier::watch`](super::Notifier::watch))
    /// still finds it, though later messages named others (a release that lets several readers
    /// in names each), and [`deliver`] tells by them the second report of one release (its
    /// reply and its message) from a later release.
    pub(super) recent: VecDeque<(Bytes, Option<Grant>)>,
    /// Confirmed by the server (and not lost to a reconnect since).
    pub(super) subscribed: bool,
    /// An `SSUBSCRIBE` for it was sent on the current subscriber connection, confirmed or not
    /// (its waiter may have been cancelled, or have given up, before the reply): the server may
    /// be subscribed, so once idle the channel lingers and is unsubscribed like a confirmed one,
    /// never just forgotten (which would leave the subscription on the server for good).
    pub(super) requested: bool,
    /// When the last watch left.
    pub(super) idle_since: Instant,
    /// An ACL denied its `SSUBSCRIBE`: not sent again before then (its waiters poll).
    pub(super) denied_until: Option<Instant>,
}

/// One live [`Watch`](super::Watch): its waiter's token, how to wake it, and the grant a release handed it.
#[derive(Debug)]
pub(super) struct Watcher {
    pub(super) token: Bytes,
    pub(super) wake: Arc<Notify>,
    /// The grant a release handed to `token`, until the waiter takes it.
    pub(super) grant: Option<Grant>,
}

/// Whether `channel` is confirmed subscribed.
pub(super) fn is_subscribed(shared: &Shared, channel: &[u8]) -> bool {
    shared
        .channels
        .lock()
        .is_ok_and(|c| c.get(channel).is_some_and(|e| e.subscribed))
}

/// Until when `channel`'s `SSUBSCRIBE` is not to be sent again (an ACL denied it).
pub(super) fn denied_until(shared: &Shared, channel: &[u8]) -> Option<Instant> {
    shared
        .channels
        .lock()
        .ok()
        .and_then(|c| c.get(channel).and_then(|e| e.denied_until))
}

/// Records that an `SSUBSCRIBE` for `channel` is about to be sent (see [`Channel::requested`]).
pub(super) fn mark_requested(shared: &Shared, channel: &[u8]) {
    if let Ok(mut channels) = shared.channels.lock()
        && let Some(entry) = channels.get_mut(channel)
    {
        entry.requested = true;
    }
}

/// The subscriber connection reconnected: the server forgot its subscriptions, so every
/// channel is marked unsubscribed. What may be subscribed again stays known: an `SSUBSCRIBE`
/// sent before the reconnect may still wait in fred's queue and reach the server after it, so a
/// requested channel keeps its record (an idle one lingers and is unsubscribed as usual), never
/// forgotten with a subscription the server will hold.
pub(super) fn connection_reset(shared: &Shared) {
    if let Ok(mut channels) = shared.channels.lock() {
        channels.retain(|_, e| !e.watchers.is_empty() || e.requested);
        channels.values_mut().for_each(|e| e.subscribed = false);
    }
}

/// Marks every channel unsubscribed (its subscriber connection is gone for good, and its
/// subscriptions with it), forgetting those no waiter watches.
pub(super) fn forget_subscriptions(shared: &Shared) {
    if let Ok(mut channels) = shared.channels.lock() {
        channels.retain(|_, e| !e.watchers.is_empty());
        channels.values_mut().for_each(|e| {
            e.subscribed = false;
            e.requested = false;
        });
    }
}

/// Wakes the local waiter named `head` (storing its grant), once per release: a release's
/// reply (to this process, when it released) and its message both name it, with the same grant,
/// and the second of them is skipped. A release is told apart by its head and its grant's
/// fencing token (each hand-off takes a new one), so a later release that names the same waiter
/// again (one that could not use an earlier hand-off, say its process stalled past the hand-off
/// lease, and queued again) wakes it again. A naming without a grant (a caller of several keys)
/// carries nothing to tell releases apart: one naming the same waiter as the channel's previous
/// message is skipped. An empty `head` (a release of a primitive without a queue, see
/// `Rules::release_announcement`) wakes the channel's waiters, whoever they are, to retry.
pub(super) fn deliver(shared: &Shared, channel: &[u8], head: &[u8], grant: Option<Grant>) {
    if let Ok(mut channels) = shared.channels.lock()
        && let Some(entry) = channels.get_mut(channel)
    {
        if head.is_empty() {
            entry.watchers.iter().for_each(|w| w.wake.notify_one());
            return;
        }
        let fence = grant.map(|g| g.fence);
        let same = |(named, named_grant): &(Bytes, Option<Grant>)| {
            named == head && named_grant.map(|g| g.fence) == fence
        };
        // A grant's fence names one release; a naming without one is told only from the
        // channel's previous naming.
        let twin = match fence {
            Some(_) => entry.recent.iter().any(same),
            None => entry.recent.back().is_some_and(same),
        };
        if twin {
            return;
        }
        for watcher in entry.watchers.iter_mut().filter(|w| w.token == head) {
            watcher.grant = grant;
            watcher.wake.notify_one();
        }
        if entry.recent.len() == RECENT {
            entry.recent.pop_front();
        }
        entry
            .recent
            .push_back((Bytes::copy_from_slice(head), grant));
    }
}

/// The grant the latest naming of `token` on `entry` handed it, if a recent message named it.
pub(super) fn named_recently(entry: &Channel, token: &[u8]) -> Option<Option<Grant>> {
    entry
        .recent
        .iter()
        .rev()
        .find(|(named, _)| named == token)
        .map(|(_, grant)| *grant)
}

pub(super) fn wake_all(shared: &Shared) {
    if let Ok(channels) = shared.channels.lock() {
        for watcher in channels.values().flat_map(|e| &e.watchers) {
            watcher.wake.notify_one();
        }
    }
}
