//! ACL denials: a user missing one permission gets an error that names the command (or key,
//! or channel) and the grant that fixes it, on acquisition, renewal, release, operator tools
//! and connect.

use std::time::{Duration, Instant};

use harness::{Server, ServerKind};
use sage_lock::{LockClient, LockError, Locks, LossReason};

use crate::acl::{PASSWORD, User, set_user, without, without_channels};

/// Connects with `builder` and returns the error's text, or says that it connected.
async fn connect_error(builder: sage_lock::LockClientBuilder) -> String {
    match builder.connect().await {
        Ok(client) => {
            client.quit().await;
            "connected, but should have been refused".to_owned()
        }
        Err(error) => error.to_string(),
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

/// A user missing a command only the renewal script calls (`GET`, under `redis.pcall`): the
/// renewal's loss quotes the denial and names the grant. Before, the denial was taken for the
/// key no longer holding the token: `LockLost(NotOwner)`, "expired, deleted or overwritten".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_missing_renewal_command_is_a_named_renewal_loss() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let user = User::new(server, without(&["+get"]));
        let client = user.client(false).await;
        let locks: Locks<str> = client
            .lock_with(user.options(Duration::from_millis(300)))
            .expect("options");
        let error = locks
            .with_lock("k", Duration::from_secs(2), async {
                tokio::time::sleep(Duration::from_millis(700)).await;
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
            ) && text.contains("grant +get"),
            "{kind}: {text}"
        );
        // Each hold counts once: the loss, not also a release by the best-effort release that
        // follows it; and the denied renewal is a failed renewal attempt (audit 41: 1
        // acquisition, 1 loss, 1 release, 0 renewal failures).
        client.quit().await;
        let stats = client.stats();
        assert_eq!(
            (
                stats.acquisitions,
                stats.losses,
                stats.releases,
                stats.release_failures
            ),
            (1, 1, 0, 0),
            "{kind}: {stats:?}"
        );
        assert!(stats.renewal_failures >= 1, "{kind}: {stats:?}");
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
                .force_unlock("k")
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

/// Without the channel permission, a waiting client says so once (`WARN`, naming the grant)
/// and does not send `SSUBSCRIBE` again on every poll: before, only a `DEBUG` line said so, and
/// one waiter over 1.7 s made 18 denials in `ACL LOG` (helper 29).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_denied_subscription_warns_once_and_is_not_retried_every_poll() {
    use tracing::instrument::WithSubscriber as _;
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let user = User::new(server, without_channels());
        let (holder, waiter) = (user.client(false).await, user.client(false).await);
        let (release, held) = hold_c(&user, &holder).await;
        let locks: Locks<str> = waiter.lock_with(user.options(LEASE)).expect("options");
        let captured = harness::Captured::default();
        let waiting = tokio::spawn(
            async move { locks.with_lock("c", Duration::from_secs(5), async {}).await }
                .with_subscriber(captured.warn_subscriber()),
        );
        tokio::time::sleep(Duration::from_millis(1_700)).await;
        let _ = release.send(());
        held.await.expect("holder");
        waiting
            .await
            .expect("waiter task")
            .expect("waiter acquired by polling");
        for client in [holder, waiter] {
            client.quit().await;
        }
        let logs = captured.text();
        assert_eq!(
            logs.matches("denies SSUBSCRIBE").count(),
            1,
            "{kind}: one warning:\n{logs}"
        );
        assert!(logs.contains("&{"), "{kind}: the grant is named:\n{logs}");
        let denied: u64 = user
            .denials(server)
            .iter()
            .filter(|entry| entry.contains("\"channel\""))
            .map(|entry| acl_log_count(entry))
            .sum();
        println!("{kind}: {denied} channel denials in ACL LOG");
        assert!(
            (1..=2).contains(&denied),
            "{kind}: {denied} channel denials in ACL LOG"
        );
    }
}

/// The lease of the channel-denial tests' locks.
const LEASE: Duration = Duration::from_secs(5);

/// Holds the key `c` in `user`'s namespace through `client` until the sender is used.
async fn hold_c(
    user: &User,
    client: &LockClient,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let by_hand = client
        .lock_with::<String>(user.options(LEASE))
        .expect("options");
    harness::hold_by_hand(&by_hand, "c").await
}

