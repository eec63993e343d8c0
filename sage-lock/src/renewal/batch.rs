//! One renewal call: the script that renews many holds of one slot at once, the batches of
//! holds that can share a call, and what an attempt meant for each hold.

use std::sync::LazyLock;
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::Value;
use fred::types::config::Server;
use tokio::time::Instant;

use super::target::Renewal;
use crate::acl::denial_hint;
use crate::connection::{Ack, CLOSED_BY_QUIT, Connection, OpError};
use crate::error::LossReason;
use crate::retry::{Failure, classify, is_readonly, millis};
use crate::scripts::Script;

/// The loop shared by both renewal scripts. Needs `lease`, `keys` (the keys, in order) and
/// `moved` (what a key this node does not serve gets) set first. `ARGV[2i]` is key `i`'s kind:
/// `o` (the key holds the token `ARGV[2i + 1]`: `PEXPIRE` it) or `m` (the token is a member of
/// the sorted set, scored by its expiry in server ms: move its expiry and keep the set alive at
/// least as long). Replies one code per key: 1 renewed, 0 no longer ours (a key of the wrong
/// type counts as that, for that key alone), 2 served by another node (see [`RENEW_ACROSS`]).
/// A command the ACL denies fails the whole call with the server's `NOPERM` error.
macro_rules! renew_loop {
    () => {
        r"
local now
local renewed = {}
local function verdict(reply, command)
  if type(reply) == 'table' and reply.err then
    -- A command the ACL denies fails the whole call (the user lacks it for every hold), named
    -- as the server names a denied command outside a script.
    local e = reply.err
    if string.find(e, 'NOPERM', 1, true) or string.find(e, [[can't run this command]], 1, true)
      or string.find(e, 'ACL failure', 1, true) then
      error({err = e .. [[ (no permissions to run the ']] .. command .. [[' command)]]})
    end
    if not string.find(e, 'WRONGTYPE', 1, true) then
      return moved
    end
  end
  return 0
end
for i = 1, #keys do
  local kind, token = ARGV[2 * i], ARGV[2 * i + 1]
  renewed[i] = 0
  if kind == 'o' then
    local held = redis.pcall('GET', keys[i])
    -- A mutex holder's value may carry the queued mark ('+').
    if held == token or held == token .. '+' then
      renewed[i] = redis.call('PEXPIRE', keys[i], lease)
    else
      renewed[i] = verdict(held, 'get')
    end
  else
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    local score = redis.pcall('ZSCORE', keys[i], token)
    if type(score) == 'string' and tonumber(score) > now then
      redis.call('ZADD', keys[i], now + lease, token)
      if redis.call('PTTL', keys[i]) < lease then
        redis.call('PEXPIRE', keys[i], lease)
      end
      renewed[i] = 1
    else
      renewed[i] = verdict(score, 'zscore')
    end
  end
end
return renewed
"
    };
}

/// Renews many holds of one slot at once: `KEYS[i]` per `ARGV[2i]`, `ARGV[2i + 1]` (see
/// [`renew_loop`]); `ARGV[1]` is the lease in ms.
const RENEW_MANY: &str = concat!(
    r"
local lease = tonumber(ARGV[1])
local keys = KEYS
local moved = 0
",
    renew_loop!()
);

/// Renews many holds of one cluster node at once, whatever their slots: the same as
/// [`RENEW_MANY`] with the keys after the kinds and tokens (`ARGV[1 + 2n + i]` for `n` holds),
/// undeclared, which the `allow-cross-slot-keys` flag allows as long as this node serves them
/// (a cluster rejects declared keys of different slots before running a script). A key this
/// node does not serve (its slot moved, or is moving) gets 2, so that hold is renewed by slot
/// from then on. `allow-oom`: a script with flags is otherwise refused whole while the server
/// is out of memory, and renewing adds almost nothing.
const RENEW_ACROSS: &str = concat!(
    r"#!lua flags=allow-cross-slot-keys,allow-oom
local lease = tonumber(ARGV[1])
local n = (#ARGV - 1) / 3
local keys = {}
for i = 1, n do
  keys[i] = ARGV[1 + 2 * n + i]
end
local moved = 2
",
    renew_loop!()
);

static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_MANY));
static RENEW_ACROSS_SLOTS: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_ACROSS));

