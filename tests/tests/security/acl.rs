//! ACL: a user limited to its namespace's keys and release channels, with exactly the commands
//! the README documents ([`ACL_COMMANDS`]), runs every operation; a user missing one
//! permission gets an error that names the command (or key) and the permission.

use std::time::{Duration, Instant};

use harness::{Reply, Server, ServerKind};
use sage_lock::{LockClient, LockError, LockOptions, Locks, LossReason};

/// The commands the README's ACL rule grants, verbatim (the README is checked to contain the
/// whole rule, see [`readme_documents_the_tested_rule`]).
pub const ACL_COMMANDS: &str = "-@all +evalsha +eval +get +set +del +exists +incr +pexpire \
+pttl +pexpiretime +time +type +lindex +lpop +lrem +rpush +zadd +zcard +zrange +zrem +zremrangebyscore \
+zscore +spublish +ssubscribe +sunsubscribe +ping +client|id +info +role +wait +client|unblock +reset \
+scan";

const PASSWORD: &str = "acl-test-password";

/// The README's rule for namespace `ns` (the README shows it for user and namespace `app`).
fn rule(user: &str, ns: &str) -> String {
    format!(
        "ACL SETUSER {user} on >PASSWORD resetkeys ~{{{ns}:* resetchannels &{{{ns}:*}}:released \
         {ACL_COMMANDS}"
    )
}

/// Applies `rule` (an `ACL SETUSER ...` line, `PASSWORD` standing for [`PASSWORD`]), with
/// `change` applied to its words, on `server`.
fn set_user(server: &Server, rule: &str, change: impl Fn(Vec<String>) -> Vec<String>) {
    let words: Vec<String> = rule
        .split_whitespace()
        .map(|word| word.replace(">PASSWORD", &format!(">{PASSWORD}")))
        .collect();
    let words = change(words);
    let args: Vec<&str> = words.iter().map(String::as_str).collect();
    server.cmd_ok(&args);
}

/// A fresh user and namespace on `server`, set up by the documented rule with `change`.
struct User {
    name: String,
    ns: String,
    url: String,
}

impl User {
    fn new(server: &Server, change: impl Fn(Vec<String>) -> Vec<String>) -> User {
        let id = rand::random::<u32>();
        let (name, ns) = (format!("acl-{id}"), format!("app-{id}"));
        set_user(server, &rule(&name, &ns), change);
        let url = format!("redis://{name}:{PASSWORD}@127.0.0.1:{}", server.port());
        User { name, ns, url }
    }

    async fn client(&self, replicated: bool) -> LockClient {
        LockClient::builder()
            .url(&self.url)
            .replicated(replicated)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect as {}: {e}", self.name))
    }

    fn options(&self, lease: Duration) -> LockOptions {
        LockOptions::new().namespace(self.ns.as_str()).lease(lease)
    }

    /// The server's `ACL LOG` entries about this user (denied commands, keys, channels).
    fn denials(&self, server: &Server) -> Vec<String> {
        let log = server.cmd_ok(&["ACL", "LOG", "200"]);
        log.as_array()
            .unwrap_or_default()
            .iter()
            .map(Reply::to_plain)
            .filter(|entry| entry.contains(&self.name))
            .collect()
    }
}

fn without(words: &[&str]) -> impl Fn(Vec<String>) -> Vec<String> {
    let words: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
    move |rule: Vec<String>| rule.into_iter().filter(|w| !words.contains(w)).collect()
}

#[test]
fn readme_documents_the_tested_rule() {
    let readme = include_str!("../../../README.md");
    let documented = rule("app", "app");
    assert!(
        readme.contains(&documented),
        "README.md must contain the tested ACL rule verbatim:\n{documented}"
    );
}

