//! The read-write lock: [`RwLocks`], many readers or one writer per key (its key layout and
//! scripts are in `rules`).
//!
//! Key `k`'s readers are the members of the sorted set `{ns:k}:r`, each a reader's token scored
//! by its expiry in server milliseconds (`TIME`), so every reader has a lease of its own and a
//! crashed reader's share expires on its own. The writer is the string key `{ns:k}:w` holding
//! its token, with the lease as its TTL. Waiters are served in arrival order, across processes
//! (phase-fair): a refused waiting writer takes a place in the writer queue `{ns:k}:wq`, a
//! refused waiting reader one in the reader queue `{ns:k}:rq`, both scored by the server time of
//! the first refusal (each place ends [`WRITER_INTENT`] after its waiter's latest attempt, kept
//! in `{ns:k}:wd` / `{ns:k}:rd`). A writer is granted when nobody holds the lock and no live
//! waiter, writer or reader, queued before it; a reader when no writer holds the lock and no
//! live writer queued before it, so all the readers queued before the next writer enter
//! together. Neither a stream of readers nor a stream of writers can starve the other kind, and
//! a waiter that dies blocks those behind it for at most [`WRITER_INTENT`] while it is queued,
//! or, when a release has already handed it the lock, until that hand-off lease (at most 2 s)
//! ends. Every grant (readers
//! and writers) increments the fencing counter `{ns:k}:fence`. While a waiter is queued, a
//! release that lets the next writer in, or the readers queued before the next writer, hands the
//! lock to them on the server (each for the hand-off lease, with a new fencing token; at most 32
//! readers by name, the rest by an empty message, "every waiter, try again") and publishes
//! `token:fence:ms` on `{ns:k}:w}:released` for each, so they enter at once, in any process; a
//! reader's release while other readers hold lets nobody in.

mod rules;

use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use super::family::Family;
use crate::engine::{self, Engine, Mode, Rules};
use crate::error::LockError;
use crate::key::KeyCodec;
use crate::options::LockSettings;
pub use rules::WRITER_INTENT;
use rules::{READ, WRITE};

/// A family of read-write locks over keys of type `K`: per key, many readers or one writer.
///
/// Each reader holds a lease of its own (renewed while its body runs; renewing one reader never
/// extends another's), so a crashed reader's share expires on its own. Waiters are served in
/// arrival order, across processes: while a writer waits, readers that come later wait behind
/// it, and a writer waits behind the readers that queued before it (see [`WRITER_INTENT`]), so
/// neither kind starves the other. Readers and writers both get fencing tokens from the key's
/// counter, so a writer's token is above every earlier grant's. A read-write lock on key `k` is a different
/// lock from the mutex ([`Locks`](crate::Locks)) on `k`.
///
/// Made by [`LockClient::rw_lock`](crate::LockClient::rw_lock) or
/// [`LockClient::rw_lock_with`](crate::LockClient::rw_lock_with); cheap to clone. Options,
/// errors and guarantees are the mutex's, see [`Locks::with_lock`](crate::Locks::with_lock).
///
/// ```no_run
/// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
/// use std::time::Duration;
///
/// let reports = client.rw_lock::<str>();
/// let wait = Duration::from_secs(2);
/// let total = reports.read("report:7", wait, async { 42 }).await?; // shared with other readers
/// reports.write("report:7", wait, async { /* alone */ }).await?;
/// # Ok(()) }
/// ```
pub struct RwLocks<K: ?Sized> {
    family: Family,
    _key: PhantomData<fn(&K)>,
}

impl<K: ?Sized> Clone for RwLocks<K> {
    fn clone(&self) -> Self {
        RwLocks {
            family: self.family.clone(),
            _key: PhantomData,
        }
    }
}

impl<K: ?Sized> fmt::Debug for RwLocks<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.family.debug(f, "RwLocks").finish_non_exhaustive()
    }
}

impl<K: ?Sized> RwLocks<K> {
    pub(crate) fn new(engine: Arc<Engine>, settings: LockSettings) -> Self {
        RwLocks {
            family: Family::new(engine, settings),
            _key: PhantomData,
        }
    }

