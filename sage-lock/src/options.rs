//! [`LockOptions`] (what a caller asks for), the service-wide [`ServiceDefaults`] that fill in
//! what it leaves unset, and the resolved, validated [`LockSettings`] of one family.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::error::LockError;
use crate::observe::Metrics;

/// The shortest lease accepted by [`LockOptions::lease`] (the longest is one year, 365 days).
// `#[locked]` checks its `lease` literal against the same number at compile time:
// `MIN_LEASE_MILLIS` in `sage-lock-macros/src/args.rs` (which cannot depend on this crate).
pub const MIN_LEASE: Duration = Duration::from_millis(30);

/// The longest lease or minimum hold accepted: one year.
// Mirrored by `MAX_DURATION_MILLIS` in `sage-lock-macros/src/args.rs` (compile-time checks of
// `#[locked]`'s `lease` and `hold_at_least`): change both together.
const MAX_DURATION: Duration = Duration::from_secs(60 * 60 * 24 * 365);

static DEFAULTS: OnceLock<ServiceDefaults> = OnceLock::new();
static BUILT_IN: OnceLock<ServiceDefaults> = OnceLock::new();

/// Options of a lock family. Unset options take the service-wide defaults
/// ([`crate::global::set_defaults`]), which default to a 30 s lease, namespace `lock` and replica
/// acknowledgement on.
///
/// ```
/// use std::time::Duration;
/// use sage_lock::LockOptions;
///
/// let options = LockOptions::new()
///     .lease(Duration::from_secs(10))
///     .namespace("account-updates")
///     .replica_acknowledgement(false);
/// ```
#[derive(Debug, Clone, Default)]
pub struct LockOptions {
    lease: Option<Duration>,
    namespace: Option<String>,
    replica_acknowledgement: Option<bool>,
    hold_at_least: Option<Duration>,
    reentrant: Option<bool>,
}

impl LockOptions {
    /// Options with nothing set.
    #[must_use]
    pub fn new() -> Self {
        LockOptions::default()
    }

    /// How long a lock stays valid without renewal (default 30 s; at least [`MIN_LEASE`], 30 ms,
    /// and at most one year, 365 days). Renewal keeps it alive while the body runs; after a
    /// crash, others wait up to this long.
    ///
    /// A lease out of bounds makes the family's constructor (`lock_with`, `rw_lock_with`,
    /// `semaphore_with`) fail with [`LockError::InvalidArgument`] (argument `lease`).
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The namespace (default `lock`): locks in different namespaces never conflict. Must not be
    /// empty, blank, or padded with whitespace; otherwise the family's constructor fails with
    /// [`LockError::InvalidArgument`] (argument `namespace`).
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Whether replicated deployments wait for replicas to acknowledge acquisition and renewal
    /// (`WAIT`). Off favours availability over failover safety. Ignored on standalone servers.
    #[must_use]
    pub fn replica_acknowledgement(mut self, on: bool) -> Self {
        self.replica_acknowledgement = Some(on);
        self
    }

    /// Keeps the lock at least this long after acquisition, even when the body ends sooner: the
    /// lease is shortened to the remainder instead of released (zero, the default, is off).
    ///
    /// With [`Locks::try_with_lock`](crate::Locks::try_with_lock) this runs a job scheduled on
    /// every instance once per interval (ShedLock's `lockAtLeastFor`): instances that tick a
    /// little later find the key still held and skip. A minimum hold longer than the lease is
    /// allowed: the key then keeps the remainder as its TTL. The minimum hold is kept when the
    /// call is cancelled (its future dropped) after the body started, but not when the lock was
    /// lost, and not for a reentrant inner call (the outer call governs). At most one year
    /// (365 days); longer makes the family's constructor fail with
    /// [`LockError::InvalidArgument`] (argument `hold_at_least`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use sage_lock::LockOptions;
    ///
    /// // A job scheduled every 10 s on every instance: at most one run per 10 s.
    /// let options = LockOptions::new()
    ///     .namespace("nightly-report")
    ///     .hold_at_least(Duration::from_secs(9));
    /// ```
    #[must_use]
    pub fn hold_at_least(mut self, hold_at_least: Duration) -> Self {
        self.hold_at_least = Some(hold_at_least);
        self
    }

