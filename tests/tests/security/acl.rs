//! ACL: a user limited to its namespace's keys and release channels, with exactly the commands
//! the README documents ([`ACL_COMMANDS`]), runs every operation (the denials a missing
//! permission gives are in `acl_denials.rs`).

use std::time::{Duration, Instant};

use harness::{Reply, Server, ServerKind};
use sage_lock::{LockClient, LockOptions, Locks};

/// The commands the README's ACL rule grants, verbatim (the README is checked to contain the
/// whole rule, see [`readme_documents_the_tested_rule`]).
pub const ACL_COMMANDS: &str = "-@all +evalsha +eval +get +set +del +exists +incr +pexpire \
+pttl +pexpiretime +time +type +lindex +lpop +lpush +lrem +rpush +zadd +zcard +zcount +zrange +zrem \
+zremrangebyscore +zscore +spublish +ssubscribe +sunsubscribe +ping +client|id +info +cluster|info +cluster|slots +cluster|nodes +role +wait +client|unblock +client|list +scan";

/// The commands the README's rule for the Sentinels grants (fred sends the data nodes'
/// credentials to the Sentinels too).
pub const SENTINEL_COMMANDS: &str = "-@all +sentinel|get-master-addr-by-name +sentinel|sentinels \
+sentinel|replicas +ping +client|id +info +role";

/// The README's rule for the Sentinels, for user `user`.
pub(crate) fn sentinel_rule(user: &str) -> String {
    format!("ACL SETUSER {user} on >PASSWORD {SENTINEL_COMMANDS}")
}

pub(crate) const PASSWORD: &str = "acl-test-password";

/// The README's rule for namespace `ns` (the README shows it for user and namespace `app`).
fn rule(user: &str, ns: &str) -> String {
    format!(
        "ACL SETUSER {user} on >PASSWORD resetkeys ~{{{ns}:* resetchannels &{{{ns}:*}}:released \
         {ACL_COMMANDS}"
    )
}

/// Applies `rule` (an `ACL SETUSER ...` line, `PASSWORD` standing for [`PASSWORD`]), with
/// `change` applied to its words, on `server`.
pub(crate) fn set_user(server: &Server, rule: &str, change: impl Fn(Vec<String>) -> Vec<String>) {
    let words: Vec<String> = rule
        .split_whitespace()
        .map(|word| word.replace(">PASSWORD", &format!(">{PASSWORD}")))
        .collect();
    let words = change(words);
    let args: Vec<&str> = words.iter().map(String::as_str).collect();
    server.cmd_ok(&args);
}

/// A fresh user and namespace on `server`, set up by the documented rule with `change`.
pub(crate) struct User {
    pub(crate) name: String,
    pub(crate) ns: String,
    pub(crate) url: String,
    /// Connect through a fred client configured for RESP3 (`HELLO 3 AUTH`) with the user's
    /// credentials in its `Config`, instead of the URL.
    pub(crate) resp3: bool,
}

impl User {
    pub(crate) fn new(server: &Server, change: impl Fn(Vec<String>) -> Vec<String>) -> User {
        User::on(&[server], &server.url(), change)
    }

    /// The user on every one of `servers` (ACLs are per node), connecting through `url`.
    pub(crate) fn on(
        servers: &[&Server],
        url: &str,
        change: impl Fn(Vec<String>) -> Vec<String>,
    ) -> User {
        let id = rand::random::<u32>();
        let (name, ns) = (format!("acl-{id}"), format!("app-{id}"));
        for server in servers {
            set_user(server, &rule(&name, &ns), &change);
        }
        let url = url.replacen("://", &format!("://{name}:{PASSWORD}@"), 1);
        User {
            name,
            ns,
            url,
            resp3: false,
        }
    }

