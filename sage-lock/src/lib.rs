//! # sage-lock
//!
//! Distributed locks for Rust services on Redis and Valkey.
//!
//! A body runs only while this process holds a lease on a key; the lease is renewed while the
//! body runs and released when it ends. The same code works on a standalone server, a primary
//! with replicas (directly or through Sentinel), and a cluster, where acquisition and renewal
//! wait for replicas to acknowledge (`WAIT`) and check the primary's role (`ROLE`).
//!
//! ```no_run
//! use std::time::Duration;
//! use sage_lock::{LockClient, LockOptions};
//!
//! # async fn demo() -> Result<(), sage_lock::LockError> {
//! let client = LockClient::connect("redis://127.0.0.1:6379").await?;
//! let locks = client.lock_with::<u64>(
//!     LockOptions::new().lease(Duration::from_secs(10)).namespace("account-updates"),
//! )?;
//! let new_balance = locks
//!     .with_lock(&42, Duration::from_secs(2), async {
//!         // read-modify-write the account; at most one process is here at a time
//!         100
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Or declaratively, with [`locked`]:
//!
//! ```no_run
//! # use sage_lock::LockError;
//! # #[derive(Debug)] struct AppError(LockError);
//! # impl From<LockError> for AppError { fn from(e: LockError) -> Self { AppError(e) } }
//! #[sage_lock::locked(key = "account:{id}", wait = "2s", namespace = "account-updates")]
//! async fn update_account(id: u64, delta: i64) -> Result<(), AppError> {
//!     // at most one process runs this for a given `id` at a time
//!     Ok(())
//! }
//! ```
//!
//! ## Read-write locks, semaphores and several keys
//!
//! The same client offers [`RwLocks`] (many readers or one writer per key), [`Semaphores`] (at
//! most `permits` holders per key, a lease per permit) and all-or-nothing holds of several keys
//! ([`Locks::with_locks`]), with the mutex's options, errors and guarantees:
//!
//! ```no_run
//! # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
//! use std::time::Duration;
//! let wait = Duration::from_secs(2);
//!
//! let reports = client.rw_lock::<str>();
//! let total = reports.read("report:7", wait, async { 42 }).await?;
//! reports.write("report:7", wait, async { /* alone */ }).await?;
//!
//! let exports = client.semaphore::<str>(4);
//! exports.acquire("export", wait, async { /* one of at most 4 */ }).await?;
//!
//! let accounts = client.lock::<str>();
//! accounts.with_locks(&["account:a", "account:b"], wait, async { /* both */ }).await?;
//! # Ok(()) }
//! ```
//!
//! [`locked`] has the same modes, checked at compile time:
//!
//! ```no_run
//! #[sage_lock::locked(key = "report:{id}", wait = "2s", mode = "read")]
//! async fn read_report(id: u64) -> Result<u64, sage_lock::LockError> { Ok(id) }
//!
//! #[sage_lock::locked(key = "export", try_lock, permits = 4)]
//! async fn export() -> Result<Option<()>, sage_lock::LockError> { Ok(()) }
//!
//! #[sage_lock::locked(key = ["account:{from}", "account:{to}"], wait = "2s")]
//! async fn transfer(from: u64, to: u64) -> Result<(), sage_lock::LockError> { Ok(()) }
//! ```
//!
//! ## Runtime
//!
//! sage-lock runs on Tokio. A lock call, an operator tool, [`LockClient::connect`] or
//! [`LockClient::dedicated_connection`] polled outside a Tokio runtime fails with
//! [`LockError::Backend`] of fred's kind `Config`. [`LockClient::from_fred`] and
//! [`LockClient::quit`] also work outside one.
//!
//! ## Observability
//!
//! Events go through [`tracing`](https://docs.rs/tracing), with `key` and `namespace` fields
//! (`DEBUG` for the normal path, `WARN` for losses and failed releases). Counters and histograms
//! go through the [`metrics`](https://docs.rs/metrics) facade, each labelled by `namespace`:
//!
//! | metric | kind | meaning |
//! |---|---|---|
//! | `sage_lock_acquisitions_total` | counter | locks acquired |
//! | `sage_lock_busy_retries_total` | counter | attempts that found the lock held by another owner (a try call's included) |
//! | `sage_lock_handoffs_total` | counter | acquisitions a release handed over on the server |
//! | `sage_lock_transient_retries_total` | counter | acquisition attempts that hit a transient failure |
//! | `sage_lock_timeouts_total` | counter | acquisitions that gave up ([`LockError::TimedOut`]), also labelled by `reason`: `busy`, `not_acknowledged`, `unavailable`, `pool_exhausted`, `held_by_this_task`, `behind_own_hold` (the [`TimeoutReason`]) |
//! | `sage_lock_renewals_total` | counter | successful renewals |
//! | `sage_lock_renewal_failures_total` | counter | renewal attempts that failed (may recover) |
//! | `sage_lock_losses_total` | counter | held locks lost |
//! | `sage_lock_releases_total` | counter | holds removed by their owner |
//! | `sage_lock_release_failures_total` | counter | holds whose release failed or went unanswered (the key expires with its lease) |
//! | `sage_lock_fence_regressions_total` | counter | exclusive grants' fencing tokens lower than one this client saw before for the key |
//! | `sage_lock_wait_seconds` | histogram | time from call to acquisition |
//! | `sage_lock_hold_seconds` | histogram | time from acquisition to the body's end or loss |
//!
//! The metric handles are registered when a lock family is created, so install the recorder
//! before creating lock families. The same counters, without a recorder:
//! [`LockClient::stats`].
//!
//! ## Keys left on the server
//!
//! The mutex on key `k` in namespace `ns` is the string key `{ns:k}` (see
//! [`LockClient::server_key`]), removed on release. Every key ever locked also leaves
//! `{ns:k}:fence`, its fencing counter, without an expiry, and (for a mutex) `{ns:k}:since`, the
//! last grant's marker, which expires 10 years after that grant: together about 150–220 bytes per
//! key ever locked, kept for ever (about 200 MB per million distinct keys). Deleting both frees
//! them, but restarts that key's fencing tokens at 1. Use a dedicated namespace for locks.
//!
//! ## Cargo features
//!
//! - `serde`: `Deserialize` for [`LockOptions`], [`Profile`] and [`Profiles`] (durations as
//!   text: `"2s"`, `"1m30s"`).
//! - `uuid`: [`KeyCodec`] for `uuid::Uuid` (hyphenated, lower-case).
//!
//! ## Limits
//!
//! Exclusivity holds only while the lease is valid and the server keeps the key. A long process
//! pause, a failover that loses a not-yet-replicated write, or an evicted or deleted lock key can
//! still allow overlapping work. Replica acknowledgement narrows the failover window but does not
//! make Redis or Valkey strongly consistent. Where correctness must survive those failures, have
//! the downstream store check the [`Lease::fencing_token`].

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