    /// How long each reader's and writer's hold stays valid on the server without renewal (the
    /// family's [`LockOptions::lease`](crate::LockOptions::lease), 30 s by default).
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.family.settings.lease
    }

    /// The namespace the family's keys live in on the server (`lock` by default).
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.family.settings.namespace
    }

    /// Waits up to `wait_timeout` to read-lock `key` (shared with other readers, excluding
    /// writers), runs `body`, releases, and returns the body's output.
    ///
    /// # Errors
    /// As for [`Locks::with_lock`](crate::Locks::with_lock).
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// # use std::time::Duration;
    /// let rw = client.rw_lock::<u64>();
    /// rw.read(&7, Duration::from_secs(2), async { /* many readers at once */ }).await?;
    /// # Ok(()) }
    /// ```
    pub fn read<Q, F>(
        &self,
        key: &Q,
        wait_timeout: Duration,
        body: F,
    ) -> impl Future<Output = Result<F::Output, LockError>> + use<K, Q, F>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        self.waiting(&READ, key, wait_timeout, "try_read", body)
    }

    /// Waits up to `wait_timeout` to write-lock `key` (alone: no reader, no other writer), runs
    /// `body`, releases, and returns the body's output. While it waits, readers that come later
    /// wait too.
    ///
    /// # Errors
    /// As for [`Locks::with_lock`](crate::Locks::with_lock).
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// # use std::time::Duration;
    /// let rw = client.rw_lock::<u64>();
    /// rw.write(&7, Duration::from_secs(2), async { /* alone */ }).await?;
    /// # Ok(()) }
    /// ```
    pub fn write<Q, F>(
        &self,
        key: &Q,
        wait_timeout: Duration,
        body: F,
    ) -> impl Future<Output = Result<F::Output, LockError>> + use<K, Q, F>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        self.waiting(&WRITE, key, wait_timeout, "try_write", body)
    }

    /// Read-locks `key` if no writer holds or waits for it now: `Ok(None)` otherwise (the body
    /// is not run), `Ok(Some(output))` after running the body and releasing.
    ///
    /// # Errors
    /// As for [`Locks::try_with_lock`](crate::Locks::try_with_lock): [`LockError::TimedOut`]
    /// when transient failures did not clear within about one second; the others as for
    /// [`Locks::with_lock`](crate::Locks::with_lock).
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// let rw = client.rw_lock::<str>();
    /// let cached = rw.try_read("cache", async { 1 }).await?; // None while a writer is at it
    /// # Ok(()) }
    /// ```
    pub fn try_read<Q, F>(
        &self,
        key: &Q,
        body: F,
    ) -> impl Future<Output = Result<Option<F::Output>, LockError>> + use<K, Q, F>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        self.trying(&READ, key, body)
    }

    /// Write-locks `key` if it is free now (no reader, no writer, no waiting writer or reader):
    /// `Ok(None)` otherwise (the body is not run, and nothing is left behind),
    /// `Ok(Some(output))` after running the body and releasing.
    ///
    /// # Errors
    /// As for [`Locks::try_with_lock`](crate::Locks::try_with_lock): [`LockError::TimedOut`]
    /// when transient failures did not clear within about one second; the others as for
    /// [`Locks::with_lock`](crate::Locks::with_lock).
    ///
    /// ```no_run
    /// # async fn demo(client: sage_lock::LockClient) -> Result<(), sage_lock::LockError> {
    /// let rw = client.rw_lock::<str>();
    /// if rw.try_write("cache", async { /* rebuild */ }).await?.is_none() {
    ///     println!("in use; rebuild later");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_write<Q, F>(
        &self,
        key: &Q,
        body: F,
    ) -> impl Future<Output = Result<Option<F::Output>, LockError>> + use<K, Q, F>
    where
        K: Borrow<Q>,
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        self.trying(&WRITE, key, body)
    }

    fn waiting<Q, F>(
        &self,
        rules: &Arc<dyn Rules>,
        key: &Q,
        wait_timeout: Duration,
        try_fn: &'static str,
        body: F,
    ) -> impl Future<Output = Result<F::Output, LockError>> + use<K, Q, F>
    where
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        let keys = self.family.keys(key);
        let body = Box::pin(body);
        let Family { engine, settings } = self.family.clone();
        engine::run_waiting(
            engine,
            Arc::clone(rules),
            settings,
            keys,
            wait_timeout,
            try_fn,
            body,
        )
    }

    fn trying<Q, F>(
        &self,
        rules: &Arc<dyn Rules>,
        key: &Q,
        body: F,
    ) -> impl Future<Output = Result<Option<F::Output>, LockError>> + use<K, Q, F>
    where
        Q: KeyCodec + ?Sized,
        F: Future,
    {
        let keys = self.family.keys(key);
        let body = Box::pin(body);
        let Family { engine, settings } = self.family.clone();
        engine::run(engine, Arc::clone(rules), settings, keys, Mode::Try, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockClient;

    #[test]
    fn rw_futures_stay_small_whatever_the_body() {
        let client = LockClient::from_fred(fred::clients::Client::default());
        let rw = client.rw_lock::<str>();
        let big = [7_u8; 4096];
        let read = rw.read("k", Duration::from_secs(1), async move { big.len() });
        assert!(std::mem::size_of_val(&read) < 1024);
        let write = rw.try_write("k", async move { big.len() });
        assert!(std::mem::size_of_val(&write) < 1024);
    }
}