    /// The user on the data nodes of a Sentinel deployment (not on its Sentinels),
    /// connecting through the Sentinels' URL.
    pub(crate) fn behind_sentinels(
        setup: &harness::SentinelSetup,
        change: impl Fn(Vec<String>) -> Vec<String>,
    ) -> User {
        let data: Vec<&Server> = setup.data.servers().collect();
        User::on(&data, &setup.url(), change)
    }

    pub(crate) async fn client(&self, replicated: bool) -> LockClient {
        if self.resp3 {
            use sage_lock::fred::types::config::Config;
            let mut config = Config::from_url(&self.url).expect("a valid URL");
            config.version = sage_lock::fred::types::RespVersion::RESP3;
            assert_eq!(config.username.as_deref(), Some(self.name.as_str()));
            let fred = sage_lock::fred::types::Builder::from_config(config)
                .build()
                .expect("a fred client");
            return LockClient::builder()
                .fred_client(&fred)
                .replicated(replicated)
                .connect()
                .await
                .unwrap_or_else(|e| panic!("connect as {} on RESP3: {e}", self.name));
        }
        LockClient::builder()
            .url(&self.url)
            .replicated(replicated)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect as {}: {e}", self.name))
    }

    pub(crate) fn options(&self, lease: Duration) -> LockOptions {
        LockOptions::new().namespace(self.ns.as_str()).lease(lease)
    }

    /// The server's `ACL LOG` entries about this user (denied commands, keys, channels).
    pub(crate) fn denials(&self, server: &Server) -> Vec<String> {
        let log = server.cmd_ok(&["ACL", "LOG", "200"]);
        log.as_array()
            .unwrap_or_default()
            .iter()
            .map(Reply::to_plain)
            .filter(|entry| entry.contains(&self.name))
            .collect()
    }
}

/// The README's addition for Valkey 9: `+delifeq` (Redis 7 has no such command and would refuse
/// the rule), for one-command uncontended releases on standalone servers.
pub const VALKEY_EXTRA: &str = "+delifeq";

/// Adds [`VALKEY_EXTRA`] to the rule on Valkey servers.
fn valkey_extras(servers: &[&Server]) -> impl Fn(Vec<String>) -> Vec<String> {
    let valkey = servers.iter().any(|s| s.kind() == ServerKind::Valkey);
    move |mut rule: Vec<String>| {
        if valkey {
            rule.push(VALKEY_EXTRA.to_owned());
        }
        rule
    }
}

/// The rule without any channel permission (its `&...` words).
pub(crate) fn without_channels() -> impl Fn(Vec<String>) -> Vec<String> {
    |rule: Vec<String>| rule.into_iter().filter(|w| !w.starts_with('&')).collect()
}

pub(crate) fn without(words: &[&str]) -> impl Fn(Vec<String>) -> Vec<String> {
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
    let sentinels = sentinel_rule("app");
    assert!(
        readme.contains(&sentinels),
        "README.md must contain the tested Sentinel ACL rule verbatim:\n{sentinels}"
    );
    assert!(
        readme.contains(&format!("`{VALKEY_EXTRA}`")),
        "README.md must name the Valkey addition {VALKEY_EXTRA}"
    );
}

/// Every operation, as the documented user on `servers` (reached through `url`): nothing is
/// denied (the ACL logs stay empty, so the release notifications were not silently replaced by
/// polling either).
async fn every_operation(servers: &[&Server], url: &str, replicated: bool) {
    let user = User::on(servers, url, valkey_extras(servers));
    every_operation_as(&user, servers, replicated).await;
}

