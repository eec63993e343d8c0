//! How lock scripts are sent, and the reply shapes every primitive's scripts share.
//!
//! Each primitive states its own Lua scripts (as `static` [`Script`]s, hashed once per process).
//! Every script touches only keys of one hash slot (the keys of one lock, or the renewal's keys
//! of one slot), except the cluster renewal, which touches keys of one node (see
//! `renewal::batch`). Each is sent as `EVALSHA`, falling
//! back to `EVAL` when the server answers `NOSCRIPT` (after a restart, failover or
//! `SCRIPT FLUSH`). Commands are built with [`fred::types::CustomCommand`] routed by
//! [`ClusterHash::Custom`] because fred's `LuaInterface` ignores per-command options.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use fred::bytes::Bytes;
use fred::error::{Error, ErrorKind};
use fred::types::{ClusterHash, CustomCommand, Value};

use crate::key::LockKeys;

/// A Lua script, with its source and SHA-1 ready to send.
#[derive(Debug)]
pub(crate) struct Script {
    source: Value,
    sha: Value,
}

impl Script {
    /// A script from its source; its SHA-1 is computed here, once.
    pub(crate) fn new(source: &'static str) -> Self {
        let sha = fred::util::sha1_hash(source);
        SOURCES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(sha.clone(), source);
        Script {
            source: Value::from(source),
            sha: Value::from(sha),
        }
    }

    /// A call of this script on `keys` (all in `slot`) with `args`.
    pub(crate) fn call(&self, slot: u16, keys: Vec<Bytes>, args: Vec<Value>) -> ScriptCall<'_> {
        ScriptCall {
            script: self,
            slot,
            keys,
            args,
            never_late: false,
            source_first: false,
            ahead: false,
        }
    }

    /// A call on one lock's key and fencing counter.
    #[allow(dead_code)] // for primitives whose scripts touch only the lock and its fence
    pub(crate) fn on_lock(&self, keys: &LockKeys, args: Vec<Value>) -> ScriptCall<'_> {
        self.call(keys.slot, vec![keys.lock.clone(), keys.fence.clone()], args)
    }
}

/// The source of every [`Script`] made in this process, by SHA-1: a server error names the
/// script by SHA and line only (e.g. an ACL denial inside it).
static SOURCES: Mutex<BTreeMap<String, &'static str>> = Mutex::new(BTreeMap::new());

/// Line `line` (1-based) of the script whose SHA-1 is `sha`, if this process made it.
pub(crate) fn source_line(sha: &str, line: usize) -> Option<&'static str> {
    let sources = SOURCES.lock().unwrap_or_else(PoisonError::into_inner);
    sources.get(sha)?.lines().nth(line.checked_sub(1)?)
}

/// One script invocation: which script, its keys (one hash slot) and arguments.
#[derive(Debug, Clone)]
pub(crate) struct ScriptCall<'s> {
    script: &'s Script,
    pub(crate) slot: u16,
    keys: Vec<Bytes>,
    args: Vec<Value>,
    /// Whether the call must not reach the server once its caller's deadline has passed (see
    /// [`ScriptCall::never_late`]).
    pub(crate) never_late: bool,
    /// Whether the call is sent as `EVAL` with the script's source from the start (see
    /// [`ScriptCall::with_source`]).
    pub(crate) source_first: bool,
    /// Whether the call waits for a dedicated connection ahead of others (see
    /// [`ScriptCall::ahead`]).
    pub(crate) ahead: bool,
}

