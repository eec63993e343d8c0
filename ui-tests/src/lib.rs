//! Compile tests of `#[locked]`: the trybuild cases live in `tests/ui/`; this library compiles
//! every supported shape under `#![deny(warnings, clippy::pedantic)]`, so `cargo clippy
//! --all-targets -- -D warnings` proves the generated code is lint-clean.
#![deny(warnings, clippy::pedantic)]
#![allow(missing_debug_implementations)]

use std::sync::Arc;

use sage_lock::{LockClient, LockError, locked};

/// An application error that can carry a lock error.
#[derive(Debug)]
pub enum AppError {
    /// The lock could not be held.
    Lock(LockError),
    /// Something else.
    Invalid(&'static str),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

/// A receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt(pub u64);

/// An order with nested fields.
#[derive(Debug, Clone)]
pub struct Order {
    /// Its id.
    pub id: u64,
    /// Its customer.
    pub customer: Customer,
    /// A pair.
    pub pair: (u32, String),
}

/// A customer.
#[derive(Debug, Clone)]
pub struct Customer {
    /// Its name.
    pub name: String,
}

fn check(delta: i64) -> Result<i64, AppError> {
    if delta == 0 {
        Err(AppError::Invalid("zero"))
    } else {
        Ok(delta)
    }
}

/// The SPEC's example: default mode, a template key, an explicit namespace.
///
/// # Errors
/// When the lock cannot be held or the body fails.
#[locked(key = "account:{id}", wait = "2s", namespace = "account-updates")]
pub async fn update_account(id: u64, delta: i64) -> Result<(), AppError> {
    let delta = check(delta)?;
    if delta > 100 {
        return Err(AppError::Invalid("too large"));
    }
    tokio::task::yield_now().await;
    let _ = (id, delta);
    Ok(())
}

/// The SPEC's `try_lock` example: the body evaluates to `Result<Receipt, AppError>`.
///
/// # Errors
/// When the lock cannot be checked or the body fails.
#[locked(key = "account:{id}", try_lock)]
pub async fn settle(id: u64) -> Result<Option<Receipt>, AppError> {
    check(1)?;
    if id == 0 {
        return Ok(Receipt(0));
    }
    Ok(Receipt(id))
}

/// Every argument at once, in an unusual order, with an `anyhow::Result` alias.
///
/// # Errors
/// When the lock cannot be held.
#[locked(
    replica_ack = false,
    lease = "1m30s",
    wait = "150ms",
    namespace = "all-args",
    client = client,
    key = "order:<order.id>:{order.customer.name}:{order.pair.0}:{{literal}}",
)]
pub async fn all_arguments(client: LockClient, order: &Order) -> anyhow::Result<u64> {
    anyhow::ensure!(order.id > 0, "no order");
    Ok(order.id)
}

/// An expression key of any `KeyCodec` type, and a `try_lock` through an alias.
///
/// # Errors
/// When the lock cannot be checked.
#[locked(key = (tenant, id), try_lock, lease = "30ms")]
pub async fn expression_key(tenant: &str, id: u64) -> anyhow::Result<Option<String>> {
    Ok(format!("{tenant}/{id}"))
}

/// No parameters and a constant key; `impl Trait` in the return type.
///
/// # Errors
/// When the lock cannot be held.
#[locked(key = "singleton", wait = "1h")]
pub async fn constant_key() -> Result<impl std::fmt::Display, AppError> {
    Ok(7)
}

/// Generic over the key part and the error, with a where-clause and lifetimes.
///
/// # Errors
/// When the lock cannot be held.
#[locked(key = "generic:{part}:{label}", wait = "2s")]
pub async fn generic<'a, T, E>(part: T, label: &'a str) -> Result<&'a str, E>
where
    T: std::fmt::Display + Send + Sync,
    E: From<LockError>,
{
    let _ = part;
    Ok(label)
}

/// Destructured and `mut` parameters.
///
/// # Errors
/// When the lock cannot be held.
#[locked(key = "pair:{a}:{b}:{n}", wait = "2s")]
pub async fn patterns((a, b): (u32, u32), mut n: u64) -> Result<u64, AppError> {
    n += u64::from(a + b);
    Ok(n)
}

/// Settings from a named profile (no `wait` needed: it may come from the profile); the
/// attribute's `lease` overrides the profile's.
///
/// # Errors
/// When the lock cannot be held, or the profile is unknown or has no wait.
#[locked(profile = "account-updates", key = "account:{id}", lease = "5s")]
pub async fn profiled(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

/// A profile with `try_lock` and an explicit wait-free call.
///
/// # Errors
/// When the lock cannot be checked, or the profile is unknown.
#[locked(
    profile = "reports",
    key = "report:{day}",
    try_lock,
    namespace = "reports-override"
)]
pub async fn profiled_try(day: u32) -> Result<Option<u32>, AppError> {
    Ok(day)
}

