//! The `locks` command-line tool as a process against live Redis and Valkey servers: `list`
//! prints the held locks of a namespace as a table, `show` one holder, `unlock` clears a lock
//! (its holder loses it) and says when there was nothing to clear.

use std::process::Command;
use std::time::Duration;

use sage_lock::{LockClient, LockError, LockOptions, Locks, current_lease};
use sage_lock_examples::{ServerKind, ThrowawayServer};
use tokio::sync::oneshot;

fn locks_cli(url: &str, namespace: &str, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_locks"))
        .args(args)
        .args(["--url", url, "--namespace", namespace])
        .env_remove(sage_lock_examples::URL_VARIABLE)
        .output()
        .expect("run the locks tool");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_unlock() {
    for kind in [ServerKind::Redis, ServerKind::Valkey] {
        let server = ThrowawayServer::start_kind(kind).expect("start a server");
        let url = server.url().to_owned();
        let client = LockClient::connect(&url).await.expect("connect");
        let namespace = "on-call";
        let locks: Locks<str> = client
            .lock_with(
                LockOptions::new()
                    .namespace(namespace)
                    .lease(Duration::from_millis(800)),
            )
            .expect("options");
        let mut tokens = Vec::new();
        let mut holders = Vec::new();
        for key in ["account:42", "report:daily"] {
            let (token_tx, token_rx) = oneshot::channel();
            let locks = locks.clone();
            holders.push(tokio::spawn(async move {
                locks
                    .with_lock(key, Duration::from_secs(5), async move {
                        let _ = token_tx.send(current_lease().expect("lease").fencing_token());
                        std::future::pending::<()>().await;
                    })
                    .await
            }));
            tokens.push(token_rx.await.expect("acquired"));
        }

        let run = |args: &'static [&'static str]| {
            let url = url.clone();
            tokio::task::spawn_blocking(move || locks_cli(&url, namespace, args))
        };
        let (ok, out, err) = run(&["list"]).await.expect("list");
        assert!(ok, "{kind}: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("KEY") && lines[0].contains("FENCING TOKEN"),
            "{out}"
        );
        assert!(
            lines[1].starts_with("account:42") && lines[2].starts_with("report:daily"),
            "{out}"
        );
        assert!(lines[1].contains(&tokens[0].to_string()), "{out}");
        assert!(
            out.contains("2 locks held in namespace \"on-call\""),
            "{out}"
        );

        let (ok, out, err) = run(&["show", "report:daily"]).await.expect("show");
        assert!(ok, "{kind}: {err}");
        assert!(
            out.lines()
                .nth(1)
                .is_some_and(|line| line.starts_with("report:daily")),
            "{out}"
        );

        let (ok, out, err) = run(&["unlock", "account:42", "--by", "cli-test"])
            .await
            .expect("unlock");
        assert!(ok, "{kind}: {err}");
        assert!(out.contains("unlocked \"account:42\""), "{out}");
        let lost = tokio::time::timeout(Duration::from_secs(3), holders.remove(0))
            .await
            .expect("the holder noticed")
            .expect("holder task");
        assert!(
            matches!(lost, Err(LockError::LockLost { .. })),
            "{kind}: {lost:?}"
        );

        let (ok, out, _) = run(&["unlock", "account:42"]).await.expect("unlock again");
        assert!(ok && out.contains("was not locked"), "{out}");
        let (ok, out, _) = run(&["show", "account:42"]).await.expect("show free");
        assert!(ok && out.contains("is not locked"), "{out}");
        let (ok, out, _) = run(&["list"]).await.expect("list");
        assert!(ok && out.contains("1 lock held"), "{out}");

        let (ok, _, err) = run(&["frobnicate"]).await.expect("bad command");
        assert!(!ok && err.contains("usage: locks"), "{err}");
        for holder in holders {
            holder.abort();
        }
        client.quit().await;
    }
}

#[test]
fn help_prints_the_usage_and_succeeds() {
    for flag in ["--help", "-h"] {
        let output = Command::new(env!("CARGO_BIN_EXE_locks"))
            .arg(flag)
            .output()
            .expect("run the locks tool");
        let out = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{flag}: {output:?}");
        assert!(out.starts_with("usage: locks"), "{flag}: {out}");
        assert!(output.stderr.is_empty(), "{flag}: {output:?}");
    }
}

/// A run that succeeds prints nothing on stderr: the tool quits its client and exits, and fred
/// used to warn now and then ("Skip command with canceled error after calling quit", about 1
/// run in 30) because the client was quit a second time when its last handle was dropped.
#[test]
fn a_successful_run_is_quiet_on_stderr() {
    let server = ThrowawayServer::start_kind(ServerKind::Redis).expect("start a server");
    for run in 0..80 {
        let args: &[&str] = if run % 2 == 0 {
            &["list"]
        } else {
            &["show", "k"]
        };
        let (ok, _, err) = locks_cli(server.url(), "quiet", args);
        assert!(ok && err.is_empty(), "run {run} ({args:?}): stderr {err:?}");
    }
}

