//! Unit tests of [`crate::notify`].

use super::listener::deliver_message;
use super::*;

#[test]
fn watches_are_counted_and_unsubscribed_channels_forgotten() {
    let notifier = Notifier::new(Client::default());
    let a = notifier.watch(b"{l:a}", Bytes::from_static(b"t1"));
    let b = notifier.watch(b"{l:a}", Bytes::from_static(b"t2"));
    assert_eq!(notifier.tracked(), 1);
    drop(a);
    assert_eq!(notifier.tracked(), 1);
    drop(b);
    assert_eq!(notifier.tracked(), 0);
}

#[tokio::test]
async fn only_the_named_token_is_woken() {
    let notifier = Notifier::new(Client::default());
    let watch = notifier.watch(b"{l:a}", Bytes::from_static(b"mine"));
    deliver(&notifier.shared, b"{l:a}:released", b"theirs", None);
    let woken = tokio::time::timeout(Duration::from_millis(20), watch.notified()).await;
    assert!(woken.is_err(), "woken by another waiter's notification");
    notifier.wake_local(b"{l:a}", b"mine", None);
    let woken = tokio::time::timeout(Duration::from_millis(200), watch.notified()).await;
    assert!(woken.is_ok());
    // The message for the same release is a duplicate: no second wake-up.
    deliver_message(&notifier.shared, b"{l:a}:released", &"mine".into());
    let again = tokio::time::timeout(Duration::from_millis(20), watch.notified()).await;
    assert!(again.is_err(), "woken twice for one release");
}

/// A release's reply and its message are one release: the second wakes nobody. A later
/// release that names the same waiter again (with a new grant: it could not use the first,
/// and queued again) wakes it again, and hands it the new grant.
#[tokio::test]
async fn a_second_release_naming_the_same_waiter_wakes_it_again() {
    let notifier = Notifier::new(Client::default());
    let watch = notifier.watch(b"{l:a}", Bytes::from_static(b"w"));
    let first =
        Grant::new(4, Some(std::time::Instant::now())).with_lease(Duration::from_millis(200));
    notifier.wake_local(b"{l:a}", b"w", Some(first));
    let woken = tokio::time::timeout(Duration::from_millis(200), watch.notified()).await;
    assert!(woken.is_ok(), "not woken by its own process's release");
    assert_eq!(watch.take_grant(), Some(first));
    deliver_message(&notifier.shared, b"{l:a}:released", &"w:4:200".into());
    let twin = tokio::time::timeout(Duration::from_millis(20), watch.notified()).await;
    assert!(twin.is_err(), "woken twice for one release");
    assert_eq!(watch.take_grant(), None, "one release's grant handed twice");
    deliver_message(&notifier.shared, b"{l:a}:released", &"w:6:2000".into());
    let again = tokio::time::timeout(Duration::from_millis(200), watch.notified()).await;
    assert!(again.is_ok(), "a later release naming it again was skipped");
    assert_eq!(
        watch.take_grant(),
        Some(Grant::new(6, None).with_lease(Duration::from_millis(2000)))
    );
    // The same when the message comes before the reply: the reply is then the twin.
    deliver_message(&notifier.shared, b"{l:a}:released", &"w:8:200".into());
    let woken = tokio::time::timeout(Duration::from_millis(200), watch.notified()).await;
    assert!(woken.is_ok(), "not woken by the message");
    notifier.wake_local(
        b"{l:a}",
        b"w",
        Some(Grant::new(8, Some(std::time::Instant::now())).with_lease(Duration::from_millis(200))),
    );
    let twin = tokio::time::timeout(Duration::from_millis(20), watch.notified()).await;
    assert!(twin.is_err(), "woken twice for one release");
}

