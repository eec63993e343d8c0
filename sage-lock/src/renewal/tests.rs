//! Unit tests of [`crate::renewal`].

use super::*;

/// A cluster groups holds by the node its routing names, and by slot when the routing is
/// unknown or the hold was moved; other deployments group by server. Never one call for keys
/// of several slots without a known node (a cluster would refuse it).
#[test]
fn holds_are_grouped_by_node_on_a_known_cluster_only() {
    use fred::types::Value;
    let node = |port: i64| {
        Value::Array(vec![
            Value::from("127.0.0.1"),
            Value::Integer(port),
            Value::from(format!("id{port}")),
        ])
    };
    let slots = Value::Array(vec![
        Value::Array(vec![Value::Integer(0), Value::Integer(8191), node(7000)]),
        Value::Array(vec![
            Value::Integer(8192),
            Value::Integer(16383),
            node(7001),
        ]),
    ]);
    let routing = Routing::from_cluster_slots(slots, "127.0.0.1").expect("routing");
    let port = |place: Place| match place {
        Place::Node(server) => Some(server.port),
        _ => None,
    };
    assert!(matches!(place_of(None, false, 5), Place::Server));
    assert_eq!(port(place_of(Some(Some(&routing)), false, 5)), Some(7000));
    assert_eq!(
        port(place_of(Some(Some(&routing)), false, 9000)),
        Some(7001)
    );
    assert!(matches!(
        place_of(Some(Some(&routing)), true, 5),
        Place::Slot(5)
    ));
    assert!(matches!(place_of(Some(None), false, 5), Place::Slot(5)));
    let empty = Routing::new();
    assert!(matches!(
        place_of(Some(Some(&empty)), false, 5),
        Place::Slot(5)
    ));
}

/// Short holds one after another, each released before the scheduler (woken for the
/// first) runs: only the first registration wakes it, and it still wakes in time for a
/// hold that stays.
#[test]
fn short_holds_do_not_wake_the_scheduler_each_time() {
    let start = Instant::now();
    let lease = Duration::from_secs(30);
    let idle = |now: Instant| now + Duration::from_secs(60);
    let mut state = State::default();
    let mut wakes = 0;
    for i in 0..100_u64 {
        let now = start + Duration::from_millis(i);
        let due = now + lease / 3;
        if state.must_wake_for(due) {
            wakes += 1;
        }
        state.queue.insert((due, i));
        // Released before the scheduler runs.
        state.queue.remove(&(due, i));
        // The scheduler, woken (or not), plans its next wake-up.
        state.plan_sleep(now, idle(now));
    }
    assert_eq!(wakes, 1, "only the first short hold wakes the scheduler");
    // A hold that stays is renewed in time: the scheduler wakes no later than its due.
    let now = start + Duration::from_millis(200);
    let due = now + lease / 3;
    let woken = state.must_wake_for(due);
    state.queue.insert((due, 1000));
    let planned = state.plan_sleep(now, idle(now));
    assert!(woken || state.sleeping_until.is_some_and(|until| until <= due));
    assert!(planned <= due, "the scheduler sleeps past a due renewal");
    // With nothing queued and the planned wake-up passed, it idles.
    state.queue.clear();
    let later = due + Duration::from_secs(1);
    assert_eq!(state.plan_sleep(later, idle(later)), idle(later));
}
