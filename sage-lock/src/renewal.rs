//! Keeps held leases alive while their bodies run, and reports when one cannot be kept.
//!
//! Every client has one [`Renewer`]: a background task that wakes when renewals are due and
//! renews all leases due at about the same time together, one script call per hash slot (one per
//! server on a standalone or replicated deployment), with one `ROLE`/`WAIT` check per call. A
//! lease is due a third of the way through; leases due within a twentieth of a lease of each
//! other are renewed in the same call. Registering a lease costs no task and no round trip, so a
//! body shorter than a third of its lease never causes a renewal.
//!
//! A failed renewal is retried with backoff while the usable lease lasts. A lock is lost when its
//! key no longer holds the owner's token, when the granting node stops being a primary, or when the
//! usable lease runs out first; the owner's `with_lock` call hears of it through a oneshot channel.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use fred::bytes::Bytes;
use fred::types::Value;
use fred::types::config::Server;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::acl::denial_hint;
use crate::connection::{Ack, Connection, OpError};
use crate::error::LossReason;
use crate::lease::{Lease, drift};
use crate::observe::{Event, Metrics};
use crate::retry::{Backoff, Failure, classify, is_readonly, millis};
use crate::scripts::Script;
use crate::topology::Deployment;

/// Most locks renewed by one script call.
const MAX_BATCH: usize = 256;

/// Renews many holds of one slot at once. `ARGV[1]` is the lease in ms; `KEYS[i]` is renewed
/// per `ARGV[2i]`: `o` (the key holds the token `ARGV[2i + 1]`: `PEXPIRE` it) or `m` (the token
/// is a member of the sorted set `KEYS[i]`, scored by its expiry in server ms: move its expiry
/// and keep the set alive at least as long). Replies one 1 (renewed) or 0 (no longer ours) per
/// key. A key of the wrong type counts as "no longer ours" for that key alone.
const RENEW_MANY: &str = r"
local lease = tonumber(ARGV[1])
local now
local renewed = {}
for i = 1, #KEYS do
  local kind, token = ARGV[2 * i], ARGV[2 * i + 1]
  renewed[i] = 0
  if kind == 'o' then
    local held = redis.pcall('GET', KEYS[i])
    -- A mutex holder's value may carry the queued mark ('+').
    if held == token or held == token .. '+' then
      renewed[i] = redis.call('PEXPIRE', KEYS[i], lease)
    end
  else
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    local score = redis.pcall('ZSCORE', KEYS[i], token)
    if type(score) == 'string' and tonumber(score) > now then
      redis.call('ZADD', KEYS[i], now + lease, token)
      if redis.call('PTTL', KEYS[i]) < lease then
        redis.call('PEXPIRE', KEYS[i], lease)
      end
      renewed[i] = 1
    end
  end
end
return renewed
";

static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_MANY));

/// Where one hold lives on the server, for renewal.
#[derive(Debug, Clone)]
pub(crate) struct RenewTarget {
    /// The key that holds the token (or the set it is a member of).
    pub(crate) key: Bytes,
    pub(crate) kind: HoldKind,
}

/// How a hold is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldKind {
    /// The key's value is the owner's token; its TTL is the lease.
    Owner,
    /// The token is a member of a sorted set, scored by its expiry (server ms). Used by the
    /// primitives that keep several holders per key (semaphore, read lock).
    Member,
}

impl HoldKind {
    fn code(self) -> &'static str {
        match self {
            HoldKind::Owner => "o",
            HoldKind::Member => "m",
        }
    }
}

/// What the renewer needs about one hold.
pub(crate) struct Renewal {
    /// The hash slot of the hold's keys.
    pub(crate) slot: u16,
    pub(crate) target: RenewTarget,
    pub(crate) token: Bytes,
    pub(crate) lease_duration: Duration,
    pub(crate) replica_ack: bool,
    pub(crate) lease: Lease,
    /// The primary that granted the lock (replicated deployments).
    pub(crate) granted_by: Option<Server>,
    pub(crate) metrics: Arc<Metrics>,
}

struct Entry {
    renewal: Renewal,
    due: Instant,
    lost: Option<oneshot::Sender<LossReason>>,
    backoff: Backoff,
    last_problem: Option<LossReason>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// `(due, id)` of every entry not being renewed right now.
    queue: BTreeSet<(Instant, u64)>,
    entries: HashMap<u64, Entry>,
    /// When the scheduler will wake next on its own (`None`: unknown, wake it).
    sleeping_until: Option<Instant>,
}

/// The per-client renewal scheduler.
pub(crate) struct Renewer {
    shared: Arc<Shared>,
}

struct Shared {
    conn: Arc<Connection>,
    state: Mutex<State>,
    wake: Arc<Notify>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Let the scheduler see that its client is gone and end now, not at its next wake-up.
        self.wake.notify_one();
    }
}

/// A lease registered for renewal; dropping it stops renewal.
pub(crate) struct Registration {
    id: u64,
    renewer: Weak<Shared>,
}