/// The `count` of one `ACL LOG` entry (as [`User::denials`] renders it), 1 if not found.
fn acl_log_count(entry: &str) -> u64 {
    entry
        .split("count")
        .nth(1)
        .and_then(|after| {
            let digits: String = after
                .chars()
                .skip_while(|c| !c.is_ascii_digit())
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .unwrap_or(1)
}

/// Without the channel permission, waiters still get the lock (by polling); the denial shows
/// in the server's ACL log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_without_channels_waiters_fall_back_to_polling() {
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        let user = User::new(server, without_channels());
        let client = user.client(false).await;
        let locks: Locks<str> = client.lock_with(user.options(LEASE)).expect("options");
        let (release, holder) = hold_c(&user, &client).await;
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

/// An acquisition the server refused before its script ran (the script command, or the keys,
/// denied) took nothing, so nothing is undone and no release is logged (it logged "release
/// failed; the lock expires with its lease", with a placeholder namespace: helper 29). A
/// command denied inside the script may follow earlier writes, so that one is still undone.
#[tokio::test]
async fn acl_denied_acquisition_logs_no_release() {
    let captured = harness::Captured::default();
    let _guard = tracing::subscriber::set_default(captured.warn_subscriber());
    for kind in ServerKind::ALL {
        let server = harness::shared(kind);
        with_lock_error(server, false, without(&["+evalsha", "+eval"])).await;
        with_lock_error(server, false, |rule| {
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
    }
    let logs = captured.text();
    assert!(
        !logs.contains("release"),
        "a refused acquisition logged a release:\n{logs}"
    );
}

/// A release the ACL denies: the body's result is returned, the failure is logged with the
/// server's message and the grant, and the key expires with its lease.
#[tokio::test]
async fn acl_denied_release_is_logged_with_the_grant() {
    let captured = harness::Captured::default();
    let _guard = tracing::subscriber::set_default(captured.warn_subscriber());
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
        // The hold counts once, as a failed release (audit 41: counted nowhere, so
        // acquisitions exceeded releases + losses).
        let stats = client.stats();
        assert_eq!(
            (
                stats.acquisitions,
                stats.releases,
                stats.release_failures,
                stats.losses
            ),
            (1, 0, 1, 0),
            "{kind}: {stats:?}"
        );
    }
    let logs = captured.text();
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

/// Connecting: a cluster user without fred's routing commands, and a wrong password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_connect_failures_are_named() {
    for kind in ServerKind::ALL {
        let cluster = harness::shared_cluster(kind);
        let servers: Vec<&Server> = cluster.nodes.iter().collect();
        let user = User::on(&servers, &cluster.url(), without(&["+cluster|slots"]));
        let text = match LockClient::connect(&user.url).await {
            Ok(client) => {
                client.quit().await;
                panic!("{kind}: connected without CLUSTER SLOTS")
            }
            Err(error) => error.to_string(),
        };
        assert!(text.contains("grant +cluster|slots"), "{kind}: {text}");

        let server = harness::shared(kind);
        let user = User::new(server, |rule| rule);
        let wrong = user.url.replace(PASSWORD, "not-the-password");
        let error = LockClient::connect(&wrong)
            .await
            .expect_err("a wrong password is refused");
        let text = error.to_string();
        assert!(
            matches!(error, LockError::Backend { .. })
                && text.contains("refused the credentials")
                && !text.contains("not-the-password"),
            "{kind}: {text}"
        );
    }
}

/// In a cluster `scan` reads each primary's slots (`CLUSTER NODES`) around its pass: a user
/// without it is told the grant (audit 47).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_cluster_scan_names_cluster_nodes() {
    for kind in ServerKind::ALL {
        let cluster = harness::shared_cluster(kind);
        let servers: Vec<&Server> = cluster.nodes.iter().collect();
        let user = User::on(&servers, &cluster.url(), without(&["+cluster|nodes"]));
        let client = user.client(false).await;
        let locks: Locks<str> = client
            .lock_with(user.options(Duration::from_secs(5)))
            .expect("options");
        let error = locks.scan().await.expect_err("CLUSTER NODES is denied");
        let text = error.to_string();
        assert!(
            matches!(error, LockError::Backend { .. })
                && text.contains("NOPERM")
                && text.contains("grant +cluster|nodes"),
            "{kind}: {text}"
        );
        client.quit().await;
    }
}

/// Without `+info`, connect still tells what a plain URL names, from `ROLE` and
/// `CLUSTER INFO` (which the documented rule grants): a replica and a cluster node are refused,
/// and a primary with replicas without `replicated(true)` is warned about. The checks were
/// skipped without a word (helper 29).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_without_info_still_checks_the_node() {
    use tracing::instrument::WithSubscriber as _;
    for kind in ServerKind::ALL {
        let replicated = harness::shared_replicated(kind);
        let servers: Vec<&Server> = replicated.servers().collect();
        let at_replica = User::on(&servers, &replicated.replicas[0].url(), without(&["+info"]));
        let text = connect_error(LockClient::builder().url(&at_replica.url)).await;
        assert!(text.contains("is a replica"), "{kind}: {text}");

        let cluster = harness::shared_cluster(kind);
        let nodes: Vec<&Server> = cluster.nodes.iter().collect();
        let at_node = User::on(&nodes, &cluster.nodes[0].url(), without(&["+info"]));
        let text = connect_error(LockClient::builder().url(&at_node.url)).await;
        assert!(text.contains("is a cluster node"), "{kind}: {text}");

        let at_primary = User::on(&servers, &replicated.primary.url(), without(&["+info"]));
        let captured = harness::Captured::default();
        async {
            let client = at_primary.client(false).await;
            client.quit().await;
        }
        .with_subscriber(captured.warn_subscriber())
        .await;
        let logs = captured.text();
        assert!(
            logs.contains("is a primary with") && logs.contains("replicated(true)"),
            "{kind}: {logs}"
        );
    }
}

/// The data nodes know the user, the Sentinels do not: connecting said "is the server running
/// and reachable? If it only accepts TLS ...", not the likeliest cause (helper 29).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_sentinels_refusing_the_credentials_are_named() {
    for kind in ServerKind::ALL {
        let user = User::behind_sentinels(harness::shared_sentinel(kind), |rule| rule);
        let error = connect_error(
            LockClient::builder()
                .url(&user.url)
                .command_timeout(Duration::from_secs(2)),
        )
        .await;
        assert!(
            error.contains("Sentinel") && error.contains("credentials"),
            "{kind}: {error}"
        );
        // fred keeps each Sentinel's own error to itself: the client asks the first one alone,
        // so the error says what it answered (audit 41: the same generic text for a wrong
        // password, a disabled user, a wrong CA, an expired certificate or no client
        // certificate).
        assert!(
            error.contains("WRONGPASS") && error.contains("asked alone"),
            "{kind}: {error}"
        );
    }
}