    /// Whether a call for a lock the current task already holds (same client, namespace and key)
    /// runs its body at once under the held lease. Default: off; a nested waiting call then fails
    /// at once with [`LockError::TimedOut`] and
    /// [`TimeoutReason::HeldByThisTask`](crate::TimeoutReason::HeldByThisTask), and a nested
    /// try call returns `Ok(None)`, the body not run.
    ///
    /// The inner body sees the outer [`Lease`](crate::Lease) (same fencing token) and releases
    /// nothing: the lock is released when the outer call ends. A
    /// [`with_locks`](crate::Locks::with_locks) hold holds each of its keys: a reentrant
    /// `with_lock` of one of them runs under it, with that key's own fencing token. Holding is per task: a task
    /// spawned inside the body does not hold the lock and waits for it like any other caller.
    /// Only the inner (nested) call needs this option.
    ///
    /// ```
    /// use sage_lock::LockOptions;
    ///
    /// let options = LockOptions::new().namespace("accounts").reentrant(true);
    /// ```
    #[must_use]
    pub fn reentrant(mut self, on: bool) -> Self {
        self.reentrant = Some(on);
        self
    }

    /// The namespace these options lock in, without fixing the service-wide defaults (as
    /// [`resolve`](Self::resolve) does): for error texts before a family exists.
    pub(crate) fn namespace_in_effect(&self) -> String {
        match (&self.namespace, DEFAULTS.get()) {
            (Some(namespace), _) => namespace.clone(),
            (None, Some(defaults)) => defaults.namespace.clone(),
            (None, None) => ServiceDefaults::default().namespace,
        }
    }

    pub(crate) fn resolve(self) -> LockSettings {
        let defaults = defaults_in_use();
        let namespace: Arc<str> = self
            .namespace
            .map_or_else(|| Arc::from(defaults.namespace.as_str()), Arc::from);
        LockSettings {
            lease: self.lease.unwrap_or(defaults.lease),
            metrics: Arc::new(Metrics::new(&namespace)),
            namespace,
            replica_acknowledgement: self
                .replica_acknowledgement
                .unwrap_or(defaults.replica_acknowledgement),
            hold_at_least: self.hold_at_least.unwrap_or(Duration::ZERO),
            reentrant: self.reentrant.unwrap_or(false),
        }
    }
}

/// Resolved, validated options of one lock family.
#[derive(Debug, Clone)]
pub(crate) struct LockSettings {
    pub(crate) lease: Duration,
    pub(crate) namespace: Arc<str>,
    pub(crate) replica_acknowledgement: bool,
    pub(crate) metrics: Arc<Metrics>,
    /// Minimum time from acquisition to release; zero is off.
    pub(crate) hold_at_least: Duration,
    /// Whether a call for a lock the current task holds runs at once under it.
    pub(crate) reentrant: bool,
}

impl LockSettings {
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        validate_lease(self.lease)?;
        validate_hold_at_least(self.hold_at_least)?;
        validate_namespace(&self.namespace)
    }
}

pub(crate) fn validate_lease(lease: Duration) -> Result<(), LockError> {
    if lease < MIN_LEASE {
        return Err(LockError::invalid(
            "lease",
            format!(
                "must be at least 30ms, got {}; choose one comfortably longer than network latency and process pauses, e.g. 10 s (Duration::from_secs(10), or \"10s\" in a configuration)",
                // Rounded to the millisecond unless that reads as the minimum itself.
                if lease + Duration::from_micros(500) >= MIN_LEASE {
                    format!(
                        "{:?}",
                        Duration::from_micros(u64::try_from(lease.as_micros()).unwrap_or(0))
                    )
                } else {
                    crate::error::rounded(lease)
                }
            ),
        ));
    }
    if lease > MAX_DURATION {
        return Err(LockError::invalid(
            "lease",
            format!(
                "must be at most one year, got {}",
                crate::error::rounded(lease)
            ),
        ));
    }
    Ok(())
}

pub(crate) fn validate_hold_at_least(hold_at_least: Duration) -> Result<(), LockError> {
    if hold_at_least > MAX_DURATION {
        return Err(LockError::invalid(
            "hold_at_least",
            format!(
                "must be at most one year, got {}; use the interval of the scheduled job, e.g. 30 s (Duration::from_secs(30), or \"30s\" in a configuration)",
                crate::error::rounded(hold_at_least)
            ),
        ));
    }
    Ok(())
}

pub(crate) fn validate_namespace(namespace: &str) -> Result<(), LockError> {
    let trimmed = namespace.trim();
    if trimmed.is_empty() {
        return Err(LockError::invalid(
            "namespace",
            "must not be empty or blank; use a name per kind of resource, e.g. \"account-updates\" (the default is \"lock\")",
        ));
    }
    if trimmed != namespace {
        // Another namespace than its unpadded peers': no exclusion between them.
        return Err(LockError::invalid(
            "namespace",
            format!(
                "{namespace:?} has leading or trailing whitespace, so its locks would not \
                 exclude those of {trimmed:?}; write {trimmed:?}"
            ),
        ));
    }
    Ok(())
}