// Layers, bottom to top (each module imports only from layers below it):
//   utilities:   error, key, lease, observe, retry, runtime (the Tokio runtime check), scripts,
//                replicas, redirect, topology, url, duration, options, profile (named options:
//                data, environment overrides, the installed set)
//   connection:  pool, sentinel (replica count per Sentinel), connection (shared client,
//                dedicated pool, checked script runs)
//   engine:      renewal, engine (acquire → hold → release, generic over a primitive's Rules)
//   primitives:  primitives::* (each states its scripts and rules)
//   façade:      client (LockClient), global, macro_support, macro_profile, resident (counts
//                of a client's records, for tests)
mod acl;
mod builder;
mod client;
mod connection;
mod duration;
mod engine;
mod error;
pub mod global;
mod key;
mod lease;
mod macro_modes;
mod macro_profile;
mod macro_support;
mod notify;
mod observe;
mod options;
mod pool;
mod primitives;
mod profile;
mod redirect;
mod renewal;
mod replicas;
mod resident;
mod retry;
mod runtime;
mod scripts;
mod sentinel;
mod tls;
mod topology;
mod url;

pub use builder::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_RENEWAL_BATCH_LIMIT,
    LockClientBuilder,
};
pub use client::LockClient;
pub use engine::{RELEASE_TIMEOUT, TRY_LOCK_RETRY_WINDOW};
pub use error::{LockError, LossReason, TimeoutReason};
pub use key::KeyCodec;
pub use lease::{Lease, current_lease};
pub use observe::LockStats;
pub use options::{LockOptions, MIN_LEASE};
pub use pool::DedicatedConnection;
pub use primitives::mutex::Locks;
pub use primitives::operator::{HeldLock, HolderInfo};
pub use primitives::rwlock::{RwLocks, WRITER_INTENT};
pub use primitives::semaphore::Semaphores;
pub use profile::{Profile, Profiles};
pub use replicas::REPLICA_LOSS_HOLD;
pub use sage_lock_macros::locked;
pub use topology::Deployment;

/// The fred client crate, re-exported so its types match the ones sage-lock uses.
pub use fred;

/// What `#[locked]`'s generated code calls, and counts of a client's records for tests. Not a
/// public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::macro_modes::*;
    pub use crate::macro_profile::*;
    pub use crate::macro_support::*;
    pub use crate::resident::{Resident, resident};
}