/// A Redis server that accepts TLS only and asks for a client certificate.
fn mutual_tls_server() -> harness::Server {
    harness::Server::launch(harness::ServerConfig::new(harness::ServerKind::Redis).tls_mutual())
}

/// Against a server that asks for a client certificate (`tls-auth-clients yes`): without one,
/// the error says which flags give it; with `--tls-cert` and `--tls-key` the tool connects.
#[test]
fn a_client_certificate_is_given_with_flags() {
    let server = mutual_tls_server();
    let certs = server.tls_certs().expect("certificates");
    let url = server.tls_url();
    let ca = certs.ca.cert.display().to_string();
    let (cert, key) = (
        certs.client_cert.display().to_string(),
        certs.client_key.display().to_string(),
    );
    let (ok, _, err) = locks_cli(&url, "mtls", &["list", "--tls-ca", &ca]);
    assert!(!ok, "connected without a client certificate");
    assert!(
        err.contains("--tls-cert") && err.contains("--tls-key"),
        "the error does not say how to give a certificate: {err}"
    );
    let (ok, out, err) = locks_cli(
        &url,
        "mtls",
        &[
            "list",
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("0 locks held in namespace \"mtls\""), "{out}");
}

/// Holds the lock on `key` in `locks` until the returned task is aborted.
async fn hold(locks: &Locks<[u8]>, key: &[u8]) -> tokio::task::JoinHandle<()> {
    let (acquired_tx, acquired_rx) = oneshot::channel();
    let held = locks.with_lock(key, Duration::from_secs(5), async move {
        let _ = acquired_tx.send(());
        std::future::pending::<()>().await;
    });
    let task = tokio::spawn(async move {
        let _ = held.await;
    });
    acquired_rx.await.expect("acquired");
    task
}

/// `locks list | head -1`: a reader that closes the pipe early ends the tool quietly with
/// exit 0 (as `ls | head` does), not a panic ("failed printing to stdout") with exit 101.
#[test]
fn a_closed_stdout_ends_quietly() {
    use std::io::{BufRead as _, BufReader};
    use std::process::Stdio;

    let server = harness::Server::start(harness::ServerKind::Redis);
    // 1,500 held locks of 80-byte keys: about 150 KB of table, more than a pipe buffer.
    server.cmd_ok(&[
        "EVAL",
        "for i = 1, 1500 do redis.call('SET', '{pipe:' .. string.rep('k', 70) .. i .. '}', 't', \
         'PX', 120000) end return 1",
        "0",
    ]);
    let url = server.url();
    for read_first_line in [false, true] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_locks"))
            .args(["list", "--url", &url, "--namespace", "pipe"])
            .env_remove(sage_lock_examples::URL_VARIABLE)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the locks tool");
        let stdout = child.stdout.take().expect("stdout");
        if read_first_line {
            // `| head -1`: one line read, then the pipe closed with the rest unread.
            let mut line = String::new();
            BufReader::new(stdout)
                .read_line(&mut line)
                .expect("first line");
            assert!(line.starts_with("KEY"), "{line}");
        } else {
            // Closed before the tool writes anything (it still has to connect).
            drop(stdout);
        }
        let output = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "read first line {read_first_line}: {err}"
        );
        assert_eq!(
            output.status.code(),
            Some(0),
            "read first line {read_first_line}: {err}"
        );
    }
}

