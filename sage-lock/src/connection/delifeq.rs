//! Compare-and-delete of one key, the uncontended release: Valkey 9's native `DELIFEQ` where
//! the server has it (asked until answered, one release at a time), else a one-key script doing
//! the same.

use std::sync::LazyLock;

use fred::interfaces::ClientLike;
use fred::types::Value;
use tokio::time::Instant;

use super::Connection;
use crate::retry::Failure;
use crate::scripts::Script;

/// `DELIFEQ` as a script, for servers without it (Redis, Valkey before 9): KEYS: the key;
/// ARGV: the value. Replies 1 when it deleted the key, else 0.
const DELETE_IF_EQUAL: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

static DELETE_IF_EQUAL_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(DELETE_IF_EQUAL));

pub(super) const DELIFEQ_UNKNOWN: u8 = 0;
pub(super) const DELIFEQ_PRESENT: u8 = 1;
pub(super) const DELIFEQ_ABSENT: u8 = 2;
/// A release is asking the server (the others meanwhile use the script).
const DELIFEQ_ASKING: u8 = 3;

impl Connection {
    /// Deletes `key` (in hash slot `slot`) if it holds `value`, on a deployment without
    /// replicas, within `deadline`: `Some(true)` when it deleted the key, `Some(false)` when the
    /// key held another value (or none), `None` when it cannot tell (a replicated deployment,
    /// which needs the checked path, or a failure), so the caller falls back to its own script.
    /// Sends `DELIFEQ key value` (Valkey 9's native compare-and-delete) where the server has it
    /// (`INFO server`: Valkey 9 or later, see `sends_delifeq`), else a one-key script; a refused `DELIFEQ`
    /// (an ACL without `+delifeq`) turns to the script for this client.
    pub(crate) async fn delete_if_equal(
        &self,
        key: &fred::bytes::Bytes,
        slot: u16,
        value: &fred::bytes::Bytes,
        deadline: Instant,
    ) -> Option<bool> {
        use std::sync::atomic::Ordering;
        if self.deployment.is_replicated() || self.is_closed() {
            return None;
        }
        if !self.sends_delifeq(deadline).await {
            let call = DELETE_IF_EQUAL_SCRIPT.call(
                slot,
                vec![key.clone()],
                vec![Value::Bytes(value.clone())],
            );
            return match self.run_plain(&call, deadline).await {
                Ok(reply) => reply.as_i64().map(|deleted| deleted == 1),
                Err(error) => {
                    tracing::debug!(?error, "compare-and-delete script failed");
                    None
                }
            };
        }
        let command = fred::types::CustomCommand::new_static(
            "DELIFEQ",
            fred::types::ClusterHash::FirstKey,
            false,
        );
        let args = vec![Value::Bytes(key.clone()), Value::Bytes(value.clone())];
        // Boxed, as in `run_plain`: fred's command future is large.
        let fred = self.fred().with_options(&super::CALLER_TIMED);
        let delifeq = Box::pin(async move { fred.custom::<Value, Value>(command, args).await });
        match tokio::time::timeout_at(deadline, delifeq).await {
            Ok(Ok(reply)) => reply.as_i64().map(|deleted| deleted == 1),
            Ok(Err(error)) if crate::retry::classify(&error) == Failure::Permanent => {
                // Denied by an ACL (or otherwise refused): stop trying; the script works.
                tracing::debug!(%error, "DELIFEQ failed; releases use the script from now on");
                self.delifeq.store(DELIFEQ_ABSENT, Ordering::Release);
                None
            }
            // A lost connection, a server busy or loading: the next release sends it again.
            Ok(Err(error)) => {
                tracing::debug!(%error, "DELIFEQ failed on the way");
                None
            }
            Err(_) => None,
        }
    }

    /// Records what an `INFO` read for another purpose (the node check at connect) says about
    /// `DELIFEQ`, unless a release already asked: the first releases then need not ask.
    pub(crate) fn learn_delifeq(&self, present: bool) {
        use std::sync::atomic::Ordering;
        let state = if present {
            DELIFEQ_PRESENT
        } else {
            DELIFEQ_ABSENT
        };
        let _ = self.delifeq.compare_exchange(
            DELIFEQ_UNKNOWN,
            state,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Whether this client sends `DELIFEQ`: Valkey 9 has it (Redis 7 has not), asked through
    /// `INFO server`, which every deployment allows, by one release at a time (the others use
    /// the script meanwhile). A refusal counts as absent for good: the script always works. An
    /// unanswered question is asked again by a later release.
    async fn sends_delifeq(&self, deadline: Instant) -> bool {
        use std::sync::atomic::Ordering;
        // A plain read on the uncontended path, once answered.
        match self.delifeq.load(Ordering::Acquire) {
            DELIFEQ_PRESENT => return true,
            DELIFEQ_ABSENT | DELIFEQ_ASKING => return false,
            _ => {}
        }
        let asking = self.delifeq.compare_exchange(
            DELIFEQ_UNKNOWN,
            DELIFEQ_ASKING,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        match asking {
            Ok(_) => {}
            Err(state) => return state == DELIFEQ_PRESENT,
        }
        // Cut short (this release's future dropped), the question is left to a later release.
        let mut asking = Asking(Some(&self.delifeq));
        let info = Box::pin(
            self.fred()
                .info::<String>(Some(fred::types::InfoKind::Server)),
        );
        let (state, present) = match tokio::time::timeout_at(deadline, info).await {
            Ok(Ok(info)) if has_delifeq(&info) => (DELIFEQ_PRESENT, true),
            Ok(Ok(_)) => (DELIFEQ_ABSENT, false),
            Ok(Err(error)) if crate::retry::classify(&error) == Failure::Permanent => {
                (DELIFEQ_ABSENT, false)
            }
            Ok(Err(_)) | Err(_) => (DELIFEQ_UNKNOWN, false),
        };
        asking.settle(state);
        present
    }
}

/// A release's question whether the server has `DELIFEQ`: what it found when it settles, else
/// (dropped unsettled) unknown again.
struct Asking<'a>(Option<&'a std::sync::atomic::AtomicU8>);

impl Asking<'_> {
    fn settle(&mut self, state: u8) {
        if let Some(delifeq) = self.0.take() {
            delifeq.store(state, std::sync::atomic::Ordering::Release);
        }
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.settle(DELIFEQ_UNKNOWN);
    }
}

/// Whether `INFO server` text comes from a server with `DELIFEQ` (Valkey 9 or later).
pub(super) fn has_delifeq(info: &str) -> bool {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("valkey_version:"))
        .and_then(|version| version.split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 9)
}

#[cfg(test)]
mod tests {
    use super::has_delifeq;

    #[test]
    fn delifeq_comes_with_valkey_9() {
        assert!(has_delifeq(
            "# Server\r\nredis_version:7.2.4\r\nvalkey_version:9.1.2\r\n"
        ));
        assert!(has_delifeq("valkey_version:10.0.0"));
        assert!(!has_delifeq("valkey_version:8.1.0\r\n"));
        assert!(!has_delifeq("# Server\r\nredis_version:7.0.15\r\n"));
    }
}