/// [`every_operation`] as `user`, whose rule is set on `servers`.
async fn every_operation_as(user: &User, servers: &[&Server], replicated: bool) {
    let url = &user.url;
    let client = user.client(replicated).await;
    // A 1 s lease (renewed every ~333 ms), held for longer by the bodies below.
    let lease = Duration::from_secs(1);
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
            tokio::time::sleep(Duration::from_millis(1500)).await;
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

    // A multi-key waiter first in line when a single-key hold ends: the release leaves the key
    // to it and tells it on its own list (`LPUSH`).
    let (release, holder) = harness::hold_by_hand(
        &client
            .lock_with::<String>(user.options(lease))
            .expect("options"),
        "h",
    )
    .await;
    let multi_waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .with_locks(&["h", "h2"], Duration::from_secs(5), async {
                    Instant::now()
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    let _ = release.send(());
    holder.await.expect("holder");
    let woke = multi_waiter
        .await
        .expect("multi-key waiter task")
        .expect("multi-key waiter acquired");
    assert!(
        woke.duration_since(released) < Duration::from_millis(900),
        "{url}: the multi-key waiter got the key {:?} after the release (the lease is 1 s)",
        woke.duration_since(released)
    );

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
            tokio::time::sleep(Duration::from_millis(1200)).await;
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
        tokio::time::sleep(Duration::from_millis(1200)).await;
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
            .force_unlock_by("op", "acl test")
            .await
            .expect("force_unlock")
    );
    let _ = release.send(());
    let _ = holder.await;

    // A dedicated connection loan, opened as the user; dropped, it is closed.
    let loan = client
        .dedicated_connection(Duration::from_secs(2))
        .await
        .expect("dedicated connection");
    drop(loan);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let denials: Vec<String> = servers.iter().flat_map(|s| user.denials(s)).collect();
    assert!(
        denials.is_empty(),
        "{url} (replicated: {replicated}): the documented rule denied: {denials:#?}"
    );
    client.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_documented_rule_runs_every_operation_standalone() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        every_operation(&[server], &server.url(), false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_documented_rule_runs_every_operation_replicated() {
    for kind in ServerKind::ALL {
        let deployment = harness::shared_replicated(kind);
        let servers: Vec<&Server> = deployment.servers().collect();
        every_operation(&servers, &deployment.primary_url(), true).await;
    }
}

/// The same on RESP3 (fred authenticates with `HELLO 3 AUTH`): nothing is denied, the release
/// notifications arrive as RESP3 push messages, standalone and replicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_documented_rule_runs_every_operation_resp3() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let mut user = User::on(&[server], &server.url(), valkey_extras(&[server]));
        user.resp3 = true;
        every_operation_as(&user, &[server], false).await;
        let deployment = harness::shared_replicated(kind);
        let servers: Vec<&Server> = deployment.servers().collect();
        let mut user = User::on(&servers, &deployment.primary_url(), valkey_extras(&servers));
        user.resp3 = true;
        every_operation_as(&user, &servers, true).await;
    }
}

/// Sentinel: the data nodes have the documented user, the Sentinels [`SENTINEL_COMMANDS`]
/// (fred sends the same credentials to both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_documented_rule_runs_every_operation_sentinel() {
    for kind in ServerKind::ALL {
        let setup = harness::shared_sentinel(kind);
        let data: Vec<&Server> = setup.data.servers().collect();
        let user = User::on(&data, &setup.url(), valkey_extras(&data));
        for sentinel in &setup.sentinels {
            set_user(sentinel, &sentinel_rule(&user.name), |rule| rule);
        }
        every_operation_as(&user, &data, false).await;
        let denials: Vec<String> = setup
            .sentinels
            .iter()
            .flat_map(|s| user.denials(s))
            .collect();
        assert!(
            denials.is_empty(),
            "{kind}: the Sentinel rule denied: {denials:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_documented_rule_runs_every_operation_cluster() {
    for kind in ServerKind::ALL {
        let cluster = harness::shared_cluster(kind);
        let servers: Vec<&Server> = cluster.nodes.iter().collect();
        every_operation(&servers, &cluster.url(), false).await;
    }
}

/// A caller's fred client that names its connections (`auto_client_setname`: `CLIENT SETNAME`
/// in each handshake, which the documented rule does not grant), handed to
/// [`LockClient::from_fred`] as the documented user: locks work, nothing is denied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_documented_rule_with_a_callers_client_naming_its_connections() {
    use sage_lock::fred::types::config::{Config, ConnectionConfig};
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let user = User::new(server, valkey_extras(&[server]));
        let connection = ConnectionConfig {
            auto_client_setname: true,
            ..ConnectionConfig::default()
        };
        let fred = sage_lock::fred::clients::Client::new(
            Config::from_url(&user.url).expect("a valid URL"),
            None,
            Some(connection),
            None,
        );
        let client = LockClient::from_fred(fred);
        let locks: Locks<str> = client
            .lock_with(user.options(Duration::from_secs(5)))
            .expect("options");
        let started = Instant::now();
        let outcome = locks
            .with_lock("named", Duration::from_secs(2), async { 8 })
            .await;
        println!("{kind}: {outcome:?} after {:?}", started.elapsed());
        assert_eq!(outcome.ok(), Some(8), "{kind}: with_lock as {}", user.name);
        let denials = user.denials(server);
        assert!(denials.is_empty(), "{kind}: denied: {denials:#?}");
        client.quit().await;
    }
}