/// What one attempt meant for one lock.
pub(super) enum Outcome {
    Renewed,
    Lost(LossReason),
    Retry(LossReason),
    /// The node the call went to no longer serves the hold's slot: retry in a call of its own
    /// slot, routed afresh.
    Elsewhere(LossReason),
    /// The client was closed by `LockClient::quit`: no renewal can succeed, so none is tried
    /// again; the hold lasts until its usable lease runs out (its safety net reports the loss).
    Closed(LossReason),
}

/// Why a hold of a client closed by `LockClient::quit` is lost: nothing renews it any more.
pub(super) fn closed_by_quit() -> LossReason {
    LossReason::RenewalFailed(format!("{CLOSED_BY_QUIT}; the lease ran out unrenewed"))
}

/// The outcome of one renewal call: when it was sent, and what it meant for each lock.
pub(super) struct Attempt {
    pub(super) sent: std::time::Instant,
    pub(super) outcomes: Vec<(u64, Outcome)>,
    /// The primary that renewed them, when known (a cluster's node serving their slot).
    pub(super) renewed_by: Option<Server>,
}

/// Where the holds of one call live.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) enum Place {
    /// One server holds every key (standalone, replicated).
    Server,
    /// This cluster node serves the holds' slots, as far as the client's routing knows: one
    /// call for all of them ([`RENEW_ACROSS`]).
    Node(Server),
    /// This cluster slot (the node is unknown, or it answered that it no longer serves a hold).
    Slot(u16),
}

/// Locks that can be renewed by one call: same place, acknowledgement mode, lease and granting
/// node.
#[derive(PartialEq, Eq, Hash)]
pub(super) struct BatchKey {
    place: Place,
    replica_ack: bool,
    lease: Duration,
    granted_by: Option<Server>,
}

impl BatchKey {
    pub(super) fn of(renewal: &Renewal, place: Place) -> Self {
        BatchKey {
            place,
            replica_ack: renewal.replica_ack,
            lease: renewal.lease_duration,
            granted_by: renewal.granted_by.clone(),
        }
    }
}

/// Locks renewed by one script call, and the call's deadline.
pub(super) struct Batch {
    /// The slot the call is routed by (a cluster's node serving it runs the call).
    slot: u16,
    /// Whether the keys may span slots (sent with [`RENEW_ACROSS`]).
    across_slots: bool,
    replica_ack: bool,
    lease: Duration,
    granted_by: Option<Server>,
    ids: Vec<u64>,
    keys: Vec<Bytes>,
    tokens: Vec<Value>,
    /// The earliest end of a usable lease in the batch: the call's deadline.
    deadline: Option<Instant>,
}

impl Batch {
    pub(super) fn new(renewal: &Renewal, place: &Place) -> Self {
        Batch {
            slot: renewal.slot,
            across_slots: matches!(place, Place::Node(_)),
            replica_ack: renewal.replica_ack,
            lease: renewal.lease_duration,
            granted_by: renewal.granted_by.clone(),
            ids: Vec::new(),
            keys: Vec::new(),
            tokens: Vec::new(),
            deadline: None,
        }
    }

    pub(super) fn add(&mut self, id: u64, renewal: &Renewal) {
        self.ids.push(id);
        self.keys.push(renewal.target.key.clone());
        self.tokens.push(Value::from(renewal.target.kind.code()));
        self.tokens.push(Value::Bytes(renewal.token.clone()));
        let valid_until = renewal.lease.deadline();
        self.deadline = Some(self.deadline.map_or(valid_until, |d| d.min(valid_until)));
    }

    /// Splits into batches of at most `limit` (at least 1) locks.
    pub(super) fn split(self, limit: usize) -> Vec<Batch> {
        let limit = limit.max(1);
        if self.ids.len() <= limit {
            return vec![self];
        }
        let mut out = Vec::new();
        let (mut ids, mut keys, mut tokens) = (self.ids, self.keys, self.tokens);
        while !ids.is_empty() {
            let take = ids.len().min(limit);
            out.push(Batch {
                slot: self.slot,
                across_slots: self.across_slots,
                replica_ack: self.replica_ack,
                lease: self.lease,
                granted_by: self.granted_by.clone(),
                ids: ids.drain(..take).collect(),
                keys: keys.drain(..take).collect(),
                tokens: tokens.drain(..2 * take).collect(),
                deadline: self.deadline,
            });
        }
        out
    }