impl Registration {
    /// Stops renewal and returns what the renewer last saw go wrong.
    pub(crate) fn into_loss(self) -> LossReason {
        let last = self
            .renewer
            .upgrade()
            .and_then(|renewer| renewer.last_problem(self.id));
        last.unwrap_or_else(|| LossReason::RenewalFailed("no renewal completed in time".into()))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(renewer) = self.renewer.upgrade() {
            renewer.forget(self.id);
        }
    }
}

impl Renewer {
    /// A scheduler renewing through `conn`; its task starts with the first registration.
    pub(crate) fn new(conn: Arc<Connection>) -> Self {
        Renewer {
            shared: Arc::new(Shared {
                conn,
                state: Mutex::new(State::default()),
                wake: Arc::new(Notify::new()),
                task: Mutex::new(None),
            }),
        }
    }

    /// Starts renewing `renewal`; a loss is reported on `lost`.
    pub(crate) fn register(
        &self,
        renewal: Renewal,
        lost: oneshot::Sender<LossReason>,
    ) -> Registration {
        let renewer = &self.shared;
        // A third of the way through the lease, or through the shorter one a hand-off granted.
        let granted_for = renewal
            .lease
            .valid_until()
            .saturating_duration_since(renewal.lease.acquired_at())
            + renewal.lease.margin();
        let due = crate::lease::timer_at(
            renewal.lease.acquired_at() + renewal.lease_duration.min(granted_for) / 3,
        );
        let backoff = renewal_backoff(renewal.lease_duration);
        let (id, earliest) = {
            let mut state = lock(&renewer.state);
            state.next_id += 1;
            let id = state.next_id;
            // Wake the scheduler only if it would otherwise sleep past this lease's renewal.
            let earliest = state.sleeping_until.is_none_or(|until| due < until);
            if earliest {
                state.sleeping_until = Some(due);
            }
            state.queue.insert((due, id));
            let entry = Entry {
                renewal,
                due,
                lost: Some(lost),
                backoff,
                last_problem: None,
            };
            state.entries.insert(id, entry);
            (id, earliest)
        };
        Shared::ensure_running(renewer);
        if earliest {
            renewer.wake.notify_one();
        }
        Registration {
            id,
            renewer: Arc::downgrade(renewer),
        }
    }
}

impl Shared {
    fn last_problem(&self, id: u64) -> Option<LossReason> {
        lock(&self.state)
            .entries
            .get(&id)
            .and_then(|entry| entry.last_problem.clone())
    }

    fn forget(&self, id: u64) {
        let mut state = lock(&self.state);
        if let Some(entry) = state.entries.remove(&id) {
            state.queue.remove(&(entry.due, id));
        }
    }

    /// Spawns the scheduler task unless it is running.
    fn ensure_running(this: &Arc<Shared>) {
        let mut task = lock(&this.task);
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let wake = Arc::clone(&this.wake);
        *task = Some(runtime.spawn(schedule(Arc::downgrade(this), wake)));
    }

    /// Takes every entry due by `now` (plus the batching window) out of the queue, grouped into
    /// batches that can share one script call.
    fn take_due(&self, now: Instant, by_slot: bool) -> Vec<Batch> {
        let mut state = lock(&self.state);
        let Some(&(first_due, first_id)) = state.queue.first() else {
            return Vec::new();
        };
        if first_due > now {
            return Vec::new();
        }
        let window = state
            .entries
            .get(&first_id)
            .map_or(Duration::ZERO, |e| e.renewal.lease_duration / 20);
        let horizon = now + window;
        let mut groups: HashMap<BatchKey, Batch> = HashMap::new();
        while let Some(&(due, id)) = state.queue.first() {
            if due > horizon {
                break;
            }
            state.queue.pop_first();
            let Some(entry) = state.entries.get(&id) else {
                continue;
            };
            let key = BatchKey::of(&entry.renewal, by_slot);
            let batch = groups
                .entry(key)
                .or_insert_with(|| Batch::new(&entry.renewal));
            batch.add(id, &entry.renewal);
        }
        groups.into_values().flat_map(Batch::split).collect()
    }

    /// When the scheduler should wake next: the earliest due entry, else `idle`.
    fn plan_sleep(&self, idle: Instant) -> Instant {
        let mut state = lock(&self.state);
        let until = state.queue.first().map_or(idle, |(due, _)| *due);
        state.sleeping_until = Some(until);
        until
    }