/// Service-wide lock defaults: used wherever a lock family or `#[locked]` leaves one unset.
/// Installed with [`set_defaults`] (see the [module example](crate::global)).
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

    /// Sets the default lease: how long a lock stays valid without renewal (built-in: 30 s;
    /// 30 ms to one year, checked by [`set_defaults`]).
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets the default namespace the lock keys live in (built-in: `lock`; not empty, blank or
    /// whitespace-padded, checked by [`set_defaults`]).
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets whether replicated deployments wait for replicas to acknowledge acquisition and
    /// renewal by default (built-in: on; see [`LockOptions::replica_acknowledgement`]).
    #[must_use]
    pub fn replica_acknowledgement(mut self, on: bool) -> Self {
        self.replica_acknowledgement = on;
        self
    }
}

/// Sets the service-wide defaults, once, at start-up: before any lock family is created and
/// before the first `#[locked]` call, which use the defaults in effect. See the
/// [module example](crate::global).
///
/// # Errors
/// [`LockError::InvalidArgument`] for a lease below 30 ms or over one year (argument `lease`), an
/// empty, blank or whitespace-padded namespace (argument `namespace`), a second call, or
/// a call after a lock family or `#[locked]` call already used the built-in defaults (later
/// calls would resolve other defaults, another namespace for instance, than the holders
/// before them, and not exclude them).
pub fn set_defaults(defaults: ServiceDefaults) -> Result<(), LockError> {
    validate_lease(defaults.lease)?;
    validate_namespace(&defaults.namespace)?;
    DEFAULTS.set(defaults).map_err(|_| {
        LockError::invalid(
            "defaults",
            "service defaults are already in effect: set_defaults was called before, or a lock \
             family or #[locked] call already used the built-in ones; call set_defaults once, \
             at start-up, before any lock is created",
        )
    })
}

/// The service-wide defaults in effect (reading them does not fix them; creating a lock
/// family does).
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

/// The defaults a lock family resolves: from then on they are fixed, and [`set_defaults`]
/// refuses to change them.
fn defaults_in_use() -> &'static ServiceDefaults {
    DEFAULTS.get_or_init(ServiceDefaults::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease just under the minimum is named as it is, not rounded up to the minimum (an
    /// audit: "must be at least 30ms, got 30ms").
    #[test]
    fn a_lease_just_under_the_minimum_is_named_exactly() {
        let error = validate_lease(Duration::from_micros(29_999))
            .expect_err("under 30 ms")
            .to_string();
        assert!(error.contains("got 29.999ms"), "{error}");
    }

    /// The bounds `#[locked]` mirrors at compile time (`sage-lock-macros/src/args.rs`, whose
    /// tests pin the same edges): 30 ms and 8760 h are accepted, one millisecond beyond is not.
    #[test]
    fn a_blank_namespace_is_refused_everywhere() {
        for blank in ["", " ", "\t\n"] {
            assert!(validate_namespace(blank).is_err(), "{blank:?}");
            let profile = crate::profile::Profile::new().namespace(blank);
            assert!(
                profile.validate("p").is_err(),
                "profile namespace {blank:?}"
            );
        }
        // Padding makes another namespace than the peers' unpadded one: no exclusion between
        // them, silently (an audit: TOML kept it, the environment trimmed it).
        for padded in [" accounts ", "accounts\n", "\taccounts"] {
            let error = validate_namespace(padded).expect_err(padded).to_string();
            assert!(
                error.contains("whitespace") && error.contains("\"accounts\""),
                "{error}"
            );
        }
        assert!(validate_namespace("account updates").is_ok());
    }

    /// The texts read as well in a configuration file as in code (an audit: they showed
    /// nanoseconds and offered only Rust).
    #[test]
    fn duration_errors_round_and_name_both_spellings() {
        let short = validate_lease(Duration::from_nanos(12_345_678))
            .expect_err("too short")
            .to_string();
        assert!(
            short.contains("got 12ms") && short.contains("\"10s\""),
            "{short}"
        );
        let long = validate_hold_at_least(Duration::from_secs(400 * 86_400))
            .expect_err("too long")
            .to_string();
        assert!(
            long.contains("got 34560000s") && long.contains("\"30s\""),
            "{long}"
        );
    }

    #[test]
    fn duration_bounds_match_the_macros() {
        let year = Duration::from_secs(8760 * 3600);
        let ms = Duration::from_millis(1);
        assert!(validate_lease(Duration::from_millis(30)).is_ok());
        assert!(validate_lease(Duration::from_millis(29)).is_err());
        assert!(validate_lease(year).is_ok());
        assert!(validate_lease(year + ms).is_err());
        assert!(validate_hold_at_least(year).is_ok());
        assert!(validate_hold_at_least(year + ms).is_err());
    }
}
