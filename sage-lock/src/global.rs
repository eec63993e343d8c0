//! The process-wide client and service defaults that `#[locked]` uses.
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

use std::sync::OnceLock;
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::client::LockClient;
use crate::error::LockError;
use crate::locks::{validate_lease, validate_namespace};

/// The environment variable the lazy default client connects to (see [`client`]).
pub const URL_VARIABLE: &str = "SAGE_LOCK_URL";

static CLIENT: OnceCell<LockClient> = OnceCell::const_new();
static DEFAULTS: OnceLock<ServiceDefaults> = OnceLock::new();
static BUILT_IN: OnceLock<ServiceDefaults> = OnceLock::new();

/// Installs the process-wide client. Call it once, before the first `#[locked]` call (see the
/// [module example](self)).
///
/// # Errors
/// [`LockError::InvalidArgument`] when a client was already installed, or already connected
/// lazily from `SAGE_LOCK_URL`.
pub fn install(client: LockClient) -> Result<(), LockError> {
    CLIENT.set(client).map_err(|_| {
        LockError::invalid(
            "global client",
            "a global client is already installed (or was connected from SAGE_LOCK_URL); \
             call sage_lock::global::install once, at start-up, before any #[locked] call",
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
            LockClient::connect(&url).await
        })
        .await
        .cloned()
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

/// Service-wide lock defaults: used wherever a lock family or `#[locked]` leaves one unset.
/// Installed with [`set_defaults`] (see the [module example](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServiceDefaults {
    /// Default lease (built-in: 30 s).
    pub lease: Duration,
    /// Default namespace (built-in: `lock`).
    pub namespace: String,
    /// Default replica acknowledgement (built-in: on).
    pub replica_acknowledgement: bool,
}

impl Default for ServiceDefaults {
    fn default() -> Self {
        ServiceDefaults {
            lease: Duration::from_secs(30),
            namespace: "lock".to_owned(),
            replica_acknowledgement: true,
        }
    }
}

impl ServiceDefaults {
    /// The built-in defaults.
    #[must_use]
    pub fn new() -> Self {
        ServiceDefaults::default()
    }

    /// Sets the default lease.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets the default namespace.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets the default replica acknowledgement.
    #[must_use]
    pub fn replica_acknowledgement(mut self, on: bool) -> Self {
        self.replica_acknowledgement = on;
        self
    }
}

/// Sets the service-wide defaults, once. Lock families created earlier keep what they resolved.
/// See the [module example](self).
///
/// # Errors
/// [`LockError::InvalidArgument`] for a lease below 30 ms, an empty namespace, or a second call.
pub fn set_defaults(defaults: ServiceDefaults) -> Result<(), LockError> {
    validate_lease(defaults.lease)?;
    validate_namespace(&defaults.namespace)?;
    DEFAULTS.set(defaults).map_err(|_| {
        LockError::invalid(
            "defaults",
            "service defaults were already set; set them once, at start-up",
        )
    })
}

/// The service-wide defaults in effect.
///
/// ```
/// assert_eq!(sage_lock::global::defaults().namespace, "lock"); // nothing set: built-in
/// ```
#[must_use]
pub fn defaults() -> &'static ServiceDefaults {
    DEFAULTS
        .get()
        .unwrap_or_else(|| BUILT_IN.get_or_init(ServiceDefaults::default))
}