/// A service holding its own client.
pub struct Accounts {
    /// The client used by `#[locked(client = self.locks)]`.
    pub locks: LockClient,
    /// Shared client.
    pub shared: Arc<LockClient>,
    /// Tenant, used in keys.
    pub tenant: String,
}

impl Accounts {
    /// `client = self.locks` and `{self.tenant}`.
    ///
    /// # Errors
    /// When the lock cannot be held.
    #[locked(key = "{self.tenant}:account:{id}", wait = "2s", client = self.locks)]
    pub async fn update(&self, id: u64) -> Result<u64, AppError> {
        Ok(id + self.tenant.len() as u64)
    }

    /// A profile and a wait in the attribute, on a method.
    ///
    /// # Errors
    /// When the lock cannot be held.
    #[locked(profile = "accounts.v2", key = "{self.tenant}", wait = "1s", client = self.locks)]
    pub async fn profiled_method(&self) -> Result<usize, AppError> {
        Ok(self.tenant.len())
    }

    /// `&mut self`, `Arc<LockClient>`, `try_lock`.
    ///
    /// # Errors
    /// When the lock cannot be checked.
    #[locked(key = "{self.tenant}", try_lock, client = self.shared)]
    pub async fn rename(&mut self, name: String) -> Result<Option<()>, AppError> {
        self.tenant = name;
        Ok(())
    }

    /// A `self` by value and a reference client.
    ///
    /// # Errors
    /// When the lock cannot be held.
    #[locked(key = "consume", wait = "1s", client = &self.locks)]
    pub async fn consume(self) -> Result<String, AppError> {
        Ok(self.tenant)
    }

    /// `Self` in the return type and `#[tracing::instrument]` after `#[locked]`.
    ///
    /// # Errors
    /// When the lock cannot be held.
    #[locked(key = "clone:{self.tenant}", wait = "1s", client = self.locks)]
    #[tracing::instrument(skip(self))]
    pub async fn cloned(&self) -> Result<Self, AppError> {
        Ok(Self {
            locks: self.locks.clone(),
            shared: Arc::clone(&self.shared),
            tenant: self.tenant.clone(),
        })
    }

    /// `#[tracing::instrument]` before `#[locked]`.
    ///
    /// # Errors
    /// When the lock cannot be held.
    #[tracing::instrument(skip(self))]
    #[locked(key = "traced:{id}", wait = "1s", client = self.locks)]
    pub async fn traced(&self, id: u64) -> Result<u64, AppError> {
        tracing::info!(id, "traced");
        Ok(id)
    }
}

/// A trait with native `async fn`.
pub trait Ledger {
    /// Posts an entry.
    fn post(&self, id: u64) -> impl Future<Output = Result<u64, AppError>> + Send;
    /// Tries to post.
    fn try_post(&self, id: u64) -> impl Future<Output = Result<Option<u64>, AppError>> + Send;
}

impl Ledger for Accounts {
    #[locked(key = "post:{id}", wait = "2s", client = self.locks)]
    async fn post(&self, id: u64) -> Result<u64, AppError> {
        Ok(id)
    }

    #[locked(key = "post:{id}", try_lock, client = self.locks)]
    async fn try_post(&self, id: u64) -> Result<Option<u64>, AppError> {
        Ok(id)
    }
}

/// A trait implemented through `#[async_trait]`.
#[async_trait::async_trait]
pub trait Journal {
    /// Writes an entry.
    async fn write(&self, id: u64, text: &str) -> Result<usize, AppError>;
    /// Tries to write.
    async fn try_write(&self, id: u64) -> Result<Option<u64>, AppError>;
}

#[async_trait::async_trait]
impl Journal for Accounts {
    #[locked(key = "journal:{self.tenant}:{id}", wait = "2s", client = self.locks)]
    async fn write(&self, id: u64, text: &str) -> Result<usize, AppError> {
        check(1)?;
        Ok(text.len() + usize::try_from(id).unwrap_or_default())
    }

    #[locked(key = "journal:{id}", try_lock, client = self.locks, profile = "journal")]
    async fn try_write(&self, id: u64) -> Result<Option<u64>, AppError> {
        check(1)?;
        if id == 0 {
            return Ok(0);
        }
        Ok(id)
    }
}

