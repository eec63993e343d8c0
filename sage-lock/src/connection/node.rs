//! Whether the node a caller-configured fred client reaches can hold locks at all: checked once,
//! on the first lock or operator call, for clients made by `LockClient::from_fred` (a URL or the
//! builder checks at connect).

use std::time::Duration;

use fred::clients::Client;

/// The longest the check may hold up a first call; a server that does not answer by then is let
/// through, and the next call asks again.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// The once-per-client node check: none to do, or its outcome once a server answered.
pub(crate) struct NodeCheck(Option<tokio::sync::OnceCell<Option<String>>>);

impl NodeCheck {
    /// Nothing to check: the node was checked at connect, or the client is a cluster client.
    pub(crate) fn done() -> Self {
        NodeCheck(None)
    }

    /// Checked on first use: the client's configuration names one node (or Sentinels).
    pub(crate) fn on_first_use() -> Self {
        NodeCheck(Some(tokio::sync::OnceCell::new()))
    }

    /// Why no lock can be taken through `fred` (a cluster node, a Sentinel, a replica given
    /// directly), or `None`. After the first answer, an atomic load.
    pub(crate) async fn refusal(&self, fred: &Client) -> Option<String> {
        let cell = self.0.as_ref()?;
        let outcome = cell
            .get_or_try_init(|| async {
                crate::url::wrong_node_problem(fred, "the fred client's server", CHECK_TIMEOUT)
                    .await
                    .map(|problem| {
                        problem.map(|problem| {
                            format!(
                                "{problem} (for LockClient::from_fred: build the fred client \
                                 from that URL, or give it a ServerConfig of that kind)"
                            )
                        })
                    })
            })
            .await;
        outcome.ok().and_then(Clone::clone)
    }
}