/// Two local waiters of one key (a single-key waiter and a caller of several keys) each get
/// their own messages: the later watch does not take the earlier one's place.
#[tokio::test]
async fn two_waiters_of_one_channel_are_woken_each_by_name() {
    let notifier = Notifier::new(Client::default());
    let single = notifier.watch(b"{l:a}", Bytes::from_static(b"one"));
    let several = notifier.watch(b"{l:a}", Bytes::from_static(b"two"));
    deliver_message(&notifier.shared, b"{l:a}:released", &"one:3:100".into());
    let woken = tokio::time::timeout(Duration::from_millis(200), single.notified()).await;
    assert!(woken.is_ok(), "the earlier watch lost its message");
    assert_eq!(
        single.take_grant(),
        Some(Grant::new(3, None).with_lease(Duration::from_millis(100)))
    );
    assert_eq!(several.take_grant(), None, "another waiter's grant");
    deliver_message(&notifier.shared, b"{l:a}:released", &"two".into());
    let woken = tokio::time::timeout(Duration::from_millis(200), several.notified()).await;
    assert!(woken.is_ok(), "the later watch was not woken");
    let other = tokio::time::timeout(Duration::from_millis(20), single.notified()).await;
    assert!(other.is_err(), "woken by the other waiter's message");
}

/// A release of a primitive without a queue names nobody: its empty message wakes the
/// channel's waiter, every time (no duplicate suppression), and grants nothing.
#[tokio::test]
async fn an_empty_message_wakes_the_channels_waiter() {
    let notifier = Notifier::new(Client::default());
    let watch = notifier.watch(b"{l:a}:w}", Bytes::from_static(b"mine"));
    for _ in 0..2 {
        deliver_message(&notifier.shared, b"{l:a}:w}:released", &"".into());
        let woken = tokio::time::timeout(Duration::from_millis(200), watch.notified()).await;
        assert!(woken.is_ok(), "not woken by an announced release");
        assert_eq!(watch.take_grant(), None);
    }
    deliver_message(&notifier.shared, b"{l:a}:released", &"".into());
    let other = tokio::time::timeout(Duration::from_millis(20), watch.notified()).await;
    assert!(other.is_err(), "woken by another channel's release");
}

#[tokio::test]
async fn a_message_just_before_the_watch_is_not_lost() {
    let notifier = Notifier::new(Client::default());
    let early = notifier.watch(b"{l:a}", Bytes::from_static(b"first"));
    deliver(
        &notifier.shared,
        b"{l:a}:released",
        b"late",
        Some(Grant::new(9, None)),
    );
    let watch = notifier.watch(b"{l:a}", Bytes::from_static(b"late"));
    let woken = tokio::time::timeout(Duration::from_millis(200), watch.notified()).await;
    assert!(woken.is_ok(), "the early message was lost");
    assert_eq!(watch.take_grant(), Some(Grant::new(9, None)));
    assert_eq!(watch.take_grant(), None, "a grant is taken once");
    assert_eq!(early.take_grant(), None, "another waiter's grant");
    drop(early);
}

#[tokio::test]
async fn a_message_hands_its_grant_to_the_named_waiter_only() {
    let notifier = Notifier::new(Client::default());
    let watch = notifier.watch(b"{l:a}", Bytes::from_static(b"abc"));
    deliver_message(&notifier.shared, b"{l:a}:released", &"xyz:4".into());
    assert_eq!(watch.take_grant(), None);
    deliver_message(&notifier.shared, b"{l:a}:released", &"abc:5".into());
    let woken = tokio::time::timeout(Duration::from_millis(200), watch.notified()).await;
    assert!(woken.is_ok());
    assert_eq!(watch.take_grant(), Some(Grant::new(5, None)));
}

/// Accepts one connection on a loopback listener that never answers (as a paused server
/// does) while `notifier` asks for its subscriber until 300 ms from now; returns the accepted
/// socket, once `subscriber` gave up.
async fn silent_accept(
    listener: &tokio::net::TcpListener,
    notifier: &Notifier,
) -> tokio::net::TcpStream {
    let (accepted, subscriber) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(5), listener.accept()),
        notifier.subscriber(Instant::now() + Duration::from_millis(300)),
    );
    assert!(subscriber.is_none(), "no server answered, yet a subscriber");
    accepted
        .expect("the subscriber connected within 5 s")
        .expect("accept")
        .0
}