/// Every operation, as the documented user: nothing is denied (the ACL log stays empty, so the
/// release notifications were not silently replaced by polling either).
async fn every_operation(server: &Server, replicated: bool) {
    let user = User::new(server, |rule| rule);
    let client = user.client(replicated).await;
    let lease = Duration::from_millis(300);
    let locks: Locks<str> = client.lock_with(user.options(lease)).expect("options");

    assert_eq!(
        locks
            .with_lock("a", Duration::from_secs(2), async { 1 })
            .await
            .expect("with_lock"),
        1
    );
    // Renewal of a short lease, a busy try, the release.
    let renewed = locks
        .with_lock("b", Duration::from_secs(2), async {
            tokio::time::sleep(Duration::from_millis(900)).await;
            locks.try_with_lock("b", async {}).await.expect("busy try")
        })
        .await
        .expect("renewed");
    assert_eq!(renewed, None, "the held lock was busy for a try");
    assert!(client.stats().renewals >= 2, "{:?}", client.stats());
    assert_eq!(
        locks.try_with_lock("b", async { 2 }).await.expect("try"),
        Some(2)
    );

    // Fair waiting: a queued waiter, woken by the release notification.
    let (release, holder) = harness::hold_by_hand(
        &client
            .lock_with::<String>(user.options(lease))
            .expect("options"),
        "c",
    )
    .await;
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .with_lock("c", Duration::from_secs(5), async { Instant::now() })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    let _ = release.send(());
    holder.await.expect("holder");
    let woke = waiter.await.expect("waiter task").expect("waiter acquired");
    assert!(woke.duration_since(released) < Duration::from_secs(2));

    // Multi-key, semaphore, read-write lock.
    locks
        .with_locks(&["m1", "m2"], Duration::from_secs(2), async {})
        .await
        .expect("with_locks");
    assert_eq!(
        locks
            .try_with_locks(&["m1", "m2"], async { 3 })
            .await
            .expect("try_with_locks"),
        Some(3)
    );
    let semaphore = client
        .semaphore_with::<str>(2, user.options(lease))
        .expect("semaphore");
    semaphore
        .acquire("s", Duration::from_secs(2), async {
            tokio::time::sleep(Duration::from_millis(500)).await;
        })
        .await
        .expect("semaphore acquire with renewal");
    assert_eq!(
        semaphore
            .try_acquire("s", async { 4 })
            .await
            .expect("try_acquire"),
        Some(4)
    );
    let rw = client.rw_lock_with::<str>(user.options(lease)).expect("rw");
    rw.read("r", Duration::from_secs(2), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
    })
    .await
    .expect("read with renewal");
    rw.write("r", Duration::from_secs(2), async {})
        .await
        .expect("write");
    assert_eq!(
        rw.try_read("r", async { 5 }).await.expect("try_read"),
        Some(5)
    );
    assert_eq!(
        rw.try_write("r", async { 6 }).await.expect("try_write"),
        Some(6)
    );

    // Operator tools, on a lock held by hand.
    let by_hand = client
        .lock_with::<String>(user.options(lease))
        .expect("options");
    let (release, holder) = harness::hold_by_hand(&by_hand, "op").await;
    assert!(locks.is_locked("op").await.expect("is_locked"));
    assert!(locks.holder("op").await.expect("holder").is_some());
    let held = locks.scan().await.expect("scan");
    assert!(held.iter().any(|lock| lock.key == "op"), "{held:?}");
    assert!(
        locks
            .force_unlock("op", "acl test")
            .await
            .expect("force_unlock")
    );
    let _ = release.send(());
    let _ = holder.await;

    // A dedicated connection goes back to the pool through RESET.
    let loan = client
        .dedicated_connection(Duration::from_secs(2))
        .await
        .expect("dedicated connection");
    drop(loan);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let denials = user.denials(server);
    assert!(
        denials.is_empty(),
        "{} (replicated: {replicated}): the documented rule denied: {denials:#?}",
        server.kind()
    );
    client.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_documented_rule_runs_every_operation_standalone() {
    for kind in ServerKind::ALL {
        every_operation(harness::shared(kind), false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_documented_rule_runs_every_operation_replicated() {
    for kind in ServerKind::ALL {
        let deployment = harness::shared_replicated(kind);
        every_operation(&deployment.primary, true).await;
    }
}

/// Runs a `with_lock` as a user whose rule was changed by `change`; returns its error text.
async fn with_lock_error(
    server: &Server,
    replicated: bool,
    change: impl Fn(Vec<String>) -> Vec<String>,
) -> String {
    let user = User::new(server, change);
    let client = user.client(replicated).await;
    let locks: Locks<str> = client
        .lock_with(user.options(Duration::from_secs(5)))
        .expect("options");
    let error = locks
        .with_lock("k", Duration::from_secs(2), async {})
        .await
        .expect_err("the ACL should deny the acquisition");
    assert!(matches!(error, LockError::Backend { .. }), "{error:?}");
    client.quit().await;
    eprintln!("denied as expected: {error}");
    error.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_missing_script_commands_are_named() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let text = with_lock_error(server, false, without(&["+evalsha", "+eval"])).await;
        assert!(
            text.contains("NOPERM")
                && text.to_lowercase().contains("'evalsha' command")
                && text.contains("grant +evalsha"),
            "{kind}: {text}"
        );
        // A command the acquire script calls: the server names only the script's line.
        let text = with_lock_error(server, false, without(&["+incr"])).await;
        assert!(
            text.contains("script") && text.contains("grant +incr"),
            "{kind}: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_missing_key_access_is_named() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        // Keys of another namespace only.
        let text = with_lock_error(server, false, |rule| {
            rule.into_iter()
                .map(|w| {
                    if w.starts_with("~{") {
                        "~{other:*".to_owned()
                    } else {
                        w
                    }
                })
                .collect()
        })
        .await;
        assert!(
            text.contains("NOPERM") && text.to_lowercase().contains("key") && text.contains("~{"),
            "{kind}: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_missing_wait_on_a_replicated_deployment_is_named() {
    for kind in ServerKind::ALL {
        let primary = &harness::shared_replicated(kind).primary;
        let text = with_lock_error(primary, true, without(&["+wait"])).await;
        assert!(
            text.contains("NOPERM") && text.to_lowercase().contains("'wait' command"),
            "{kind}: {text}"
        );
        let text = with_lock_error(primary, true, without(&["+role"])).await;
        assert!(
            text.contains("NOPERM") && text.to_lowercase().contains("'role' command"),
            "{kind}: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_revoked_during_a_hold_is_a_named_renewal_loss() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let user = User::new(server, |rule| rule);
        let client = user.client(false).await;
        let locks: Locks<str> = client
            .lock_with(user.options(Duration::from_millis(300)))
            .expect("options");
        let name = user.name.clone();
        let error = locks
            .with_lock("k", Duration::from_secs(2), async {
                server.cmd_ok(&["ACL", "SETUSER", &name, "resetkeys", "~{other:*"]);
                tokio::time::sleep(Duration::from_secs(2)).await;
            })
            .await
            .expect_err("the renewal is denied");
        let text = error.to_string();
        eprintln!("lost as expected: {text}");
        assert!(
            matches!(
                &error,
                LockError::LockLost {
                    reason: LossReason::RenewalFailed(_),
                    ..
                }
            ) && text.contains("NOPERM"),
            "{kind}: {text}"
        );
        client.quit().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_operator_tools_name_the_missing_permission() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let user = User::new(server, without(&["+scan"]));
        let client = user.client(false).await;
        let locks: Locks<str> = client
            .lock_with(user.options(Duration::from_secs(5)))
            .expect("options");
        let error = locks.scan().await.expect_err("SCAN is denied");
        let text = error.to_string();
        assert!(
            matches!(error, LockError::Backend { .. })
                && text.contains("NOPERM")
                && text.to_lowercase().contains("'scan' command"),
            "{kind}: {text}"
        );
        // The inspect script's PEXPIRETIME (Redis names only the script's line), on a held lock.
        let by_hand = client
            .lock_with::<String>(user.options(Duration::from_secs(5)))
            .expect("options");
        let (release, holder) = harness::hold_by_hand(&by_hand, "held").await;
        set_user(
            server,
            &format!("ACL SETUSER {} -pexpiretime", user.name),
            |r| r,
        );
        let denied = locks.holder("held").await;
        set_user(
            server,
            &format!("ACL SETUSER {} +pexpiretime", user.name),
            |r| r,
        );
        let _ = release.send(());
        holder.await.expect("holder released");
        let error = denied.expect_err("PEXPIRETIME is denied");
        let text = error.to_string();
        eprintln!("denied as expected: {text}");
        assert!(
            matches!(error, LockError::Backend { .. }) && text.contains("grant +pexpiretime"),
            "{kind}: {text}"
        );
        // No key access: inspection and forced release name the keys.
        set_user(
            server,
            &format!("ACL SETUSER {} resetkeys ~{{other:*", user.name),
            |r| r,
        );
        for error in [
            locks.is_locked("k").await.expect_err("is_locked denied"),
            locks.holder("k").await.expect_err("holder denied"),
            locks
                .force_unlock("k", "test")
                .await
                .expect_err("force_unlock denied"),
        ] {
            let text = error.to_string();
            eprintln!("denied as expected: {text}");
            assert!(
                matches!(error, LockError::Backend { .. })
                    && text.contains("NOPERM")
                    && text.contains("~{"),
                "{kind}: {text}"
            );
        }
        client.quit().await;
    }
}

/// Without the channel permission, waiters still get the lock (by polling); the denial shows
/// in the server's ACL log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_without_channels_waiters_fall_back_to_polling() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let user = User::new(server, |rule| {
            rule.into_iter().filter(|w| !w.starts_with('&')).collect()
        });
        let client = user.client(false).await;
        let lease = Duration::from_secs(5);
        let by_hand = client
            .lock_with::<String>(user.options(lease))
            .expect("options");
        let locks: Locks<str> = client.lock_with(user.options(lease)).expect("options");
        let (release, holder) = harness::hold_by_hand(&by_hand, "c").await;
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move {
                locks
                    .with_lock("c", Duration::from_secs(5), async { Instant::now() })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        let _ = release.send(());
        holder.await.expect("holder");
        let woke = waiter
            .await
            .expect("waiter task")
            .expect("waiter acquired by polling");
        assert!(woke.duration_since(released) < Duration::from_secs(2));
        client.quit().await;
        let denials = user.denials(server);
        assert!(
            denials
                .iter()
                .any(|entry| entry.contains("\"channel\"") && entry.contains(":released")),
            "{kind}: expected the subscription's channel denial in ACL LOG: {denials:#?}"
        );
    }
}

/// A `Write` sink shared with a tracing subscriber.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut out) = self.0.lock() {
            out.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A release the ACL denies: the body's result is returned, the failure is logged with the
/// server's message and the grant, and the key expires with its lease.
#[tokio::test]
async fn acl_denied_release_is_logged_with_the_grant() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let user = User::new(server, |rule| rule);
        let client = user.client(false).await;
        let locks: Locks<str> = client
            .lock_with(user.options(Duration::from_secs(5)))
            .expect("options");
        let name = user.name.clone();
        let out = locks
            .with_lock("k", Duration::from_secs(2), async {
                server.cmd_ok(&["ACL", "SETUSER", &name, "resetkeys", "~{other:*"]);
                8
            })
            .await
            .expect("the body ran; a failed release is not the caller's error");
        assert_eq!(out, 8);
        let key = String::from_utf8(LockClient::server_key(&user.ns, "k")).expect("UTF-8 key");
        let pttl = server.cmd_ok(&["PTTL", &key]).as_int().unwrap_or(-2);
        assert!(
            pttl > 0,
            "{kind}: the lock key should live on until its lease ends: {pttl}"
        );
        client.quit().await;
    }
    let logs = String::from_utf8_lossy(&captured.0.lock().map(|l| l.clone()).unwrap_or_default())
        .into_owned();
    assert_eq!(
        logs.matches("release failed").count(),
        2,
        "one failed release per server kind:\n{logs}"
    );
    assert!(
        logs.contains("NOPERM") && logs.contains("grant ~{NAMESPACE:*"),
        "{logs}"
    );
}