impl ScriptCall<'_> {
    /// Marks an acquisition attempt: once its caller's deadline has passed, it is never sent.
    /// fred keeps a command that could not be written (the connection is down) and sends it
    /// once reconnected, however late; an attempt sent then would take the key for a whole
    /// lease with nobody to release it. Releases and renewals stay as they are: sent late, they
    /// still act only on their own token.
    #[must_use]
    pub(crate) fn never_late(mut self) -> Self {
        self.never_late = true;
        self
    }

    /// Marks a renewal: it waits for a dedicated connection behind at most one other caller,
    /// not behind every acquisition queued before it, whose wait could outlast its leases.
    #[must_use]
    pub(crate) fn ahead(mut self) -> Self {
        self.ahead = true;
        self
    }

    /// Sends the script's source (`EVAL`) from the first try instead of its SHA-1: for a
    /// release that fred may send long after its caller is gone (queued while the connection
    /// was down, behind the attempt it undoes), when a `NOSCRIPT` reply could no longer be
    /// answered with the source.
    #[must_use]
    pub(crate) fn with_source(mut self) -> Self {
        self.source_first = true;
        self
    }

    /// The `EVALSHA` (or, with `use_source`, `EVAL`) command and its arguments, routed to the slot.
    pub(crate) fn command(&self, use_source: bool) -> (CustomCommand, Vec<Value>) {
        let (name, body) = if use_source {
            ("EVAL", self.script.source.clone())
        } else {
            ("EVALSHA", self.script.sha.clone())
        };
        let mut all = Vec::with_capacity(2 + self.keys.len() + self.args.len());
        all.push(body);
        all.push(Value::Integer(
            i64::try_from(self.keys.len()).unwrap_or(i64::MAX),
        ));
        all.extend(self.keys.iter().cloned().map(Value::Bytes));
        all.extend(self.args.iter().cloned());
        let route = CustomCommand::new_static(name, ClusterHash::Custom(self.slot), false);
        (route, all)
    }
}

/// True when the server does not know the script's SHA.
pub(crate) fn is_noscript(error: &Error) -> bool {
    error.details().trim_start().starts_with("NOSCRIPT")
}

/// What the acquire script answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// Granted; the new fencing token, and (from a script that takes several keys at once) the
    /// fencing token of each key, in the script's key order (else empty).
    Granted { fence: u64, parts: Vec<u64> },
    /// Held by another owner for `pttl_ms` more milliseconds (negative: no TTL known); `fence`:
    /// the fencing counter at that moment, from scripts that report it (a later hand-off to
    /// this waiter carries a higher one).
    Busy { pttl_ms: i64, fence: Option<u64> },
}

/// Parses the acquire script's `{status, number}` reply (`{0, pttl, fence}` when busy, from
/// the mutex; `{1, fence, part fences...}` when granted several keys at once).
pub(crate) fn parse_acquire(value: Value) -> Result<AcquireReply, Error> {
    let protocol = || {
        Error::new(
            ErrorKind::Protocol,
            "unexpected reply to the acquire script",
        )
    };
    let Value::Array(items) = value else {
        return Err(protocol());
    };
    let [status, number, rest @ ..] = items.as_slice() else {
        return Err(protocol());
    };
    let number = number.as_i64().ok_or_else(protocol)?;
    match status.as_i64() {
        Some(1) => Ok(AcquireReply::Granted {
            fence: u64::try_from(number).map_err(|_| protocol())?,
            parts: rest
                .iter()
                .map(|part| fence_value(part).ok_or_else(protocol))
                .collect::<Result<_, _>>()?,
        }),
        Some(0) => Ok(AcquireReply::Busy {
            pttl_ms: number,
            fence: match rest {
                [] => None,
                [fence] => Some(fence_value(fence).ok_or_else(protocol)?),
                _ => return Err(protocol()),
            },
        }),
        _ => Err(protocol()),
    }
}

/// A fencing token in a script reply (a non-negative integer).
fn fence_value(value: &Value) -> Option<u64> {
    value.as_i64().and_then(|n| u64::try_from(n).ok())
}

/// A release script's reply.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ReleaseReply {
    /// Whether the call removed this token's hold.
    pub(crate) released: bool,
    /// The next waiter the release named (that waiter's token), if any.
    pub(crate) head: Option<Bytes>,
    /// The fencing token of the hold the release handed to `head`, if it did.
    pub(crate) handed_off: Option<u64>,
}

