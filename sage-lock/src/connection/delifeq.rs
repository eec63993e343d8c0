//! Valkey 9's native `DELIFEQ`: whether the server has it (asked once), and the uncontended
//! release with it.

use fred::interfaces::ClientLike;
use fred::types::Value;
use tokio::time::Instant;

use super::Connection;

pub(super) const DELIFEQ_UNKNOWN: u8 = 0;
pub(super) const DELIFEQ_PRESENT: u8 = 1;
pub(super) const DELIFEQ_ABSENT: u8 = 2;

impl Connection {
    /// `DELIFEQ key value` (Valkey 9's native compare-and-delete) on a standalone server, within
    /// `deadline`: `Some(true)` when it deleted the key, `Some(false)` when the key held another
    /// value (or none), `None` when it cannot tell (no such command, a replicated deployment,
    /// which needs the checked path, or a failure), so the caller falls back to its script.
    /// Whether the server has the command is asked once (`INFO server`: Valkey 9 or later); a
    /// refused `DELIFEQ` (an ACL without `+delifeq`) turns the fast path off for this client.
    pub(crate) async fn delete_if_equal(
        &self,
        key: &fred::bytes::Bytes,
        value: &fred::bytes::Bytes,
        deadline: Instant,
    ) -> Option<bool> {
        use std::sync::atomic::Ordering;
        if self.deployment.is_replicated() {
            return None;
        }
        let known = self.delifeq.load(Ordering::Acquire);
        if known == DELIFEQ_ABSENT {
            return None;
        }
        if known == DELIFEQ_UNKNOWN {
            // Valkey 9 has it (Redis 7 has not): asked once through `INFO server`, which every
            // deployment allows. Any failure counts as absent: the script always works.
            let asked = tokio::time::timeout_at(
                deadline,
                self.fred
                    .info::<String>(Some(fred::types::InfoKind::Server)),
            )
            .await;
            let present = matches!(&asked, Ok(Ok(info)) if has_delifeq(info));
            let state = if present {
                DELIFEQ_PRESENT
            } else {
                DELIFEQ_ABSENT
            };
            self.delifeq.store(state, Ordering::Release);
            if !present {
                return None;
            }
        }
        let command = fred::types::CustomCommand::new_static(
            "DELIFEQ",
            fred::types::ClusterHash::FirstKey,
            false,
        );
        let args = vec![Value::Bytes(key.clone()), Value::Bytes(value.clone())];
        match tokio::time::timeout_at(deadline, self.fred.custom::<Value, Value>(command, args))
            .await
        {
            Ok(Ok(reply)) => reply.as_i64().map(|deleted| deleted == 1),
            Ok(Err(error)) => {
                // Denied by an ACL (or otherwise refused): stop trying; the script works.
                tracing::debug!(%error, "DELIFEQ failed; releases use the script from now on");
                self.delifeq.store(DELIFEQ_ABSENT, Ordering::Release);
                None
            }
            Err(_) => None,
        }
    }
}

/// Whether `INFO server` text comes from a server with `DELIFEQ` (Valkey 9 or later).
fn has_delifeq(info: &str) -> bool {
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
