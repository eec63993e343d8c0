//! Worker mode of the `chaos` binary: one process, [`TASKS_PER_WORKER`] tasks contending for the
//! hot and cold keys through sage-lock's public API, each critical section a fenced
//! read-modify-write on the store. Everything is recorded to the process's history file.
//!
//! Control over stdin: the line `stop` ends the tasks, runs the recovery probe, quits the client
//! and answers `stopped` on stdout; the process then exits at `exit` or end of input.

use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use sage_lock::{
    LockClient, LockError, LockOptions, Locks, LossReason, RwLocks, Semaphores, TimeoutReason,
};
use tokio::sync::Notify;

use super::history::{Event, History, Hold, PROCESS, WriteOutcome, field_text};
use super::store::StoreClient;
use super::{
    COLD_KEYS, HOT_KEYS, NAMESPACE, PERMITS, Primitive, RW_KEYS, SEM_KEYS, TASKS_PER_WORKER,
};

/// A runtime pause longer than this is recorded as a stall.
const STALL: Duration = Duration::from_millis(60);
const TICK: Duration = Duration::from_millis(10);

/// What one worker process is told by the coordinator.
#[derive(Clone, Debug)]
pub struct WorkerArgs {
    pub url: String,
    pub replicated: bool,
    pub store_port: u16,
    pub history: PathBuf,
    pub lease: Duration,
    pub seed: u64,
    /// Worker slot (the probe key is per slot).
    pub slot: u32,
    /// What the tasks lock (at least one).
    pub primitives: Vec<Primitive>,
}

/// Runs the worker until told to stop; `Err` only when it cannot start.
pub async fn run(args: WorkerArgs) -> Result<(), String> {
    let history = Arc::new(History::create(&args.history)?);
    history.record(PROCESS, Event::Start(std::process::id()));
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::new(Notify::new());
    let exit = Arc::new(Notify::new());
    spawn_stdin_reader(stop.clone(), stopped.clone(), exit.clone());
    tokio::spawn(stall_detector(history.clone()));

    let client = connect(&args).await?;
    let locks = client
        .lock_with::<str>(LockOptions::new().namespace(NAMESPACE).lease(args.lease))
        .map_err(|e| format!("lock options: {e}"))?;
    let options = LockOptions::new().namespace(NAMESPACE).lease(args.lease);
    let rw = client
        .rw_lock_with::<str>(options.clone())
        .map_err(|e| format!("read-write lock options: {e}"))?;
    let sem = client
        .semaphore_with::<str>(PERMITS, options)
        .map_err(|e| format!("semaphore options: {e}"))?;
    let store = Arc::new(StoreClient::connect(args.store_port).await?);

    let mut tasks = Vec::new();
    for task in 0..TASKS_PER_WORKER {
        let ctx = TaskCtx {
            task,
            locks: locks.clone(),
            rw: rw.clone(),
            sem: sem.clone(),
            primitives: args.primitives.clone(),
            store: store.clone(),
            history: history.clone(),
            lease: args.lease,
        };
        let rng = StdRng::seed_from_u64(args.seed ^ (u64::from(args.slot) << 32) ^ u64::from(task));
        tasks.push(tokio::spawn(ctx.run(rng, stop.clone(), stopped.clone())));
    }
    for task in tasks {
        let _ = task.await;
    }
    probe(&locks, &history, args.slot, args.lease).await;
    client.quit().await;
    store.quit().await;
    println!("stopped");
    let _ = std::io::stdout().flush();
    exit.notified().await;
    Ok(())
}