    /// Applies the outcome of one renewal attempt to entry `id`.
    /// `sent` is when the attempt was sent, on the real clock (see `crate::lease`).
    fn settle(&self, id: u64, sent: std::time::Instant, outcome: Outcome) {
        let client = &self.conn;
        let mut state = lock(&self.state);
        let Some(entry) = state.entries.get_mut(&id) else {
            return;
        };
        let metrics = Arc::clone(&entry.renewal.metrics);
        let loss = match outcome {
            Outcome::Renewed => {
                let lease_duration = entry.renewal.lease_duration;
                entry
                    .renewal
                    .lease
                    .extend_to(sent + lease_duration - drift(lease_duration));
                entry.backoff = renewal_backoff(lease_duration);
                entry.last_problem = None;
                entry.due = crate::lease::timer_at(sent + lease_duration / 3);
                client.stats.record(&metrics, Event::Renewal);
                let lease = &entry.renewal.lease;
                tracing::trace!(key = %lease.key(), namespace = %lease.namespace(), "lease renewed");
                None
            }
            Outcome::Lost(reason) => Some(reason),
            Outcome::Retry(problem) => {
                client.stats.record(&metrics, Event::RenewalFailure);
                let lease = &entry.renewal.lease;
                tracing::debug!(key = %lease.key(), namespace = %lease.namespace(), %problem, "renewal failed, retrying");
                let left = entry.renewal.lease.remaining();
                entry.last_problem = Some(problem);
                if left.is_zero() {
                    entry.last_problem.take()
                } else {
                    entry.due = Instant::now() + entry.backoff.next_delay(left);
                    None
                }
            }
        };
        match loss {
            Some(reason) => {
                if let Some(lost) = entry.lost.take() {
                    let _ = lost.send(reason);
                }
                state.entries.remove(&id);
            }
            None => {
                let due = entry.due;
                state.queue.insert((due, id));
                if state.sleeping_until.is_none_or(|until| due < until) {
                    state.sleeping_until = Some(due);
                    drop(state);
                    self.wake.notify_one();
                }
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn renewal_backoff(lease: Duration) -> Backoff {
    Backoff::new(
        Duration::from_millis(5),
        (lease / 10).max(Duration::from_millis(5)),
    )
}

/// The scheduler: sleeps until the earliest renewal is due (or a registration or finished
/// attempt wakes it), then renews every due batch concurrently. Holds the client only while
/// awake, and ends once the client is dropped.
async fn schedule(renewer: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(renewer) = renewer.upgrade() else {
                return;
            };
            let by_slot = renewer.conn.deployment == Deployment::Cluster;
            for batch in renewer.take_due(Instant::now(), by_slot) {
                let renewer = Arc::clone(&renewer);
                tokio::spawn(async move { batch.renew(&renewer).await });
            }
            renewer.plan_sleep(Instant::now() + Duration::from_secs(60))
        };
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = wake.notified() => {}
        }
    }
}

/// What one attempt meant for one lock.
enum Outcome {
    Renewed,
    Lost(LossReason),
    Retry(LossReason),
}

/// Locks that can be renewed by one call: same slot (clusters only: a script's keys must share
/// one), acknowledgement mode, lease and granting node.
#[derive(PartialEq, Eq, Hash)]
struct BatchKey {
    slot: Option<u16>,
    replica_ack: bool,
    lease: Duration,
    granted_by: Option<Server>,
}

impl BatchKey {
    fn of(renewal: &Renewal, by_slot: bool) -> Self {
        BatchKey {
            slot: by_slot.then_some(renewal.slot),
            replica_ack: renewal.replica_ack,
            lease: renewal.lease_duration,
            granted_by: renewal.granted_by.clone(),
        }
    }
}

struct Batch {
    slot: u16,
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
    fn new(renewal: &Renewal) -> Self {
        Batch {
            slot: renewal.slot,
            replica_ack: renewal.replica_ack,
            lease: renewal.lease_duration,
            granted_by: renewal.granted_by.clone(),
            ids: Vec::new(),
            keys: Vec::new(),
            tokens: Vec::new(),
            deadline: None,
        }
    }

    fn add(&mut self, id: u64, renewal: &Renewal) {
        self.ids.push(id);
        self.keys.push(renewal.target.key.clone());
        self.tokens.push(Value::from(renewal.target.kind.code()));
        self.tokens.push(Value::Bytes(renewal.token.clone()));
        let valid_until = renewal.lease.deadline();
        self.deadline = Some(self.deadline.map_or(valid_until, |d| d.min(valid_until)));
    }

    /// Splits into batches of at most [`MAX_BATCH`] locks.
    fn split(self) -> Vec<Batch> {
        if self.ids.len() <= MAX_BATCH {
            return vec![self];
        }
        let mut out = Vec::new();
        let (mut ids, mut keys, mut tokens) = (self.ids, self.keys, self.tokens);
        while !ids.is_empty() {
            let take = ids.len().min(MAX_BATCH);
            out.push(Batch {
                slot: self.slot,
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

    /// One renewal attempt for every lock in the batch.
    async fn renew(self, renewer: &Shared) {
        let sent = std::time::Instant::now();
        let deadline = self.deadline.unwrap_or_else(Instant::now);
        let mut args = Vec::with_capacity(1 + self.tokens.len());
        args.push(Value::Integer(millis(self.lease)));
        args.extend(self.tokens);
        let call = RENEW.call(self.slot, self.keys, args);
        let result = renewer
            .conn
            .run(
                &call,
                self.replica_ack,
                deadline,
                self.granted_by.as_ref(),
                None,
            )
            .await;
        let outcomes: Vec<Outcome> = match result {
            Ok((Value::Array(flags), Ack::Confirmed, _)) => flags
                .iter()
                .map(|flag| match flag.as_i64() {
                    Some(1) => Outcome::Renewed,
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
        for (id, outcome) in self.ids.iter().zip(outcomes) {
            renewer.settle(*id, sent, outcome);
        }
    }
}
