use super::*;
use quote::quote;

fn messages(tokens: TokenStream) -> Vec<String> {
    let mut errors = Errors::default();
    let _ = parse(tokens, &mut errors);
    errors.messages()
}

#[test]
fn accepts_every_argument() {
    let mut errors = Errors::default();
    let args = parse(
        quote!(
            key = "a:{id}",
            lease = "10s",
            namespace = "ns",
            replica_ack = false,
            try_lock,
            client = self.locks,
            crate = ::sage_lock,
            hold_at_least = "30s",
            reentrant
        ),
        &mut errors,
    );
    assert!(errors.is_empty());
    assert_eq!(args.hold_at_least.map(|h| h.millis), Some(30_000));
    assert!(args.reentrant.is_some());
    assert!(args.try_lock);
    assert_eq!(args.lease.map(|l| l.millis), Some(10_000));
    assert_eq!(args.replica_ack.map(|(on, _)| on), Some(false));
    assert!(matches!(args.key, Some(KeyArg::Template(_))));
    assert!(args.client.is_some());
    assert!(args.krate.is_some());
}

#[test]
fn reports_problems_with_fixes() {
    let all = messages(quote!(key = id, timeout = "2s"));
    assert!(all[0].contains("did you mean `wait`?"), "{all:?}");
    // One error per typo: the argument it suggests is not reported missing too.
    assert_eq!(all.len(), 1, "{all:?}");
    let all = messages(quote!(key = id, tiemout = "2s"));
    assert!(all[0].contains("unknown argument"), "{all:?}");
    assert!(all.iter().any(|m| m.contains("needs `wait")), "{all:?}");
    let all = messages(quote!(key = id, wait = "2s", wiat = "1s"));
    assert!(all[0].contains("did you mean `wait`?"), "{all:?}");
    let all = messages(quote!(key = id, wait = "2s", wait = "1s"));
    assert!(all[0].contains("duplicate `wait`"), "{all:?}");
    let all = messages(quote!(key = id, wait = "2s", try_lock));
    assert!(all[0].contains("cannot be combined"), "{all:?}");
    let all = messages(quote!(key = id, wait = 2));
    assert!(all[0].contains("wait = \"2s\""), "{all:?}");
    let all = messages(quote!(key = id, try_lock, lease = 10));
    assert!(all[0].contains("lease = \"10s\""), "{all:?}");
    let all = messages(quote!(key = id, try_lock, lease = "10ms"));
    assert!(all[0].contains("at least 30ms"), "{all:?}");
    // The runtime's bounds (`sage-lock/src/options.rs`), at their edges.
    assert!(messages(quote!(key = id, try_lock, lease = "30ms")).is_empty());
    assert!(messages(quote!(key = id, try_lock, lease = "8760h")).is_empty());
    assert!(messages(quote!(key = id, try_lock, hold_at_least = "8760h")).is_empty());
    let all = messages(quote!(key = id, try_lock, lease = "8760h1ms"));
    assert!(all[0].contains("at most one year"), "{all:?}");
    assert!(all[0].contains("got 8760h1ms"), "{all:?}");
    let all = messages(quote!(key = id, try_lock, hold_at_least = "9000h"));
    assert!(all[0].contains("at most one year"), "{all:?}");
    assert_eq!(MAX_DURATION_MILLIS, 8760 * 3_600_000);
    let all = messages(quote!(key = id, wait = "0s"));
    assert!(all[0].contains("must be positive"), "{all:?}");
    let all = messages(quote!(key = id, try_lock = "yes"));
    assert!(all[0].contains("`try_lock` alone"), "{all:?}");
    let all = messages(quote!(key = id, try_lock, replica_ack = 1));
    assert!(all[0].contains("replica_ack = false"), "{all:?}");
    let all = messages(quote!(key = id, try_lock, namespace = ""));
    assert!(all[0].contains("cannot be empty"), "{all:?}");
    let all = messages(quote!(key = id, try_lock, namespace = "  "));
    assert!(
        all.first().is_some_and(|m| m.contains("cannot be empty")),
        "{all:?}"
    );
    let all = messages(quote!(wait = "1s"));
    assert!(all[0].contains("needs a `key`"), "{all:?}");
    let all = messages(quote!(key = id, profile = ""));
    assert!(all[0].contains("cannot be empty"), "{all:?}");
    let all = messages(quote!(key = id, profile = "a b"));
    assert!(all[0].contains("maps to environment variables"), "{all:?}");
    let all = messages(quote!(key = id, profile = name));
    assert!(all[0].contains("string literal"), "{all:?}");
    let all = messages(quote!(key = id, profile));
    assert!(all[0].contains("needs a value"), "{all:?}");
    let all = messages(quote!(key = id, profile = "p", wait = "2s", try_lock));
    assert!(all[0].contains("cannot be combined"), "{all:?}");
    let all = messages(quote!(key = id, settings = "p"));
    assert!(all[0].contains("did you mean `profile`?"), "{all:?}");
    assert!(messages(quote!(key = id, profile = "account-updates.v2")).is_empty());
    let all = messages(quote!(key = id, try_lock, namespace = " accounts "));
    assert!(all[0].contains("`namespace = \"accounts\"`"), "{all:?}");
    assert!(messages(quote!(key = id, try_lock, reentrant = true)).is_empty());
    assert!(messages(quote!(key = id, try_lock, reentrant = false)).is_empty());
    assert!(messages(quote!(key = [a, b], try_lock, reentrant = false)).is_empty());
    let all = messages(quote!(key = id, try_lock, reentrant = "yes"));
    assert!(
        all[0].contains("`reentrant = true` or `reentrant = false`"),
        "{all:?}"
    );
    let all = messages(quote!(key = id, try_lock, reentrant, reentrant));
    assert!(all[0].contains("duplicate `reentrant`"), "{all:?}");
    let all = messages(quote!(key = id, try_lock, hold_at_least = 30));
    assert!(all[0].contains("hold_at_least = \"30s\""), "{all:?}");
    let all = messages(quote!(key = id, try_lock, hold_at_least = "0s"));
    assert!(all.is_empty(), "{all:?}");
    let all = messages(quote!(key = id, try_lock, lock_at_least = "1s"));
    assert!(all[0].contains("did you mean `hold_at_least`?"), "{all:?}");
    let all = messages(quote!(key "x"));
    assert!(all[0].contains("expected `=`"), "{all:?}");
}