    /// One renewal attempt for every lock in the batch: what it meant for each (by id), and when
    /// it was sent, on the real clock (see `crate::lease`).
    pub(super) async fn renew(self, conn: &Connection) -> Attempt {
        let mut sent = std::time::Instant::now();
        let deadline = self.deadline.unwrap_or_else(Instant::now);
        let mut args = Vec::with_capacity(1 + self.tokens.len() + self.keys.len());
        args.push(Value::Integer(millis(self.lease)));
        args.extend(self.tokens);
        let call = if self.across_slots {
            args.extend(self.keys.into_iter().map(Value::Bytes));
            RENEW_ACROSS_SLOTS.call(self.slot, Vec::new(), args)
        } else {
            RENEW.call(self.slot, self.keys, args)
        }
        .ahead();
        let result = conn
            .run(
                &call,
                self.replica_ack,
                deadline,
                self.granted_by.as_ref(),
                None,
                &mut sent,
            )
            .await;
        let renewed_by = match &result {
            Ok((_, Ack::Confirmed, node)) => node.clone(),
            _ => None,
        };
        let outcomes: Vec<Outcome> = match result {
            // One flag per lease, in order; any other reply is unexpected (retried below).
            Ok((Value::Array(flags), Ack::Confirmed, _)) if flags.len() == self.ids.len() => flags
                .iter()
                .map(|flag| match flag.as_i64() {
                    Some(1) => Outcome::Renewed,
                    Some(2) => Outcome::Elsewhere(LossReason::RenewalFailed(
                        "the node renewing several slots at once no longer serves this one".into(),
                    )),
                    _ => Outcome::Lost(LossReason::NotOwner),
                })
                .collect(),
            Ok((_, Ack::Confirmed, _)) => {
                let problem =
                    LossReason::RenewalFailed("unexpected reply to the renewal script".into());
                self.ids
                    .iter()
                    .map(|_| Outcome::Retry(problem.clone()))
                    .collect()
            }
            Ok((_, Ack::NotPrimary(role), _)) => self
                .ids
                .iter()
                .map(|_| Outcome::Lost(LossReason::RoleChanged(role.clone())))
                .collect(),
            Ok((
                _,
                Ack::Short {
                    acknowledged,
                    required,
                },
                _,
            )) => {
                let problem = LossReason::NotAcknowledged {
                    acknowledged,
                    required,
                };
                self.ids
                    .iter()
                    .map(|_| Outcome::Retry(problem.clone()))
                    .collect()
            }
            Err(OpError::Failed(error)) if is_readonly(&error) => {
                let reason =
                    LossReason::RoleChanged(format!("the server answered {}", error.details()));
                self.ids
                    .iter()
                    .map(|_| Outcome::Lost(reason.clone()))
                    .collect()
            }
            Err(OpError::Failed(error)) if crate::connection::is_closed_error(&error) => {
                let problem = closed_by_quit();
                self.ids
                    .iter()
                    .map(|_| Outcome::Closed(problem.clone()))
                    .collect()
            }
            Err(OpError::Failed(error)) => {
                let problem = LossReason::RenewalFailed(match denial_hint(&error, None) {
                    Some(hint) => format!("{error} ({hint})"),
                    None => error.to_string(),
                });
                let permanent = classify(&error) == Failure::Permanent;
                self.ids
                    .iter()
                    .map(|_| {
                        if permanent {
                            Outcome::Lost(problem.clone())
                        } else {
                            Outcome::Retry(problem.clone())
                        }
                    })
                    .collect()
            }
            Err(OpError::PoolExhausted) => {
                let problem = LossReason::RenewalFailed(
                    "no dedicated connection became free (raise max_connections)".into(),
                );
                self.ids
                    .iter()
                    .map(|_| Outcome::Retry(problem.clone()))
                    .collect()
            }
        };
        Attempt {
            sent,
            outcomes: self.ids.into_iter().zip(outcomes).collect(),
            renewed_by,
        }
    }
}
