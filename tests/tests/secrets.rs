//! Defect 10 of issue 8: no password in `Debug` output, errors or tracing output. A binary of
//! its own: the test captures traces with a scoped subscriber (`set_default`), and tracing's
//! callsite interest cache can miss such a subscriber while other tests on other threads
//! register the same callsites (it once captured nothing in the full suite).

use std::time::Duration;

use harness::{Captured, Server, ServerKind};
use sage_lock::{LockClient, Locks};

/// 10. No password in Debug of the builder or client, in errors, or in tracing output (every
/// level, a good and a bad password).
#[tokio::test]
async fn no_secret_in_debug_errors_or_traces() {
    const SECRET: &str = "s3cr3t-Pw-91";
    const WRONG: &str = "wr0ng-Pw-17";
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    for kind in ServerKind::ALL {
        let server = Server::start(kind);
        server.cmd_ok(&[
            "ACL",
            "SETUSER",
            "app",
            "on",
            &format!(">{SECRET}"),
            "~*",
            "+@all",
        ]);
        let url = format!("redis://app:{SECRET}@127.0.0.1:{}", server.port());
        let builder = LockClient::builder().url(&url);
        let debug = format!("{builder:?}");
        assert!(!debug.contains(SECRET), "builder Debug: {debug}");
        let config = sage_lock::fred::types::config::Config::from_url(&url).expect("url");
        let debug = format!("{:?}", LockClient::builder().config(config));
        assert!(!debug.contains(SECRET), "builder Debug (config): {debug}");
        let client = builder
            .connect()
            .await
            .expect("connect with the right password");
        let debug = format!("{client:?}");
        assert!(!debug.contains(SECRET), "client Debug: {debug}");
        let locks: Locks<str> = client.lock();
        locks
            .with_lock("k", Duration::from_secs(1), async {})
            .await
            .expect("lock");
        let bad = format!("redis://app:{WRONG}@127.0.0.1:{}", server.port());
        let error = LockClient::builder()
            .url(&bad)
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .expect_err("wrong password");
        for text in [
            format!("{error}"),
            format!("{error:?}"),
            format!("{error:#}"),
        ] {
            assert!(!text.contains(WRONG), "error: {text}");
        }
        let malformed = LockClient::connect(&format!("redis://app:{WRONG}@127.0.0.1:notaport"))
            .await
            .expect_err("bad port");
        assert!(!format!("{malformed:?}").contains(WRONG), "{malformed:?}");
        client.quit().await;
    }
    let output = captured.text();
    assert!(output.len() > 100, "tracing captured nothing: {output}");
    assert!(!output.contains(SECRET), "password in traces");
    assert!(!output.contains(WRONG), "wrong password in traces");
}