/// A key that is not UTF-8 (`a` then byte 0xff) and a text key that reads `a\xff` (a
/// backslash, `x`, `f`, `f`) print differently in `list`, and each printed form, given back to
/// `show` and `unlock`, names exactly that lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_and_text_keys_print_apart_and_unlock_apart() {
    const BINARY: &[u8] = b"a\xff";
    const TEXT: &[u8] = br"a\xff";
    for kind in [ServerKind::Redis, ServerKind::Valkey] {
        let server = ThrowawayServer::start_kind(kind).expect("start a server");
        let url = server.url().to_owned();
        let client = LockClient::connect(&url).await.expect("connect");
        let namespace = "bytes";
        let locks: Locks<[u8]> = client
            .lock_with(LockOptions::new().namespace(namespace))
            .expect("options");
        let holders = [hold(&locks, BINARY).await, hold(&locks, TEXT).await];
        let run = |args: &'static [&'static str]| {
            let url = url.clone();
            tokio::task::spawn_blocking(move || locks_cli(&url, namespace, args))
        };

        let (ok, out, err) = run(&["list"]).await.expect("list");
        assert!(ok, "{kind}: {err}");
        let keys: Vec<&str> = out
            .lines()
            .skip(1)
            .filter_map(|line| line.split("  ").next())
            .collect();
        assert!(keys.contains(&r"a\xff"), "{kind}: the binary key: {out}");
        assert!(keys.contains(&r"a\\xff"), "{kind}: the text key: {out}");

        let (ok, out, err) = run(&["show", r"a\xff"]).await.expect("show");
        assert!(ok, "{kind}: {err}");
        assert!(
            out.lines().nth(1).is_some_and(|l| l.starts_with(r"a\xff ")),
            "{kind}: {out}"
        );

        // The text key's printed form removes the text key only.
        let (ok, out, err) = run(&["unlock", r"a\\xff"]).await.expect("unlock text");
        assert!(ok && out.starts_with("unlocked"), "{kind}: {out} {err}");
        assert!(!locks.is_locked(TEXT).await.expect("text"), "{kind}");
        assert!(locks.is_locked(BINARY).await.expect("binary"), "{kind}");
        // The binary key's printed form removes the binary key.
        let (ok, out, err) = run(&["unlock", r"a\xff"]).await.expect("unlock binary");
        assert!(ok && out.starts_with("unlocked"), "{kind}: {out} {err}");
        assert!(!locks.is_locked(BINARY).await.expect("binary"), "{kind}");

        // A backslash that starts no escape is refused, not guessed at.
        let (ok, _, err) = run(&["unlock", r"a\q"]).await.expect("bad escape");
        assert!(!ok && err.contains(r"\\"), "{kind}: {err}");
        for holder in holders {
            holder.abort();
        }
        client.quit().await;
    }
}

/// The tool's hints name what the tool accepts.
#[test]
fn hints_name_what_the_tool_accepts() {
    let server = harness::Server::start(harness::ServerKind::Redis);
    let url = server.url();
    // `-n` without a value: the suggested form works.
    let (ok, _, err) = locks_cli(&url, "x", &["list", "-n"]);
    assert!(!ok && err.contains("-n VALUE"), "{err}");
    let output = Command::new(env!("CARGO_BIN_EXE_locks"))
        .args(["list", "--url", &url, "-n=hints"])
        .output()
        .expect("run the locks tool");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "-n=VALUE: {output:?}");
    assert!(out.contains("namespace \"hints\""), "{out}");
    // `--by` only applies to `unlock`.
    for verb in [&["list"][..], &["show", "k"]] {
        let args: Vec<&str> = verb.iter().copied().chain(["--by", "alice"]).collect();
        let (ok, _, err) = locks_cli(&url, "x", &args);
        assert!(
            !ok && err.contains("--by") && err.contains("only") && err.contains("unlock"),
            "{verb:?}: {err}"
        );
    }
    // The usage lists the short flags.
    let output = Command::new(env!("CARGO_BIN_EXE_locks"))
        .arg("--help")
        .output()
        .expect("run the locks tool");
    let usage = String::from_utf8_lossy(&output.stdout);
    assert!(
        usage.contains("-n, --namespace") && usage.contains("-h, --help"),
        "{usage}"
    );
}

/// TLS hints name the tool's flags: a server certificate from an unknown CA asks for
/// `--tls-ca FILE` (not the library's builder), and a client certificate with the wrong key is
/// not answered as if none was given.
#[test]
fn tls_hints_name_the_flags() {
    let server = mutual_tls_server();
    let certs = server.tls_certs().expect("certificates");
    let url = server.tls_url();
    let ca = certs.ca.cert.display().to_string();
    let (ok, _, err) = locks_cli(&url, "tls", &["list"]);
    assert!(!ok, "connected without the CA");
    assert!(
        err.contains("--tls-ca FILE") && !err.contains("LockClientBuilder"),
        "{err}"
    );
    // The server's key is not the client certificate's.
    let (cert, wrong_key) = (
        certs.client_cert.display().to_string(),
        certs.key.display().to_string(),
    );
    let (ok, _, err) = locks_cli(
        &url,
        "tls",
        &[
            "list",
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &wrong_key,
        ],
    );
    assert!(!ok, "connected with the wrong key");
    assert!(
        !err.contains("give the locks tool a client certificate"),
        "{err}"
    );
    assert!(err.contains("--tls-key"), "{err}");
}