async fn connect(args: &WorkerArgs) -> Result<LockClient, String> {
    // A worker respawned during a fault may find the servers down for a while.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let result = LockClient::builder()
            .url(&args.url)
            .replicated(args.replicated)
            .command_timeout((args.lease * 2).max(Duration::from_secs(1)))
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await;
        match result {
            Ok(client) => return Ok(client),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(format!("connecting to {}: {e}", args.url));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// `stop` sets the flag and wakes waiting tasks; `exit` or end of input lets the process exit.
fn spawn_stdin_reader(stop: Arc<AtomicBool>, stopped: Arc<Notify>, exit: Arc<Notify>) {
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            match line.as_deref().map(str::trim) {
                Ok("stop") => {
                    stop.store(true, Ordering::SeqCst);
                    stopped.notify_waiters();
                }
                Ok("exit") | Err(_) => break,
                Ok(_) => {}
            }
        }
        stop.store(true, Ordering::SeqCst);
        stopped.notify_waiters();
        exit.notify_one();
    });
}

/// Records every gap longer than [`STALL`] in the runtime's progress (CPU starvation, SIGSTOP).
async fn stall_detector(history: Arc<History>) {
    let mut last = std::time::Instant::now();
    loop {
        tokio::time::sleep(TICK).await;
        let now = std::time::Instant::now();
        let gap = now.duration_since(last);
        if gap > STALL + TICK {
            let ms = u64::try_from(gap.as_millis()).unwrap_or(u64::MAX);
            history.record(PROCESS, Event::Stall { ms });
        }
        last = now;
    }
}

/// The recovery check: one acquisition of this worker's own key within 2 × lease.
async fn probe(locks: &Locks<str>, history: &History, slot: u32, lease: Duration) {
    let started = std::time::Instant::now();
    let key = format!("probe-{slot}");
    let result = locks.with_lock(key.as_str(), lease * 2, async {}).await;
    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    if let Err(e) = &result {
        eprintln!("{} probe: {e}", super::clock::now_ns());
    }
    history.record(
        PROCESS,
        Event::Probe {
            ok: result.is_ok(),
            ms,
        },
    );
}

struct TaskCtx {
    task: u32,
    locks: Locks<str>,
    rw: RwLocks<str>,
    sem: Semaphores<str>,
    primitives: Vec<Primitive>,
    store: Arc<StoreClient>,
    history: Arc<History>,
    lease: Duration,
}

