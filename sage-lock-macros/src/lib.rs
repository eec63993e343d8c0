//! The `#[locked]` attribute of [sage-lock](https://docs.rs/sage-lock). Use it through the
//! re-export, `sage_lock::locked`, whose documentation describes the arguments, key templates and
//! return types; this crate only parses the attribute and generates code that calls
//! `sage_lock::__private`.

mod args;
mod duration;
mod errors;
mod expand;
mod key;
mod modes;
mod profile;
mod shape;
mod suggest;
mod tokens;

use proc_macro::TokenStream;

/// Runs the body of an `async fn` while holding a distributed lock on a key built from its
/// arguments: waits for the lock (or, with `try_lock`, gives up at once when it is busy),
/// renews it while the body runs, and releases it when the body ends.
///
/// ```no_run
/// use sage_lock::{locked, LockError};
/// # #[derive(Debug)] struct AppError(LockError);
/// # impl From<LockError> for AppError { fn from(e: LockError) -> Self { AppError(e) } }
/// # struct Receipt(u64);
/// # impl Receipt { fn new(id: u64) -> Self { Receipt(id) } }
///
/// #[locked(key = "account:{id}", wait = "2s", namespace = "account-updates")]
/// async fn update_account(id: u64, delta: i64) -> Result<(), AppError> {   // AppError: From<LockError>
///     // runs while holding the lock "account:<id>" in namespace "account-updates"
///     Ok(())
/// }
///
/// #[locked(key = "account:{id}", try_lock)]       // do not wait: Ok(None) when busy
/// async fn settle(id: u64) -> Result<Option<Receipt>, AppError> {
///     Ok(Receipt::new(id))                        // the body evaluates to Result<Receipt, AppError>
/// }
/// ```
///
/// # Arguments
///
/// | argument | value | default |
/// |---|---|---|
/// | `key` | a template such as `"account:{id}"`, or any expression whose value is a `KeyCodec`; or `[k1, k2, ..]`, each a template or an expression: all of them at once, with the mutex (as `Locks::with_locks`) | required |
/// | `profile` | name of a profile installed with `sage_lock::global::set_profiles`: its settings apply where the attribute gives none | none |
/// | `wait` | how long to wait for a busy lock: `"150ms"`, `"2s"`, `"1m"`, `"1h"`, `"1m30s"` | required unless `try_lock` or `profile` |
/// | `try_lock` | flag (or `= true` / `= false`): do not wait; `Ok(None)` when the lock is busy | off |
/// | `lease` | lease duration, from `"30ms"` to one year (`"8760h"`); renewed automatically | service default (30s) |
/// | `namespace` | non-empty string | service default (`"lock"`) |
/// | `replica_ack` | `true` / `false` (alone: `true`) | service default (`true`) |
/// | `hold_at_least` | minimum hold from acquisition, e.g. `"30s"`: a body that ends sooner leaves the key held until then (scheduled jobs, with `try_lock`); `"0s"` is off; at most one year | off |
/// | `reentrant` | `true` / `false` (alone: `true`): a call for a key the current task already holds runs at once under the held lease; one key only (not with `key = [..]`); `false` turns off a profile's | the profile's, else off (a nested mutex call fails at once with `HeldByThisTask`) |
/// | `mode` | `"read"` / `"write"`: a read-write lock's read or write lock (one key; not with `permits` or `profile`) | the mutex |
/// | `permits` | `N >= 1`: a semaphore of N holders (one key; not with `mode` or `profile`) | the mutex |
/// | `client` | an expression giving a `LockClient`, `&LockClient` or `Arc<LockClient>`, e.g. `self.locks` | the global client (`sage_lock::global`) |
/// | `crate` | path to the sage-lock crate, for re-exports | `::sage_lock` |
///
/// Arguments may come in any order. Durations are checked when the macro expands.
///
/// # Profiles
///
/// `#[locked(profile = "account-updates", key = "account:{id}")]` takes its lease, wait,
/// namespace, replica acknowledgement, `hold_at_least` and `reentrant` from the named profile
/// when the function is called
/// (configured by the service, with environment overrides; see `sage_lock::Profiles`); an
/// argument written in the attribute overrides the profile's. An unknown profile, or no wait from
/// either in waiting mode, is a `LockError::InvalidArgument` naming the profile and the fix;
/// `sage_lock::global::check_profiles()` finds missing profiles at start-up, since every
/// function naming a profile registers it at link time.
///
/// ```no_run
/// # use sage_lock::LockError;
/// # #[derive(Debug)] struct AppError(LockError);
/// # impl From<LockError> for AppError { fn from(e: LockError) -> Self { AppError(e) } }
/// #[sage_lock::locked(profile = "account-updates", key = "account:{id}", lease = "5s")]
/// async fn update_account(id: u64) -> Result<(), AppError> {
///     Ok(())
/// }
/// ```
///
/// # Key templates
///
/// `{name}` names a parameter, `{name.field}` a field of one (tuple fields too: `{pair.0}`),
/// `{self.field}` a field of the receiver. Each placeholder is formatted with `Display`, exactly
/// as `format!` would, so `"account:{id}"` with `id = 42` is the same key as the string
/// `"account:42"` given to `Locks<String>` by hand. `{{` and `}}` are literal braces. The card
/// notation `"account:<id>"` is the same placeholder as `"account:{id}"` (an identifier between
/// `<` and `>`, which must name a parameter; any other `<` is literal text, and `<<` is a literal
/// `<`: `"html:<<body>:{id}"` gives `html:<body>:42`). Format specs
/// (`{id:?}`), positional placeholders (`{}`, `{0}`) and method calls (`{id.len()}`) are not
/// allowed; for those, use an expression key: `key = format!("user:{}", name.to_lowercase())`.
/// A parameter written `_` cannot be named: give it a name.
///
/// # Return types
///
/// * Default mode: the function returns `Result<T, E>` with `E: From<LockError>`; a failed
///   acquisition (timeout, lost lock, server error) returns `Err(E::from(error))`.
/// * `try_lock`: the function returns `Result<Option<T>, E>` while its body evaluates to
///   `Result<T, E>`; a busy lock gives `Ok(None)` without running the body.
///
/// Both are checked through traits, so aliases such as `anyhow::Result<T>` work.
///
/// # What is kept
///
/// The rewritten function keeps its name, visibility, attributes, docs, generics, where-clauses,
/// receiver and lifetimes, and works on free functions, inherent methods, `async fn` in trait
/// impls and `#[async_trait]` impls, with `#[tracing::instrument]` before or after it. Put it
/// above `#[tokio::main]` or `#[tokio::test]`, which make the function a plain `fn`. The key
/// is computed first, then the client, then the lock is acquired; the body runs as the same
/// code, so `?` and `return` behave as before. The returned future is `Send` when the body is.
/// Inside the body, `sage_lock::current_lease()` gives the lease (key, fencing token, time left).
///
/// # Limits
///
/// * Durations and the namespace are literals, checked at compile time; for values known only at
///   run time, use a `profile`, or call `Locks::with_lock` / `Locks::try_with_lock` directly.
/// * In `#[async_trait]` methods, placeholders can name only parameters bound to a plain name
///   (`#[async_trait]` renames destructured ones before `#[locked]` sees them).
#[proc_macro_attribute]
pub fn locked(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(args.into(), item.into()).into()
}
