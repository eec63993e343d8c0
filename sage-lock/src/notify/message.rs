//! The release message and its channel: what a release publishes, and where.
//!
//! A lock's channel is `{ns:key}:released`, in the key's own hash slot. A message is
//! `token:fence:ms` (the next owner's token, its fencing token, and the hand-off lease in ms),
//! `token:fence` from a release of an earlier version, a bare `token` (the next waiter, named
//! without a grant), or empty (whoever waits, try again).

use std::time::Duration;

use fred::bytes::Bytes;

/// The suffix of a lock's release channel.
const SUFFIX: &[u8] = b":released";

/// The release channel of the lock stored at `lock_key` (same hash slot as the key).
pub(crate) fn channel(lock_key: &[u8]) -> Bytes {
    let mut name = Vec::with_capacity(lock_key.len() + SUFFIX.len());
    name.extend_from_slice(lock_key);
    name.extend_from_slice(SUFFIX);
    Bytes::from(name)
}

/// A lock a release handed to a local waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The fencing token of the handed-off hold.
    pub(crate) fence: u64,
    /// When the release was sent, if this process sent it (real clock): the grant is no older.
    pub(crate) since: Option<std::time::Instant>,
    /// The hand-off lease the release set, when it said (`None`: a release of an earlier
    /// version, which always set the longest hand-off lease).
    pub(crate) lease: Option<Duration>,
}

impl Grant {
    pub(crate) fn new(fence: u64, since: Option<std::time::Instant>) -> Self {
        Grant {
            fence,
            since,
            lease: None,
        }
    }

    /// The same grant, with the hand-off lease the release set.
    #[must_use]
    pub(crate) fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }
}

/// Splits off the last `:number` of `payload`.
fn split_number(payload: &[u8]) -> Option<(&[u8], u64)> {
    let colon = payload.iter().rposition(|b| *b == b':')?;
    let number = std::str::from_utf8(&payload[colon + 1..])
        .ok()?
        .parse()
        .ok()?;
    Some((&payload[..colon], number))
}

/// Splits a release message `token:fence:ms`, or `token:fence` from a release of an earlier
/// version (or a bare `token`, which names the next waiter without a grant). Tokens are hex.
pub(super) fn parse_message(payload: &[u8]) -> (&[u8], Option<Grant>) {
    let Some((rest, last)) = split_number(payload) else {
        return (payload, None);
    };
    match split_number(rest) {
        Some((token, fence)) => (
            token,
            Some(Grant::new(fence, None).with_lease(Duration::from_millis(last))),
        ),
        None => (rest, Some(Grant::new(last, None))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_shares_the_key_slot() {
        let name = channel(b"{lock:a}");
        assert_eq!(&name[..], b"{lock:a}:released");
        assert_eq!(
            fred::util::redis_keyslot(&name),
            fred::util::redis_keyslot(b"{lock:a}")
        );
    }

    #[test]
    fn messages_split_into_token_and_fence() {
        assert_eq!(
            parse_message(b"abc:17:300"),
            (
                &b"abc"[..],
                Some(Grant::new(17, None).with_lease(Duration::from_millis(300)))
            )
        );
        // A release of an earlier version.
        assert_eq!(
            parse_message(b"abc:17"),
            (&b"abc"[..], Some(Grant::new(17, None)))
        );
        assert_eq!(parse_message(b"abc"), (&b"abc"[..], None));
        assert_eq!(parse_message(b"abc:x"), (&b"abc:x"[..], None));
    }
}
