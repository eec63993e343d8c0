//! `#[locked]` against real Redis and Valkey servers: the key the macro builds is the key a
//! caller builds by hand, annotated functions exclude each other, acquisition errors convert
//! through `From<LockError>`, body errors come back untouched, and `client = self.locks` works in
//! inherent, native-trait and `#[async_trait]` impls. (The global client is in `macro_global.rs`:
//! it can only be installed once per process.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use harness::ServerKind;
use sage_lock::{LockClient, LockError, LockOptions, Locks, current_lease, locked};
use tokio::sync::oneshot;

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Body(&'static str),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

async fn client(kind: ServerKind) -> LockClient {
    let url = harness::shared(kind).url();
    LockClient::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect to {} at {url}: {e}", kind.name()))
}

fn hand_locks(client: &LockClient, namespace: &str) -> Locks<String> {
    client
        .lock_with::<String>(LockOptions::new().namespace(namespace))
        .expect("valid options")
}

/// Holds `key` by hand (through `Locks<String>`) until the returned sender is dropped or fired.
async fn release(release: oneshot::Sender<()>, holder: tokio::task::JoinHandle<()>) {
    let _ = release.send(());
    holder.await.expect("the holder task");
}

// ---------------------------------------------------------------------------------------------
// The macro's key is the hand-built key.

const KEYS_NS: &str = "macro-key-equality";

/// What the body saw: its lease's namespace and key.
type Seen = (String, String);

fn seen() -> Seen {
    let lease = current_lease().expect("the body runs inside the lock");
    (lease.namespace().to_owned(), lease.key().to_owned())
}

#[locked(key = "account:{id}", try_lock, namespace = "macro-key-equality", client = client)]
async fn settle(client: &LockClient, id: u64) -> Result<Option<Seen>, AppError> {
    Ok(seen())
}

#[locked(key = "account:<id>", try_lock, namespace = "macro-key-equality", client = client)]
async fn settle_card(client: &LockClient, id: u64) -> Result<Option<Seen>, AppError> {
    Ok(seen())
}

#[locked(key = format!("account:{id}"), try_lock, namespace = "macro-key-equality", client = client)]
async fn settle_expression(client: &LockClient, id: u64) -> Result<Option<Seen>, AppError> {
    Ok(seen())
}

#[locked(key = "{{account}}:{id}", try_lock, namespace = "macro-key-equality", client = client)]
async fn settle_escaped(client: &LockClient, id: u64) -> Result<Option<Seen>, AppError> {
    Ok(seen())
}

#[locked(key = "account:{id}", wait = "5s", namespace = "macro-key-equality", client = client)]
async fn hold_with_macro(
    client: &LockClient,
    id: u64,
    entered: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
) -> Result<Seen, AppError> {
    let _ = entered.send(());
    let _ = release.await;
    Ok(seen())
}

/// `#[tracing::instrument]` above a `try_lock` function (it did not compile: helper 28).
#[tracing::instrument(skip(client))]
#[locked(key = "account:{id}", try_lock, namespace = "macro-key-equality", client = client)]
async fn settle_instrumented(client: &LockClient, id: u64) -> Result<Option<Seen>, AppError> {
    Ok(seen())
}

#[async_trait::async_trait]
trait Settle {
    async fn settle(&self, id: u64) -> Result<Option<Seen>, AppError>;
}

struct InstrumentedSettler(LockClient);

#[async_trait::async_trait]
impl Settle for InstrumentedSettler {
    #[tracing::instrument(skip(self))]
    #[locked(key = "account:{id}", try_lock, namespace = "macro-key-equality", client = self.0)]
    async fn settle(&self, id: u64) -> Result<Option<Seen>, AppError> {
        Ok(seen())
    }
}

fn is_free(result: Result<Option<Seen>, AppError>, key: &str) -> bool {
    match result {
        Ok(Some((namespace, seen_key))) => {
            assert_eq!(namespace, KEYS_NS);
            assert_eq!(seen_key, key);
            true
        }
        Ok(None) => false,
        Err(error) => panic!("try_lock on {key}: {error:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn macro_key_equals_hand_built_key() {
    for kind in ServerKind::ALL {
        let client = client(kind).await;
        let hand = hand_locks(&client, KEYS_NS);
        let kind = kind.name();

        // Held by hand: every spelling of the macro key is busy; other keys are free.
        let (release_tx, holder) = harness::hold_by_hand(&hand, "account:42").await;
        assert!(
            !is_free(settle(&client, 42).await, "account:42"),
            "{kind}: template"
        );
        assert!(
            !is_free(settle_card(&client, 42).await, "account:42"),
            "{kind}: card"
        );
        assert!(
            !is_free(settle_expression(&client, 42).await, "account:42"),
            "{kind}: expression key"
        );
        assert!(
            is_free(settle(&client, 43).await, "account:43"),
            "{kind}: other id"
        );
        let instrumented = InstrumentedSettler(client.clone());
        assert!(
            !is_free(settle_instrumented(&client, 42).await, "account:42")
                && !is_free(instrumented.settle(42).await, "account:42"),
            "{kind}: instrumented"
        );
        assert!(
            is_free(settle_instrumented(&client, 43).await, "account:43")
                && is_free(instrumented.settle(43).await, "account:43"),
            "{kind}: instrumented, other id"
        );
        assert!(
            is_free(settle_escaped(&client, 42).await, "{account}:42"),
            "{kind}: escaped braces name another key"
        );
        release(release_tx, holder).await;
        assert!(
            is_free(settle(&client, 42).await, "account:42"),
            "{kind}: after release"
        );

        // `{{`/`}}` escapes: "{account}:7" by hand is the escaped template's key.
        let (release_tx, holder) = harness::hold_by_hand(&hand, "{account}:7").await;
        assert!(
            !is_free(settle_escaped(&client, 7).await, "{account}:7"),
            "{kind}: escapes"
        );
        release(release_tx, holder).await;

        // The other way round: held by the macro, busy by hand.
        let (entered_tx, entered_rx) = oneshot::channel();
        let (release_tx, release_rx) = oneshot::channel();
        let macro_holder = {
            let client = client.clone();
            tokio::spawn(async move { hold_with_macro(&client, 42, entered_tx, release_rx).await })
        };
        entered_rx.await.expect("the macro acquired the lock");
        let by_hand = hand
            .try_with_lock("account:42", async {})
            .await
            .expect("try_lock by hand");
        assert!(
            by_hand.is_none(),
            "{kind}: the macro's lock is the hand-built key"
        );
        let _ = release_tx.send(());
        let (namespace, key) = macro_holder
            .await
            .expect("macro task")
            .expect("the macro-held lock");
        assert_eq!((namespace.as_str(), key.as_str()), (KEYS_NS, "account:42"));
    }
}

// ---------------------------------------------------------------------------------------------
// Exclusion through annotated functions.

#[derive(Default)]
struct Shared {
    counter: AtomicU64,
    inside: AtomicUsize,
    overlaps: AtomicUsize,
}

#[locked(key = "counter:{name}", wait = "60s", lease = "5s", namespace = "macro-contention", client = client)]
async fn increment(
    client: LockClient,
    name: &'static str,
    shared: Arc<Shared>,
) -> Result<u64, AppError> {
    if shared.inside.fetch_add(1, Ordering::SeqCst) != 0 {
        shared.overlaps.fetch_add(1, Ordering::SeqCst);
    }
    // A non-atomic read-modify-write: only exclusion keeps it exact.
    let value = shared.counter.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1)).await;
    shared.counter.store(value + 1, Ordering::SeqCst);
    shared.inside.fetch_sub(1, Ordering::SeqCst);
    Ok(value + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_through_annotated_fns_is_exclusive() {
    const TASKS: u64 = 8;
    const ROUNDS: u64 = 8;
    for kind in ServerKind::ALL {
        let client = client(kind).await;
        let shared = Arc::new(Shared::default());
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let client = client.clone();
                let shared = Arc::clone(&shared);
                // Spawning proves the annotated function's future is `Send`.
                tokio::spawn(async move {
                    for _ in 0..ROUNDS {
                        increment(client.clone(), "shared", Arc::clone(&shared))
                            .await
                            .expect("increment under the lock");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        assert_eq!(
            shared.counter.load(Ordering::SeqCst),
            TASKS * ROUNDS,
            "{}",
            kind.name()
        );
        assert_eq!(shared.overlaps.load(Ordering::SeqCst), 0, "{}", kind.name());
    }
}

// ---------------------------------------------------------------------------------------------
// Errors.

const ERRORS_NS: &str = "macro-errors";

#[locked(key = "busy:{id}", wait = "200ms", namespace = "macro-errors", client = client)]
async fn waits_briefly(client: &LockClient, id: u64, ran: &AtomicBool) -> Result<u64, AppError> {
    ran.store(true, Ordering::SeqCst);
    Ok(id)
}

#[locked(key = "busy:{id}", wait = "200ms", namespace = "macro-errors", client = client)]
async fn waits_briefly_anyhow(client: &LockClient, id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

#[locked(key = "busy:{id}", try_lock, namespace = "macro-errors", client = client)]
async fn tries(client: &LockClient, id: u64, ran: &AtomicBool) -> Result<Option<u64>, AppError> {
    ran.store(true, Ordering::SeqCst);
    Ok(id)
}

#[locked(key = "busy:{id}", wait = "2s", namespace = "macro-errors", client = client)]
async fn fails_in_body(client: &LockClient, id: u64) -> Result<u64, AppError> {
    if id > 0 {
        return Err(AppError::Body("body failed"));
    }
    Ok(id)
}

#[locked(key = "busy:{id}", try_lock, namespace = "macro-errors", client = client)]
async fn try_fails_in_body(client: &LockClient, id: u64) -> Result<Option<u64>, AppError> {
    Err(AppError::Body("try body failed"))?;
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_convert_through_from_lock_error() {
    for kind in ServerKind::ALL {
        let client = client(kind).await;
        let hand = hand_locks(&client, ERRORS_NS);
        let kind = kind.name();

        let (release_tx, holder) = harness::hold_by_hand(&hand, "busy:1").await;
        let ran = AtomicBool::new(false);
        let started = Instant::now();
        match waits_briefly(&client, 1, &ran).await {
            Err(AppError::Lock(error)) => assert!(error.is_timed_out(), "{kind}: {error}"),
            other => panic!("{kind}: expected a converted TimedOut, got {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{kind}: the wait is bounded"
        );
        assert!(!ran.load(Ordering::SeqCst), "{kind}: the body must not run");

        let error = waits_briefly_anyhow(&client, 1).await.expect_err("busy");
        let lock_error = error
            .downcast_ref::<LockError>()
            .expect("a LockError inside anyhow");
        assert!(lock_error.is_timed_out(), "{kind}: {lock_error}");

        assert!(
            matches!(tries(&client, 1, &ran).await, Ok(None)),
            "{kind}: busy is Ok(None)"
        );
        assert!(
            !ran.load(Ordering::SeqCst),
            "{kind}: a busy try_lock does not run the body"
        );
        release(release_tx, holder).await;
        assert!(
            matches!(tries(&client, 1, &ran).await, Ok(Some(1))),
            "{kind}: free"
        );
        assert!(ran.load(Ordering::SeqCst));

        // A body's own error comes back as it was, and the lock is released after it.
        assert!(matches!(
            fails_in_body(&client, 2).await,
            Err(AppError::Body("body failed"))
        ));
        assert!(matches!(
            try_fails_in_body(&client, 2).await,
            Err(AppError::Body("try body failed"))
        ));
        let free = hand
            .try_with_lock("busy:2", async {})
            .await
            .expect("try by hand");
        assert!(free.is_some(), "{kind}: released after the body's error");
    }
}

// ---------------------------------------------------------------------------------------------
// `client = self.locks` in impls.

const SELF_NS: &str = "macro-self-client";

struct Accounts {
    locks: LockClient,
    shared: Arc<LockClient>,
    tenant: String,
    balance: AtomicI64,
}

impl Accounts {
    #[locked(key = "{self.tenant}:account:{id}", wait = "5s", namespace = "macro-self-client", client = self.locks)]
    async fn deposit(&self, id: u64, amount: i64) -> Result<i64, AppError> {
        let lease = current_lease().expect("inside the lock");
        assert_eq!(lease.key(), format!("{}:account:{id}", self.tenant));
        assert_eq!(lease.namespace(), SELF_NS);
        Ok(self.balance.fetch_add(amount, Ordering::SeqCst) + amount)
    }

    #[locked(key = "{self.tenant}:account:{id}", try_lock, namespace = "macro-self-client", client = self.shared)]
    async fn try_deposit(&self, id: u64, amount: i64) -> Result<Option<i64>, AppError> {
        let _ = id;
        Ok(self.balance.fetch_add(amount, Ordering::SeqCst) + amount)
    }
}

trait Ledger {
    fn post(&self, id: u64) -> impl Future<Output = Result<String, AppError>> + Send;
}

impl Ledger for Accounts {
    #[locked(key = "{self.tenant}:ledger:{id}", wait = "5s", namespace = "macro-self-client", client = self.locks)]
    async fn post(&self, id: u64) -> Result<String, AppError> {
        let _ = id;
        Ok(current_lease().expect("inside the lock").key().to_owned())
    }
}

#[async_trait::async_trait]
trait Journal {
    async fn write(&self, id: u64, text: &str) -> Result<String, AppError>;
    async fn try_write(&self, id: u64) -> Result<Option<String>, AppError>;
}

#[async_trait::async_trait]
impl Journal for Accounts {
    #[locked(key = "{self.tenant}:journal:{id}", wait = "5s", namespace = "macro-self-client", client = self.locks)]
    async fn write(&self, id: u64, text: &str) -> Result<String, AppError> {
        let key = current_lease().expect("inside the lock").key().to_owned();
        Ok(format!("{key}={text}:{id}"))
    }

    #[locked(key = "{self.tenant}:journal:{id}", try_lock, namespace = "macro-self-client", client = self.locks)]
    async fn try_write(&self, id: u64) -> Result<Option<String>, AppError> {
        if id == 0 {
            return Err(AppError::Body("no id"));
        }
        Ok(current_lease().expect("inside the lock").key().to_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_from_self_in_impls() {
    for kind in ServerKind::ALL {
        let client = client(kind).await;
        let hand = hand_locks(&client, SELF_NS);
        let accounts = Arc::new(Accounts {
            locks: client.clone(),
            shared: Arc::new(client.clone()),
            tenant: format!("acme-{}", kind.name()),
            balance: AtomicI64::new(0),
        });
        let tenant = accounts.tenant.clone();
        let kind = kind.name();

        assert_eq!(accounts.deposit(7, 5).await.expect("deposit"), 5);
        assert_eq!(accounts.try_deposit(7, 5).await.expect("try"), Some(10));

        let (release_tx, holder) =
            harness::hold_by_hand(&hand, &format!("{tenant}:account:7")).await;
        assert!(
            accounts
                .try_deposit(7, 1)
                .await
                .expect("try while held")
                .is_none(),
            "{kind}: `{{self.tenant}}` is part of the key"
        );
        let waiting = {
            let accounts = Arc::clone(&accounts);
            tokio::spawn(async move { accounts.deposit(7, 100).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            accounts.balance.load(Ordering::SeqCst),
            10,
            "{kind}: deposit waits"
        );
        release(release_tx, holder).await;
        assert_eq!(
            waiting.await.expect("task").expect("deposit after release"),
            110
        );

        let accounts_for_task = Arc::clone(&accounts);
        let posted = tokio::spawn(async move { accounts_for_task.post(3).await })
            .await
            .expect("task")
            .expect("post");
        assert_eq!(posted, format!("{tenant}:ledger:3"));

        let written = accounts.write(4, "hello").await.expect("write");
        assert_eq!(written, format!("{tenant}:journal:4=hello:4"));
        assert_eq!(
            accounts.try_write(5).await.expect("try_write"),
            Some(format!("{tenant}:journal:5"))
        );
        assert!(matches!(
            accounts.try_write(0).await,
            Err(AppError::Body("no id"))
        ));
        let (release_tx, holder) =
            harness::hold_by_hand(&hand, &format!("{tenant}:journal:5")).await;
        assert_eq!(
            accounts.try_write(5).await.expect("busy"),
            None,
            "{kind}: async_trait try_lock"
        );
        release(release_tx, holder).await;
    }
}

// ---------------------------------------------------------------------------------------------
// `mode`, `permits` and `key = [..]` run on the primitive they name.

#[locked(key = "doc:{id}", wait = "2s", mode = "read", namespace = "macro-modes", client = client)]
async fn read_doc(client: &LockClient, id: u64, pause: Duration) -> Result<u64, AppError> {
    tokio::time::sleep(pause).await;
    Ok(id)
}

#[locked(key = "doc:{id}", try_lock, mode = "write", namespace = "macro-modes", client = client)]
async fn try_write_doc(client: &LockClient, id: u64) -> Result<Option<u64>, AppError> {
    Ok(id)
}

#[locked(key = "pool", try_lock, permits = 2, namespace = "macro-modes", client = client)]
async fn try_pool(client: &LockClient) -> Result<Option<()>, AppError> {
    Ok(())
}

#[locked(key = "pool", wait = "2s", permits = 2, namespace = "macro-modes", client = client)]
async fn hold_pool(client: &LockClient, pause: Duration) -> Result<(), AppError> {
    tokio::time::sleep(pause).await;
    Ok(())
}

#[locked(key = ["acct:{from}", "acct:{to}"], wait = "2s", namespace = "macro-modes", client = client)]
async fn transfer(client: &LockClient, from: u64, to: u64) -> Result<String, AppError> {
    Ok(current_lease()
        .map(|l| l.key().to_owned())
        .unwrap_or_default())
}

/// Readers share (a writer's try fails meanwhile), a 2-permit semaphore admits 2, several keys
/// lock the mutex keys and report the first key's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modes_use_their_primitives() {
    for kind in ServerKind::ALL {
        let client = client(kind).await;
        let id = u64::from(rand::random::<u32>());
        let pause = Duration::from_millis(300);
        let started = Instant::now();
        let (a, b, write) = tokio::join!(
            read_doc(&client, id, pause),
            read_doc(&client, id, pause),
            async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                try_write_doc(&client, id).await
            }
        );
        assert_eq!((a.expect("reader"), b.expect("reader")), (id, id));
        assert!(started.elapsed() < pause * 2, "readers did not overlap");
        assert!(
            matches!(write, Ok(None)),
            "a writer got in with readers: {write:?}"
        );
        assert!(matches!(try_write_doc(&client, id).await, Ok(Some(_))));

        let (one, two, third) = tokio::join!(
            hold_pool(&client, pause),
            hold_pool(&client, pause),
            async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                try_pool(&client).await
            }
        );
        one.expect("first permit");
        two.expect("second permit");
        assert!(
            matches!(third, Ok(None)),
            "a third holder got in: {third:?}"
        );

        let from = format!("acct:{id}");
        let locks = hand_locks(&client, "macro-modes");
        // Held by another task (nested in this task's own hold, the call fails at once:
        // `reentrancy::calls_nested_in_this_tasks_multi_key_hold`).
        let other = client.clone();
        let busy = locks
            .with_lock(&from, Duration::from_secs(1), async {
                tokio::spawn(async move {
                    tokio::time::timeout(Duration::from_millis(300), transfer(&other, id, id + 1))
                        .await
                })
                .await
                .expect("transfer task")
            })
            .await
            .expect("hand lock");
        assert!(
            busy.is_err(),
            "transfer ran while one of its keys was held: {busy:?}"
        );
        let key = transfer(&client, id, id + 1).await.expect("transfer");
        assert_eq!(key, from, "current_lease is the first key's");
    }
}

// ---------------------------------------------------------------------------------------------
// A panicking body.

const PANIC_NS: &str = "macro-panic";

#[locked(key = "job:{id}", wait = "2s", lease = "30s", namespace = "macro-panic", client = client)]
async fn panics_in_body(client: LockClient, id: u64, port: u16) -> Result<(), AppError> {
    let key = LockClient::server_key(PANIC_NS, &format!("job:{id}"));
    let key = String::from_utf8(key).expect("utf8");
    assert!(key_exists(port, &key), "held while the body runs");
    if id > 0 {
        panic!("job {id} blew up");
    }
    Ok(())
}

fn key_exists(port: u16, key: &str) -> bool {
    harness::cmd(port, &["EXISTS", key])
        .expect("EXISTS")
        .as_int()
        .expect("an integer")
        == 1
}

/// A panic in an annotated function's body reaches its caller unchanged (the spawned task's
/// `JoinError` carries the body's message), and the lock is released at once, not when its 30 s
/// lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_body_propagates_and_releases() {
    for kind in ServerKind::ALL {
        let client = client(kind).await;
        let port = harness::shared(kind).port();
        let id = 1 + u64::from(rand::random::<u32>());
        let key = String::from_utf8(LockClient::server_key(PANIC_NS, &format!("job:{id}")))
            .expect("utf8");
        let error = tokio::spawn(panics_in_body(client.clone(), id, port))
            .await
            .expect_err("the panic reaches the caller");
        assert!(error.is_panic(), "{}: {error}", kind.name());
        let payload = error.into_panic();
        let message = harness::panic_message(&*payload);
        let expected = format!("job {id} blew up");
        assert_eq!(message, Some(expected.as_str()), "{}", kind.name());
        let panicked = Instant::now();
        while key_exists(port, &key) && panicked.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            !key_exists(port, &key),
            "{}: the lock outlived the panic by {:?}",
            kind.name(),
            panicked.elapsed()
        );
        let hand = hand_locks(&client, PANIC_NS);
        let free = hand
            .try_with_lock(&format!("job:{id}"), async {})
            .await
            .expect("try by hand");
        assert!(
            free.is_some(),
            "{}: still held after the panic",
            kind.name()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// `lease` and `replica_ack` reach the lock.

const SETTINGS_NS: &str = "macro-settings";

/// The lock key's remaining time to live, seen from inside the body.
fn pttl_of(port: u16, key: &str) -> i64 {
    let key = LockClient::server_key(SETTINGS_NS, key);
    let key = String::from_utf8(key).expect("utf8");
    harness::cmd(port, &["PTTL", &key])
        .expect("PTTL")
        .as_int()
        .expect("an integer")
}

#[locked(key = "lease:{id}", wait = "2s", lease = "5s", namespace = "macro-settings", client = client)]
async fn five_second_lease(client: &LockClient, id: u64, port: u16) -> Result<i64, AppError> {
    Ok(pttl_of(port, &format!("lease:{id}")))
}

#[locked(key = "lease:{id}", wait = "2s", namespace = "macro-settings", client = client)]
async fn default_lease(client: &LockClient, id: u64, port: u16) -> Result<i64, AppError> {
    Ok(pttl_of(port, &format!("lease:{id}")))
}

#[locked(key = "ack:{id}", wait = "2s", replica_ack = false, namespace = "macro-settings", client = client)]
async fn without_ack(client: &LockClient, id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[locked(key = "ack:{id}", wait = "2s", namespace = "macro-settings", client = client)]
async fn with_ack(client: &LockClient, id: u64) -> Result<u64, AppError> {
    Ok(id)
}

/// `lease = "5s"` is the lease the key gets (not the 30 s default); `replica_ack = false` on a
/// replicated primary sends no `WAIT` (but the role check's `ROLE`), where the same function
/// without it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_and_replica_ack_reach_the_lock() {
    for kind in ServerKind::ALL {
        let client = client(kind).await;
        let port = harness::shared(kind).port();
        let id = u64::from(rand::random::<u32>());
        let five = five_second_lease(&client, id, port).await.expect("lock");
        assert!(
            (4000..=5000).contains(&five),
            "{}: PTTL {five} ms under lease = \"5s\"",
            kind.name()
        );
        let default = default_lease(&client, id, port).await.expect("lock");
        assert!(
            (25_000..=30_000).contains(&default),
            "{}: PTTL {default} ms under the default lease",
            kind.name()
        );

        let setup = harness::shared_replicated(kind);
        let primary = setup.primary.port();
        let replicated = LockClient::builder()
            .url(&setup.primary_url())
            .replicated(true)
            .connect()
            .await
            .expect("connect");
        let (waits, roles) = (
            harness::commandstats_calls(primary, "wait"),
            harness::commandstats_calls(primary, "role"),
        );
        for i in 0..3 {
            assert_eq!(
                without_ack(&replicated, id + i).await.expect("lock"),
                id + i
            );
        }
        assert_eq!(
            harness::commandstats_calls(primary, "wait"),
            waits,
            "{}: replica_ack = false sent WAIT",
            kind.name()
        );
        assert!(
            harness::commandstats_calls(primary, "role") >= roles + 3,
            "{}: not checked as a replicated deployment",
            kind.name()
        );
        assert_eq!(with_ack(&replicated, id).await.expect("lock"), id);
        assert!(
            harness::commandstats_calls(primary, "wait") > waits,
            "{}: the default acknowledges",
            kind.name()
        );
    }
}
