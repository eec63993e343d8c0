//! A connection that cannot be made is reported once, as the caller's error, and leaves no
//! warning behind in the service's logs. A binary of its own: the test installs the global
//! subscriber, with `log` records (fred logs through `log`) forwarded to it, as a service's
//! `tracing_subscriber::fmt().init()` does.

use std::io::Read as _;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use harness::{Captured, Replicated, ServerKind};
use sage_lock::{LockClient, LockError, LockOptions, Locks};

/// A free loopback port with nothing listening on it.
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Whether the client closes `stream` within `limit` (whatever it sent before is skipped: its
/// handshake); a reset or a timeout is not a close.
fn closed_within(mut stream: TcpStream, limit: Duration) -> bool {
    stream.set_read_timeout(Some(limit)).expect("read timeout");
    let mut buf = [0_u8; 512];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

/// Refused, and a server that accepts but never answers (the connect timeout): each is a
/// `Backend` error naming the target; the client given up on closes its connection within the
/// command timeout and stops trying; and nothing is logged at `WARN` or above (a refused
/// connection used to log fred's "Attempted to quit client that was already stopped").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_connection_is_an_error_and_no_warning() {
    let captured = Captured::global_warn();

    // Accepts connections (the kernel's backlog) but never answers them.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent_port = silent.local_addr().expect("addr").port();
    for (what, port) in [("refused", closed_port()), ("silent", silent_port)] {
        let result = LockClient::builder()
            .url(&format!("redis://127.0.0.1:{port}"))
            .connect_timeout(Duration::from_millis(500))
            .command_timeout(Duration::from_secs(1))
            .connect()
            .await;
        let Err(error @ LockError::Backend { .. }) = result else {
            panic!("{what}: connected to nothing: {result:?}");
        };
        let message = error.to_string();
        assert!(
            message.contains("could not connect") && message.contains(&port.to_string()),
            "{what}: {message}"
        );
    }
    // Anything the failed clients still log on their way out.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The client given up on closed its connection to the silent server (its handshake is
    // bounded by the command timeout: 1 s here, so closed by now), and tries no more.
    silent.set_nonblocking(true).expect("nonblocking");
    let accepted: Vec<TcpStream> = std::iter::from_fn(|| silent.accept().ok())
        .map(|(stream, _)| stream)
        .collect();
    assert!(!accepted.is_empty(), "the silent server got no connection");
    for stream in accepted {
        stream.set_nonblocking(false).expect("blocking");
        let closed = closed_within(stream, Duration::from_secs(2));
        assert!(
            closed,
            "the client left its connection open after giving up"
        );
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(
        silent.accept().is_err(),
        "the client connected again after giving up"
    );
    // Given up on mid-handshake with a long command timeout (which also bounds fred's
    // handshake): the connection closes at once, not when the handshake times out (10 s).
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent_port = silent.local_addr().expect("addr").port();
    let result = LockClient::builder()
        .url(&format!("redis://127.0.0.1:{silent_port}"))
        .connect_timeout(Duration::from_millis(300))
        .command_timeout(Duration::from_secs(10))
        .connect()
        .await;
    assert!(result.is_err(), "connected to a silent server: {result:?}");
    let gave_up = std::time::Instant::now();
    let (stream, _) = silent.accept().expect("the client connected");
    let closed = closed_within(stream, Duration::from_secs(3));
    let open_for = gave_up.elapsed();
    println!("a connection given up on mid-handshake closed {open_for:?} after the error");
    assert!(
        closed && open_for < Duration::from_secs(2),
        "the connection given up on was still open {open_for:?} after the error (closed: {closed})"
    );

    let logged = captured.text();
    assert!(
        logged.trim().is_empty(),
        "a failed connection logged warnings:\n{logged}"
    );

    // The dedicated connections of replica acknowledgement, refused once the primary is gone:
    // each failed one is closed without fred's warning (the lock's own warnings may appear).
    for kind in ServerKind::ALL {
        let setup = Replicated::start(kind, 1);
        let client = LockClient::builder()
            .url(&setup.primary_url())
            .replicated(true)
            .connect_timeout(Duration::from_millis(500))
            .command_timeout(Duration::from_secs(1))
            .connect()
            .await
            .expect("connect");
        let locks: Locks<str> = client
            .lock_with(LockOptions::new().namespace("refused"))
            .expect("options");
        locks
            .with_lock("k", Duration::from_secs(2), async {})
            .await
            .expect("while the primary is up");
        setup.primary.kill();
        let down = locks
            .with_lock("k", Duration::from_millis(1_500), async {})
            .await;
        assert!(down.is_err(), "{kind}: locked with the primary gone");
        tokio::time::sleep(Duration::from_millis(500)).await;
        client.quit().await;
        let logged = captured.text();
        assert!(
            !logged.contains("already stopped"),
            "{kind}: a refused dedicated connection logged fred's warning:\n{logged}"
        );
    }
}

/// A server that requires a password, reached with none: the error says to add one, not that
/// credentials were refused (none were given; an audit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_password_is_named() {
    for kind in ServerKind::ALL {
        let server = harness::Server::start(kind);
        // After the start: the harness's readiness probe sends no password.
        server.cmd_ok(&["CONFIG", "SET", "requirepass", "secret"]);
        let error = LockClient::builder()
            .url(&format!("redis://127.0.0.1:{}", server.port()))
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .expect_err("no password");
        let text = error.to_string();
        println!("{kind}: {text}");
        assert!(
            text.contains("requires a password, and none was given"),
            "{kind}: {text}"
        );
    }
}

/// A connect the caller gives up on (its request timed out first, as a lazy global connect
/// from `SAGE_LOCK_URL` is when the service cuts the request) closes its connection at once,
/// rather than leaving it open until the command timeout: requests cut one after another
/// against a stalled server would otherwise pile up half-open connections (audit 35: 49 of
/// 50 left open for 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_the_caller_gives_up_on_closes_its_connection() {
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port();
    for _ in 0..5 {
        let cut = tokio::time::timeout(
            Duration::from_millis(200),
            LockClient::connect(&format!("redis://127.0.0.1:{port}")),
        )
        .await;
        assert!(cut.is_err(), "connected to a server that never answers");
    }
    silent.set_nonblocking(true).expect("nonblocking");
    let accepted: Vec<TcpStream> = std::iter::from_fn(|| silent.accept().ok())
        .map(|(stream, _)| stream)
        .collect();
    assert_eq!(accepted.len(), 5, "one connection per connect");
    // Well within the 5 s command timeout that bounds the handshake otherwise.
    let open = accepted
        .into_iter()
        .map(|stream| {
            stream.set_nonblocking(false).expect("blocking");
            closed_within(stream, Duration::from_millis(1500))
        })
        .filter(|closed| !closed)
        .count();
    assert_eq!(
        open, 0,
        "{open} of 5 cut connects left their connection open"
    );
}