/// The futures are `Send` when the bodies are: they can be spawned.
pub fn spawn_all(accounts: Arc<Accounts>, order: Order) {
    drop(tokio::spawn(update_account(1, 1)));
    drop(tokio::spawn(settle(1)));
    drop(tokio::spawn(async move {
        let _ = all_arguments(accounts.locks.clone(), &order).await;
        let _ = accounts.update(1).await;
        let _ = accounts.post(1).await;
        let _ = accounts.try_post(1).await;
        let _ = accounts.write(1, "x").await;
        let _ = accounts.try_write(1).await;
        let _ = accounts.traced(1).await;
        let _ = accounts.cloned().await;
        let _ = accounts.profiled_method().await;
    }));
    drop(tokio::spawn(expression_key("t", 1)));
    drop(tokio::spawn(profiled(1)));
    drop(tokio::spawn(profiled_try(1)));
    drop(tokio::spawn(async {
        let _ = generic::<u64, AppError>(1, "static").await;
    }));
}

/// A one-expression body (the generated code must not trip `unused_braces`).
///
/// # Errors
/// When the lock cannot be acquired.
#[rustfmt::skip]
#[locked(key = "one:{id}", wait = "1s")]
pub async fn one_expression(id: u64) -> Result<u64, LockError> { Ok(id) }

/// The same in `try_lock` mode.
///
/// # Errors
/// When the lock check fails.
#[rustfmt::skip]
#[locked(key = "one:{id}", try_lock)]
pub async fn one_expression_try(id: u64) -> Result<Option<u64>, LockError> { Ok(id) }

/// A read lock (`mode = "read"`): shared with other readers.
///
/// # Errors
/// When the lock cannot be held.
#[locked(key = "report:{id}", wait = "2s", mode = "read")]
pub async fn read_report(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

/// A write lock with `try_lock`.
///
/// # Errors
/// When the lock cannot be checked.
#[locked(key = "report:{id}", try_lock, mode = "write")]
pub async fn rebuild_report(id: u64) -> Result<Option<u64>, AppError> {
    Ok(id)
}

/// A semaphore (`permits = N`): at most 4 at a time.
///
/// # Errors
/// When no permit can be held.
#[locked(key = "export:{tenant}", wait = "1m", permits = 4)]
pub async fn export(tenant: &str) -> anyhow::Result<usize> {
    Ok(tenant.len())
}

/// Several keys (`key = [..]`): all or none.
///
/// # Errors
/// When the locks cannot be held.
#[locked(key = ["account:{from}", "account:{to}"], wait = "2s", client = client)]
pub async fn transfer(client: Arc<LockClient>, from: u64, to: u64) -> Result<u64, AppError> {
    Ok(from + to)
}

/// A locked function that calls others: its future holds theirs, so it stays small only if
/// theirs do (`clippy::large_futures`, pedantic, warns past 16 KiB).
///
/// # Errors
/// When a lock cannot be held.
#[locked(key = "nested:{id}", wait = "2s")]
pub async fn nested(id: u64) -> Result<u64, AppError> {
    update_account(id, 1).await?;
    let read = read_report(id).await?;
    let exported = export("t").await.map_err(|_| AppError::Invalid("export"))?;
    Ok(read + exported as u64)
}

/// A locked function calling [`nested`], three locks deep.
///
/// # Errors
/// When a lock cannot be held.
#[locked(key = "outer:{id}", wait = "2s")]
pub async fn outer(id: u64) -> Result<u64, AppError> {
    nested(id).await
}

#[cfg(test)]
mod tests {
    use std::mem::size_of_val;

    /// The most a `#[locked]` future may take, whatever its body and however deep the nesting:
    /// the body is boxed once, as `Locks::with_lock` boxes it.
    const SMALL: usize = 2048;

    /// A client that is never used (made outside a runtime, it does not connect).
    fn client() -> std::sync::Arc<sage_lock::LockClient> {
        let fred = sage_lock::fred::types::Builder::default_centralized()
            .build()
            .expect("a fred client");
        std::sync::Arc::new(sage_lock::LockClient::from_fred(fred))
    }

    #[test]
    fn locked_futures_stay_small_however_deep() {
        let sizes = [
            ("default mode", size_of_val(&super::update_account(1, 1))),
            ("try_lock", size_of_val(&super::settle(1))),
            ("read lock", size_of_val(&super::read_report(1))),
            ("write try_lock", size_of_val(&super::rebuild_report(1))),
            ("semaphore", size_of_val(&super::export("t"))),
            ("profile", size_of_val(&super::profiled(1))),
            ("profile try_lock", size_of_val(&super::profiled_try(1))),
            ("nested", size_of_val(&super::nested(1))),
            ("outer", size_of_val(&super::outer(1))),
            (
                "several keys",
                size_of_val(&super::transfer(client(), 1, 2)),
            ),
        ];
        for (what, size) in sizes {
            println!("{what}: {size} bytes");
        }
        let large: Vec<_> = sizes.iter().filter(|(_, size)| *size > SMALL).collect();
        assert!(large.is_empty(), "futures over {SMALL} bytes: {large:?}");
    }
}