/// One very long key does not widen every row: the key column is capped, the long key is
/// printed whole on a line of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_key_does_not_widen_the_table() {
    let server = ThrowawayServer::start_kind(ServerKind::Redis).expect("start a server");
    let url = server.url().to_owned();
    let client = LockClient::connect(&url).await.expect("connect");
    let locks: Locks<[u8]> = client
        .lock_with(LockOptions::new().namespace("wide"))
        .expect("options");
    let long = "x".repeat(5_000);
    let holders = [
        hold(&locks, b"short").await,
        hold(&locks, long.as_bytes()).await,
    ];
    let (ok, out, err) = tokio::task::spawn_blocking(move || locks_cli(&url, "wide", &["list"]))
        .await
        .expect("list");
    assert!(ok, "{err}");
    assert!(
        out.lines().any(|line| line == long),
        "the long key whole: {out}"
    );
    for line in out.lines().filter(|line| *line != long) {
        assert!(line.chars().count() <= 100, "a wide line: {line:.120}");
    }
    for holder in holders {
        holder.abort();
    }
    client.quit().await;
}

/// The operator tools under an ACL user: the README's rule with the namespace's prefix as the
/// server spells it (`a:b` is `{a%3Ab:`) runs `list`, `show` and `unlock`; a read-only role
/// cannot `list` (it runs the inspect script by `EVALSHA`). The README says both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_tools_under_an_acl_user() {
    const COMMANDS: &str = "-@all +evalsha +eval +get +set +del +exists +incr +pexpire \
+pttl +pexpiretime +time +type +lindex +lpop +lpush +lrem +rpush +zadd +zcard +zcount +zrange +zrem \
+zremrangebyscore +zscore +spublish +ssubscribe +sunsubscribe +ping +client|id +info +cluster|info +cluster|slots +role +wait +client|unblock +client|list +scan";
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README");
    assert!(readme.contains("`{a%3Ab:`"), "the README spells the prefix");
    assert!(
        readme.contains("read-only role cannot"),
        "the README says what the tools need"
    );
    for kind in [harness::ServerKind::Redis, harness::ServerKind::Valkey] {
        let server = harness::Server::start(kind);
        let namespace = "a:b";
        let prefix = String::from_utf8(LockClient::server_key(namespace, ""))
            .expect("text")
            .trim_end_matches('}')
            .to_owned();
        assert_eq!(prefix, "{a%3Ab:", "{kind}");
        let mut rule: Vec<String> = [
            "ACL",
            "SETUSER",
            "ops",
            "on",
            ">pw",
            "resetkeys",
            "resetchannels",
        ]
        .map(String::from)
        .to_vec();
        rule.push(format!("~{prefix}*"));
        rule.push(format!("&{prefix}*}}:released"));
        rule.extend(COMMANDS.split_whitespace().map(String::from));
        server.cmd_ok(&rule.iter().map(String::as_str).collect::<Vec<_>>());
        server.cmd_ok(&[
            "ACL",
            "SETUSER",
            "reader",
            "on",
            ">pw",
            "resetkeys",
            "~*",
            "-@all",
            "+@read",
            "+ping",
            "+client|id",
            "+info",
        ]);

        let client = LockClient::connect(&server.url()).await.expect("connect");
        let locks: Locks<[u8]> = client
            .lock_with(LockOptions::new().namespace(namespace))
            .expect("options");
        let holder = hold(&locks, b"k").await;
        let user_url = |user: &str| server.url().replacen("://", &format!("://{user}:pw@"), 1);
        let ops = user_url("ops");
        let run = |url: String, args: &'static [&'static str]| {
            tokio::task::spawn_blocking(move || locks_cli(&url, namespace, args))
        };
        let (ok, out, err) = run(ops.clone(), &["list"]).await.expect("list");
        assert!(ok && out.contains("1 lock held"), "{kind}: {out} {err}");
        let (ok, out, err) = run(ops.clone(), &["show", "k"]).await.expect("show");
        assert!(
            ok && out.lines().nth(1).is_some_and(|l| l.starts_with('k')),
            "{kind}: {out} {err}"
        );
        let (ok, _, err) = run(user_url("reader"), &["list"]).await.expect("list");
        assert!(
            !ok && err.to_lowercase().contains("evalsha"),
            "{kind}: {err}"
        );
        let (ok, out, err) = run(ops, &["unlock", "k", "--by", "acl-test"])
            .await
            .expect("unlock");
        assert!(ok && out.starts_with("unlocked"), "{kind}: {out} {err}");
        assert!(
            !locks.is_locked(b"k".as_slice()).await.expect("is_locked"),
            "{kind}"
        );
        holder.abort();
        client.quit().await;
    }
}

/// A write that fails for another reason than a closed pipe (a full disk: `/dev/full`) is an
/// error message and exit 1, not a panic.
#[test]
fn a_failed_write_is_an_error() {
    let full = std::fs::File::create("/dev/full").expect("/dev/full");
    let output = Command::new(env!("CARGO_BIN_EXE_locks"))
        .arg("--help")
        .stdout(full)
        .output()
        .expect("run the locks tool");
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("locks: cannot write the output") && !err.contains("panicked"),
        "{err}"
    );
}