/// Parses a release reply: `1 | 0`, `{1 | 0, head}` from a primitive whose release names the
/// next waiter in its queue (`head`: that waiter's token, or nil/false when none), or
/// `{1 | 0, head, fence}` when the release granted the lock to `head` with that fencing token.
pub(crate) fn parse_release(value: &Value) -> Result<ReleaseReply, Error> {
    let protocol = || Error::new(ErrorKind::Protocol, "unexpected reply to a release script");
    match value {
        Value::Array(items) => match items.as_slice() {
            [flag, rest @ ..] if rest.len() <= 2 => {
                let head = rest
                    .first()
                    .and_then(Value::as_bytes)
                    .map(Bytes::copy_from_slice);
                let handed_off = rest
                    .get(1)
                    .map(|f| fence_value(f).ok_or_else(protocol))
                    .transpose()?;
                Ok(ReleaseReply {
                    released: parse_flag(flag)?,
                    head,
                    handed_off,
                })
            }
            _ => Err(protocol()),
        },
        other => Ok(ReleaseReply {
            released: parse_flag(other)?,
            ..ReleaseReply::default()
        }),
    }
}

/// Parses the 0/1 reply of the renew and release scripts.
pub(crate) fn parse_flag(value: &Value) -> Result<bool, Error> {
    match value.as_i64() {
        Some(n) => Ok(n == 1),
        None => Err(Error::new(
            ErrorKind::Protocol,
            "unexpected reply to a lock script",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_reply_parsing() {
        let granted = Value::Array(vec![Value::Integer(1), Value::Integer(7)]);
        assert_eq!(
            parse_acquire(granted).ok(),
            Some(AcquireReply::Granted {
                fence: 7,
                parts: Vec::new()
            })
        );
        let several = Value::Array(vec![
            Value::Integer(1),
            Value::Integer(4),
            Value::Integer(9),
            Value::Integer(4),
        ]);
        assert_eq!(
            parse_acquire(several).ok(),
            Some(AcquireReply::Granted {
                fence: 4,
                parts: vec![9, 4]
            })
        );
        let negative_part = Value::Array(vec![
            Value::Integer(1),
            Value::Integer(4),
            Value::Integer(-1),
        ]);
        assert!(parse_acquire(negative_part).is_err());
        let too_long_busy = Value::Array(vec![
            Value::Integer(0),
            Value::Integer(250),
            Value::Integer(3),
            Value::Integer(3),
        ]);
        assert!(parse_acquire(too_long_busy).is_err());
        let busy = Value::Array(vec![Value::Integer(0), Value::Integer(250)]);
        assert_eq!(
            parse_acquire(busy).ok(),
            Some(AcquireReply::Busy {
                pttl_ms: 250,
                fence: None
            })
        );
        let counted = Value::Array(vec![
            Value::Integer(0),
            Value::Integer(250),
            Value::Integer(3),
        ]);
        assert_eq!(
            parse_acquire(counted).ok(),
            Some(AcquireReply::Busy {
                pttl_ms: 250,
                fence: Some(3)
            })
        );
        assert!(parse_acquire(Value::Null).is_err());
    }

    #[test]
    fn release_replies_with_and_without_a_head() {
        let plain = |released, head: Option<&'static [u8]>, handed_off| ReleaseReply {
            released,
            head: head.map(Bytes::from_static),
            handed_off,
        };
        assert_eq!(
            parse_release(&Value::Integer(1)).ok(),
            Some(plain(true, None, None))
        );
        let named = Value::Array(vec![Value::Integer(1), Value::from("t")]);
        assert_eq!(
            parse_release(&named).ok(),
            Some(plain(true, Some(b"t"), None))
        );
        let none = Value::Array(vec![Value::Integer(0), Value::Null]);
        assert_eq!(parse_release(&none).ok(), Some(plain(false, None, None)));
        let handed = Value::Array(vec![Value::Integer(1), Value::from("t"), Value::Integer(7)]);
        assert_eq!(
            parse_release(&handed).ok(),
            Some(plain(true, Some(b"t"), Some(7)))
        );
        let negative = Value::Array(vec![
            Value::Integer(1),
            Value::from("t"),
            Value::Integer(-1),
        ]);
        assert!(parse_release(&negative).is_err());
    }

    #[test]
    fn commands_route_by_slot() {
        let keys = LockKeys::new("ns", b"k");
        let script = Script::new("return 1");
        let (cmd, args) = script.on_lock(&keys, vec![]).command(false);
        assert_eq!(cmd.cluster_hash, ClusterHash::Custom(keys.slot));
        assert_eq!(args.len(), 4);
    }
}