/// Whether the peer closes `socket` within `within`.
async fn closed_within(socket: &tokio::net::TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    tokio::time::timeout(within, async {
        loop {
            if socket.readable().await.is_err() {
                return;
            }
            match socket.try_read(&mut buf) {
                Ok(0) => return,
                Err(error) if error.kind() != std::io::ErrorKind::WouldBlock => return,
                _ => {}
            }
        }
    })
    .await
    .is_ok()
}

/// A notifier whose subscriber connects to `port` with `connect_timeout`.
fn notifier_for(port: u16, connect_timeout: Duration) -> Notifier {
    let config =
        fred::types::config::Config::from_url(&format!("redis://127.0.0.1:{port}")).expect("url");
    let connection = fred::types::config::ConnectionConfig {
        connection_timeout: connect_timeout,
        ..Default::default()
    };
    let template = fred::types::Builder::from_config(config)
        .set_connection_config(connection)
        .build()
        .expect("client");
    Notifier::new(template)
}

/// A subscriber connection that cannot complete before the waiter's deadline goes on opening in
/// the background (on a slow link, the next waiter finds it open), but only for the client's
/// connect timeout: against a server that accepts and never answers (as a paused one does),
/// it is closed then, not left to fred's own 10 s PING wait or to reconnect for ever.
#[tokio::test]
async fn a_subscriber_cut_short_by_the_deadline_closes_at_the_connect_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback listener");
    let port = listener.local_addr().expect("listener address").port();
    let notifier = notifier_for(port, Duration::from_secs(1));
    let socket = silent_accept(&listener, &notifier).await;
    assert!(
        !closed_within(&socket, Duration::from_millis(300)).await,
        "the opening was abandoned with the waiter's deadline, not continued in the background"
    );
    assert!(
        closed_within(&socket, Duration::from_secs(3)).await,
        "the subscriber connection is still open past its connect timeout"
    );
}

/// Closing (or dropping) the notifier abandons a subscriber connection still being opened in
/// the background: it closes at once, not at its connect timeout.
#[tokio::test]
async fn closing_the_notifier_closes_a_subscriber_being_opened() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback listener");
    let port = listener.local_addr().expect("listener address").port();
    let notifier = notifier_for(port, Duration::from_secs(30));
    let socket = silent_accept(&listener, &notifier).await;
    notifier.close().await;
    assert!(
        closed_within(&socket, Duration::from_secs(1)).await,
        "closed, the notifier left its subscriber connection opening"
    );
    let dropped = notifier_for(port, Duration::from_secs(30));
    let socket = silent_accept(&listener, &dropped).await;
    drop(dropped);
    assert!(
        closed_within(&socket, Duration::from_secs(1)).await,
        "dropped, the notifier left its subscriber connection opening"
    );
}

/// A release of a read-write lock names several readers, one message each, and this process's
/// own release reply names the first of them again, possibly after the messages. A reader of
/// this process named by one of those messages, whose refused attempt returned just before the
/// release but who watches the channel only after the messages came, still finds its grant.
/// Before, the channel kept only the last naming: the reader missed its hand-off and entered at
/// its next poll (about 250 ms later) while a queued writer waited behind it.
#[tokio::test]
async fn a_naming_before_the_watch_is_found_after_later_namings() {
    let notifier = Notifier::new(Client::default());
    // Another local waiter keeps the channel tracked (subscribed) meanwhile.
    let _other = notifier.watch(b"{l:a}", Bytes::from_static(b"other"));
    deliver_message(&notifier.shared, b"{l:a}:released", &"r1:5:200".into());
    deliver_message(&notifier.shared, b"{l:a}:released", &"late:6:200".into());
    deliver_message(&notifier.shared, b"{l:a}:released", &"r3:7:200".into());
    notifier.wake_local(
        b"{l:a}",
        b"r1",
        Some(Grant::new(5, Some(std::time::Instant::now())).with_lease(Duration::from_millis(200))),
    );
    let late = notifier.watch(b"{l:a}", Bytes::from_static(b"late"));
    let woken = tokio::time::timeout(Duration::from_millis(200), late.notified()).await;
    assert!(woken.is_ok(), "the naming before the watch was lost");
    assert_eq!(
        late.take_grant(),
        Some(Grant::new(6, None).with_lease(Duration::from_millis(200)))
    );
}