/// One call a task makes.
#[derive(Clone, Copy, Debug)]
enum Op {
    Mutex(&'static str),
    /// Two distinct mutex keys, in the caller's order.
    Multi([&'static str; 2]),
    Read(&'static str),
    Write(&'static str),
    Permit(&'static str),
}

impl TaskCtx {
    async fn run(self, mut rng: StdRng, stop: Arc<AtomicBool>, stopped: Arc<Notify>) {
        while !stop.load(Ordering::SeqCst) {
            // Drawn only when there is a choice, so a mutex-only run replays earlier seeds.
            let primitive = match self.primitives.as_slice() {
                [one] => *one,
                list => list[rng.random_range(0..list.len())],
            };
            let op = match primitive {
                Primitive::Mutex => Op::Mutex(mutex_key(&mut rng)),
                Primitive::Multi => {
                    let first = mutex_key(&mut rng);
                    let mut second = mutex_key(&mut rng);
                    while second == first {
                        second = mutex_key(&mut rng);
                    }
                    Op::Multi([first, second])
                }
                Primitive::RwLock => {
                    let key = RW_KEYS[rng.random_range(0..RW_KEYS.len())];
                    if rng.random_bool(0.6) {
                        Op::Read(key)
                    } else {
                        Op::Write(key)
                    }
                }
                Primitive::Semaphore => Op::Permit(SEM_KEYS[rng.random_range(0..SEM_KEYS.len())]),
            };
            let try_lock = rng.random_bool(0.2);
            // Most bodies are short; some span several renewals.
            let hold = match rng.random_range(0..100) {
                0..85 => Duration::from_millis(rng.random_range(1..15)),
                85..96 => self.lease.mul_f64(rng.random_range(0.3..1.0)),
                _ => self.lease.mul_f64(rng.random_range(1.0..2.5)),
            };
            let wait = self.lease.mul_f64(rng.random_range(0.5..3.0));
            self.once(op, try_lock, hold, wait).await;
            let pause = Duration::from_millis(rng.random_range(0..20));
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = stopped.notified() => {}
            }
        }
    }

    async fn once(&self, op: Op, try_lock: bool, hold: Duration, wait: Duration) {
        let key = match op {
            Op::Mutex(key)
            | Op::Multi([key, _])
            | Op::Read(key)
            | Op::Write(key)
            | Op::Permit(key) => key,
        };
        self.history.record(
            self.task,
            Event::Invoke {
                key: key.to_owned(),
                try_lock,
            },
        );
        let called = std::time::Instant::now();
        let result = match (op, try_lock) {
            (Op::Mutex(key), true) => self.locks.try_with_lock(key, self.body(op, hold)).await,
            (Op::Mutex(key), false) => self
                .locks
                .with_lock(key, wait, self.body(op, hold))
                .await
                .map(Some),
            (Op::Multi(keys), true) => self.locks.try_with_locks(&keys, self.body(op, hold)).await,
            (Op::Multi(keys), false) => self
                .locks
                .with_locks(&keys, wait, self.body(op, hold))
                .await
                .map(Some),
            (Op::Read(key), true) => self.rw.try_read(key, self.body(op, hold)).await,
            (Op::Read(key), false) => self.rw.read(key, wait, self.body(op, hold)).await.map(Some),
            (Op::Write(key), true) => self.rw.try_write(key, self.body(op, hold)).await,
            (Op::Write(key), false) => self
                .rw
                .write(key, wait, self.body(op, hold))
                .await
                .map(Some),
            (Op::Permit(key), true) => self.sem.try_acquire(key, self.body(op, hold)).await,
            (Op::Permit(key), false) => self
                .sem
                .acquire(key, wait, self.body(op, hold))
                .await
                .map(Some),
        };
        let event = match result {
            Ok(Some(())) => Event::Released {
                key: key.to_owned(),
            },
            Ok(None) => Event::Busy {
                key: key.to_owned(),
            },
            Err(e) => {
                // The whole message (the history keeps only its kind), for whoever reads a
                // failed run: `<monotonic ns> task <n>: <error>` in the worker's stderr file.
                eprintln!("{} task {}: {e}", super::clock::now_ns(), self.task);
                let mut event = error_event(key, &e);
                // A timeout past its bound (the README: about 25 ms past the wait) is marked
                // `:late`; the summary counts it (a pause of this process also makes one).
                let limit = if try_lock {
                    sage_lock::TRY_LOCK_RETRY_WINDOW
                } else {
                    wait
                };
                if let (LockError::TimedOut { .. }, Event::Error { kind, .. }) = (&e, &mut event)
                    && called.elapsed() > limit + LATE_TIMEOUT
                {
                    kind.push_str(":late");
                    eprintln!(
                        "{} task {}: late by {:?} ({:?} to wait)",
                        super::clock::now_ns(),
                        self.task,
                        called.elapsed().saturating_sub(limit),
                        limit
                    );
                }
                event
            }
        };
        self.history.record(self.task, event);
    }

    /// The critical section. Exclusive holders (the mutex, a writer, both keys of
    /// `with_locks`) do a fenced read of each key, hold, and a fenced write of each value plus
    /// one, with each key's own token; readers and permit holders only hold. Every key held is
    /// recorded as acquired first, and each key's write as done after.
    async fn body(&self, op: Op, hold: Duration) {
        let lease = sage_lock::current_lease();
        let token_of = |key: &str| {
            lease
                .as_ref()
                .and_then(|lease| lease.fencing_token_of(key))
                .unwrap_or(0)
        };
        let acquired = |key: &str, hold| {
            self.history.record(
                self.task,
                Event::Acquired {
                    key: key.to_owned(),
                    token: token_of(key),
                    hold,
                },
            );
        };
        let (keys, writes): (&[&str], bool) = match &op {
            Op::Mutex(key) | Op::Write(key) => {
                acquired(key, Hold::Exclusive);
                (std::slice::from_ref(key), true)
            }
            Op::Multi(keys) => {
                for key in keys {
                    acquired(key, Hold::Exclusive);
                }
                (keys, true)
            }
            Op::Read(key) => {
                acquired(key, Hold::Shared);
                (std::slice::from_ref(key), false)
            }
            Op::Permit(key) => {
                acquired(key, Hold::Permit(PERMITS));
                (std::slice::from_ref(key), false)
            }
        };
        let writes = if writes {
            let tokens: Vec<(&str, u64)> = keys.iter().map(|key| (*key, token_of(key))).collect();
            self.read_modify_write(&tokens, hold).await
        } else {
            tokio::time::sleep(hold).await;
            vec![WriteOutcome::NoWrite]
        };
        let valid = lease.as_ref().is_some_and(sage_lock::Lease::is_valid);
        for (key, write) in keys.iter().zip(writes) {
            self.history.record(
                self.task,
                Event::Done {
                    key: (*key).to_owned(),
                    token: token_of(key),
                    write,
                    valid,
                },
            );
        }
    }

    /// Fenced read of each key, hold, fenced write of each value plus one: one outcome per key.
    async fn read_modify_write(&self, keys: &[(&str, u64)], hold: Duration) -> Vec<WriteOutcome> {
        let mut values = Vec::with_capacity(keys.len());
        for (key, token) in keys {
            values.push(self.store.read(key, *token).await);
        }
        tokio::time::sleep(hold).await;
        let mut outcomes = Vec::with_capacity(keys.len());
        for ((key, token), value) in keys.iter().zip(values) {
            outcomes.push(match value {
                Ok(Some(value)) => match self.store.write(key, *token, value + 1).await {
                    Ok(true) => WriteOutcome::Accepted,
                    Ok(false) => WriteOutcome::Rejected,
                    Err(_) => WriteOutcome::Failed,
                },
                Ok(None) => WriteOutcome::ReadRejected,
                Err(_) => WriteOutcome::Failed,
            });
        }
        outcomes
    }
}

/// How far past its wait (or the try window) a `TimedOut` may come before it is marked late:
/// the README's 25 ms, plus scheduling slack on a loaded 2-core machine.
const LATE_TIMEOUT: Duration = Duration::from_millis(250);

/// A mutex key: hot most of the time.
fn mutex_key(rng: &mut StdRng) -> &'static str {
    if rng.random_bool(0.7) {
        HOT_KEYS[rng.random_range(0..HOT_KEYS.len())]
    } else {
        COLD_KEYS[rng.random_range(0..COLD_KEYS.len())]
    }
}

fn error_event(key: &str, error: &LockError) -> Event {
    let kind = match error {
        LockError::LockLost { reason, .. } => format!(
            "lock_lost:{}",
            match reason {
                LossReason::NotOwner => "not_owner",
                LossReason::RenewalFailed(_) => "renewal_failed",
                LossReason::NotAcknowledged { .. } => "not_acknowledged",
                LossReason::RoleChanged(_) => "role_changed",
                LossReason::ExpiredBeforeStart => "expired_before_start",
                _ => "other",
            }
        ),
        LockError::TimedOut { reason, .. } => format!(
            "timed_out:{}",
            match reason {
                TimeoutReason::Busy => "busy",
                TimeoutReason::NotAcknowledged { .. } => "not_acknowledged",
                TimeoutReason::Unavailable(_) => "unavailable",
                TimeoutReason::PoolExhausted { .. } => "pool_exhausted",
                TimeoutReason::HeldByThisTask => "held_by_this_task",
                TimeoutReason::BehindOwnHold => "behind_own_hold",
                _ => "other",
            }
        ),
        // With the client's error: the summary counts each cause on its own.
        LockError::Backend { context, source } => format!(
            "backend:{}:{}",
            field_text(context),
            field_text(&source.to_string())
        ),
        LockError::InvalidArgument { argument, .. } => format!("invalid:{argument}"),
        _ => "other".to_owned(),
    };
    Event::Error {
        key: key.to_owned(),
        kind,
    }
}