/// Sentinels whose user lacks `+sentinel|replicas`: locks still work (the replica-count floor
/// starts from `ROLE`), and the client says once, at `warn`, which permission to grant. Before,
/// the denial was logged at `debug` only and the safety feature was lost silently (an audit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_sentinel_without_replicas_warns_once() {
    use tracing::instrument::WithSubscriber as _;
    for kind in ServerKind::ALL {
        let setup = harness::shared_sentinel(kind);
        let user = User::behind_sentinels(setup, |rule| rule);
        for sentinel in &setup.sentinels {
            set_user(
                sentinel,
                &crate::acl::sentinel_rule(&user.name),
                without(&["+sentinel|replicas"]),
            );
        }
        let captured = harness::Captured::default();
        let text = async {
            let client = user.client(false).await;
            let locks: Locks<str> = client
                .lock_with(user.options(Duration::from_secs(5)))
                .expect("options");
            for _ in 0..3 {
                locks
                    .with_lock("k", Duration::from_secs(5), async {})
                    .await
                    .expect("locks work without SENTINEL REPLICAS");
            }
            client.quit().await;
            captured.text()
        }
        .with_subscriber(captured.warn_subscriber())
        .await;
        println!("{kind}: {text}");
        assert_eq!(
            text.matches("grant +sentinel|replicas").count(),
            1,
            "{kind}: {text}"
        );
    }
}

/// The Sentinels know the user, the data nodes do not: the error named only the Sentinels'
/// addresses, so the operator looked for the fault in the wrong place (a Left item).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_data_nodes_refusing_the_credentials_are_named() {
    for kind in ServerKind::ALL {
        let setup = harness::shared_sentinel(kind);
        let id = rand::random::<u32>();
        let name = format!("acl-sentinel-only-{id}");
        for sentinel in &setup.sentinels {
            set_user(sentinel, &crate::acl::sentinel_rule(&name), |words| words);
        }
        let url = setup
            .url()
            .replacen("://", &format!("://{name}:{PASSWORD}@"), 1);
        let error = connect_error(
            LockClient::builder()
                .url(&url)
                .command_timeout(Duration::from_secs(2)),
        )
        .await;
        println!("{kind}: {error}");
        let primary = setup.data.primary.url();
        let primary = primary.trim_start_matches("redis://");
        assert!(
            error.contains(primary) && error.contains("WRONGPASS"),
            "{kind}: {error}"
        );
    }
}
