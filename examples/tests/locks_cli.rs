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

/// Against a server that asks for a client certificate (`tls-auth-clients yes`): without one,
/// the error says which flags give it; with `--tls-cert` and `--tls-key` the tool connects.
#[test]
fn a_client_certificate_is_given_with_flags() {
    let server = harness::Server::launch(
        harness::ServerConfig::new(harness::ServerKind::Redis).tls_mutual(),
    );
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