/// A connected client whose user's password changes on the server (rotated, with the service
/// not yet redeployed) cannot reconnect once its connection drops: its calls say the server
/// refused the credentials (not only that no reply came).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_changed_under_a_connected_client_is_named() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let user = format!("rotated-{}", rand::random::<u32>());
        server.cmd_ok(&["ACL", "SETUSER", &user, "on", ">pw", "~*", "&*", "+@all"]);
        let url = format!("redis://{user}:pw@127.0.0.1:{}", server.port());
        let client = LockClient::connect(&url).await.expect("connect");
        let locks: Locks<str> = client.lock();
        locks
            .with_lock("k", Duration::from_secs(2), async {})
            .await
            .expect("locks with the password");

        server.cmd_ok(&["ACL", "SETUSER", &user, "resetpass", ">rotated"]);
        server.cmd_ok(&["CLIENT", "KILL", "USER", &user]);
        let error = locks
            .with_lock("k", Duration::from_millis(800), async {})
            .await
            .expect_err("the old password is refused");
        let error = error.to_string();
        println!("{}: {error}", kind.name());
        assert!(
            error.contains("refused the credentials"),
            "{}: the error does not say the credentials were refused: {error}",
            kind.name()
        );
        client.quit().await;
    }
}

/// A URL with a user name and no password (`redis://bob@host`) authenticates as that user
/// (with an empty password: an ACL user with `nopass` gets in, one with a password is refused
/// with a clear error). Before, no `AUTH` was sent and the client ran as the `default` user
/// without a word (an audit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_user_without_a_password_authenticates_as_that_user() {
    use sage_lock::fred::interfaces::ClientLike as _;
    for kind in ServerKind::ALL {
        let server = harness::Server::start(kind);
        server.cmd_ok(&[
            "ACL",
            "SETUSER",
            "bob",
            "on",
            ">bobs-secret",
            "~*",
            "&*",
            "+@all",
        ]);
        server.cmd_ok(&[
            "ACL", "SETUSER", "carol", "on", "nopass", "~*", "&*", "+@all",
        ]);
        let url = |user: &str| format!("redis://{user}@127.0.0.1:{}", server.port());
        let refused = LockClient::builder()
            .url(&url("bob"))
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await;
        let Err(error) = refused else {
            panic!("{kind}: bob, whose password the URL does not give, connected");
        };
        let text = error.to_string();
        println!("{kind}: {text}");
        assert!(text.contains("refused the credentials"), "{kind}: {text}");
        let carol = LockClient::connect(&url("carol"))
            .await
            .expect("a nopass user connects");
        let whoami: String = carol
            .fred()
            .custom(
                sage_lock::fred::types::CustomCommand::new_static("ACL WHOAMI", None, false),
                Vec::<String>::new(),
            )
            .await
            .expect("ACL WHOAMI");
        assert_eq!(whoami, "carol", "{kind}: the client is not the URL's user");
        carol.quit().await;
    }
}
