//! The process-wide client, service defaults and lock profiles that `#[locked]` uses.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sage_lock::LockError> {
//! use std::time::Duration;
//! use sage_lock::{global, LockClient};
//!
//! global::set_defaults(
//!     global::ServiceDefaults::new().lease(Duration::from_secs(10)).namespace("payments"),
//! )?;
//! global::install(LockClient::connect("redis://127.0.0.1:6379").await?)?;
//! # Ok(()) }
//! ```
//!
//! Without [`install`], the first use connects lazily to the URL in the `SAGE_LOCK_URL`
//! environment variable.

use tokio::sync::OnceCell;

use crate::client::LockClient;
use crate::error::LockError;

pub use crate::options::{ServiceDefaults, defaults, set_defaults};
pub use crate::profile::store::{check_profiles, profile, profiles, set_profiles};

/// The environment variable the lazy default client connects to (see [`client`]).
pub const URL_VARIABLE: &str = "SAGE_LOCK_URL";

static CLIENT: OnceCell<LockClient> = OnceCell::const_new();

/// Installs the process-wide client. Call it once, before the first `#[locked]` call (see the
/// [module example](self)).
///
/// # Errors
/// [`LockError::InvalidArgument`] when a client was already installed, or already connected
/// lazily from `SAGE_LOCK_URL` (also after that client's [`LockClient::quit`], which is final
/// for the process-wide client).
pub fn install(client: LockClient) -> Result<(), LockError> {
    CLIENT.set(client).map_err(|_| {
        let quit = CLIENT
            .get()
            .is_some_and(|installed| installed.inner.conn.is_closed());
        LockError::invalid(
            "global client",
            if quit {
                "the global client was closed by LockClient::quit(), which is final: it cannot \
                 be replaced, so #[locked] calls without `client = ...` fail for the rest of \
                 the process; quit the global client only at shutdown (pass a client of your \
                 own with `client = ...` where one must be replaced)"
            } else {
                "a global client is already installed (or was connected from SAGE_LOCK_URL); \
                 call sage_lock::global::install once, at start-up, before any #[locked] call"
            },
        )
    })
}

/// The process-wide client: the installed one, else one connected (once) from `SAGE_LOCK_URL`.
///
/// ```no_run
/// # async fn demo() -> Result<(), sage_lock::LockError> {
/// // SAGE_LOCK_URL=redis://127.0.0.1:6379 in the environment
/// let locks = sage_lock::global::client().await?.lock::<str>();
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`LockError::InvalidArgument`] when nothing was installed and `SAGE_LOCK_URL` is unset or
/// malformed; [`LockError::Backend`] when that server cannot be reached.
pub async fn client() -> Result<LockClient, LockError> {
    CLIENT
        .get_or_try_init(|| async {
            let url = std::env::var(URL_VARIABLE).map_err(|_| {
                LockError::invalid(
                    "global client",
                    "no global client: call sage_lock::global::install(client) at start-up, \
                     or set SAGE_LOCK_URL (e.g. redis://127.0.0.1:6379), or pass `client = ...` \
                     to #[locked]",
                )
            })?;
            if url.trim().is_empty() {
                return Err(LockError::invalid(
                    URL_VARIABLE,
                    "SAGE_LOCK_URL is set but empty: set it to the server's URL (e.g. \
                     redis://127.0.0.1:6379), or call sage_lock::global::install(client) at \
                     start-up",
                ));
            }
            LockClient::connect(&url).await.map_err(from_the_variable)
        })
        .await
        .cloned()
}

/// `error` of connecting to the URL in `SAGE_LOCK_URL`, saying where the URL came from.
fn from_the_variable(error: LockError) -> LockError {
    match error {
        LockError::InvalidArgument {
            argument: "url",
            message,
        } => LockError::invalid(URL_VARIABLE, format!("the URL in SAGE_LOCK_URL: {message}")),
        LockError::Backend { context, source } => LockError::backend(
            format!("{context} (the global client, from SAGE_LOCK_URL)"),
            source,
        ),
        other => other,
    }
}

/// The installed client, if any (no lazy connect).
///
/// ```
/// assert!(sage_lock::global::installed().is_none());
/// ```
#[must_use]
pub fn installed() -> Option<LockClient> {
    CLIENT.get().cloned()
}
