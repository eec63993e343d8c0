//! "Did you mean" hints for misspelt or misremembered argument names: the argument names,
//! common aliases users reach for, and the closest candidate by edit distance.

/// The argument names, for "did you mean" hints.
pub(crate) const NAMES: [&str; 13] = [
    "key",
    "profile",
    "wait",
    "lease",
    "namespace",
    "replica_ack",
    "try_lock",
    "client",
    "crate",
    "hold_at_least",
    "reentrant",
    "mode",
    "permits",
];

/// Common names users reach for, and the argument they mean.
pub(crate) fn alias(name: &str) -> Option<&'static str> {
    Some(match name {
        "timeout" | "wait_timeout" | "wait_for" | "max_wait" | "waiting" | "acquire_timeout" => {
            "wait"
        }
        "lease_duration" | "lease_time" | "ttl" | "expiry" | "expire" | "expires" | "duration" => {
            "lease"
        }
        "ns" | "name_space" | "prefix" | "scope" => "namespace",
        "replica_acknowledgement"
        | "replica_acknowledgment"
        | "replica_acks"
        | "replicas_ack"
        | "ack"
        | "replicas" => "replica_ack",
        "try" | "nowait" | "no_wait" | "trylock" | "try_with_lock" | "non_blocking"
        | "nonblocking" => "try_lock",
        "locks" | "lock_client" | "conn" | "connection" | "redis" => "client",
        "keys" | "name" | "resource" | "template" => "key",
        "config" | "settings" | "preset" | "profile_name" | "profiles" => "profile",
        "lock_at_least" | "lock_at_least_for" | "at_least" | "min_hold" | "minimum_hold"
        | "hold_min" | "hold_for" | "min_lease" | "hold_at_least_for" => "hold_at_least",
        "reentrancy" | "re_entrant" | "recursive" | "reentrant_lock" | "nested" => "reentrant",
        "rw" | "read_write" | "access" | "lock_mode" => "mode",
        "semaphore" | "limit" | "max_holders" | "concurrency" | "slots" => "permits",
        _ => return None,
    })
}

/// The candidate closest to `name` by edit distance, if it is close enough to be a typo.
pub(crate) fn closest<'a>(name: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let limit = match name.chars().count() {
        0..=2 => 1,
        3..=5 => 2,
        _ => 3,
    };
    candidates
        .iter()
        .map(|candidate| (edit_distance(name, candidate), *candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance, counting an adjacent swap as one edit.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.to_lowercase().chars().collect();
    let b: Vec<char> = b.to_lowercase().chars().collect();
    let mut rows = vec![vec![0_usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

/// The error for an argument `#[locked]` does not have, with a hint when one is close.
/// The argument an unknown `name` most likely means, if any.
pub(crate) fn meant(name: &str) -> Option<&'static str> {
    alias(name).or_else(|| closest(name, &NAMES))
}

pub(crate) fn unknown_argument(name: &str) -> String {
    let suggestion = meant(name);
    let known = "the arguments are `key`, `profile`, `wait`, `lease`, `namespace`, \
                 `replica_ack`, `try_lock`, `client`, `hold_at_least`, `reentrant`, `mode` and \
                 `permits`";
    match suggestion {
        Some(good) => format!("unknown argument `{name}`: did you mean `{good}`? ({known})"),
        None => format!("unknown argument `{name}`: {known}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names() {
        assert_eq!(closest("namespce", &NAMES), Some("namespace"));
        assert_eq!(closest("try_lcok", &NAMES), Some("try_lock"));
        assert_eq!(closest("zzzzzz", &NAMES), None);
        assert_eq!(alias("timeout"), Some("wait"));
    }
}
