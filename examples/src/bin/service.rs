//! A small account-transfer service whose locks are declared, not coded: every critical section
//! is an `async fn` annotated with `#[locked(...)]`.
//!
//! ```text
//! cargo run -p sage-lock-examples --release --bin service [-- --tasks 8 --accounts 6 --seconds 4 --valkey --profiles PATH]
//! ```
//!
//! - The lock settings live in configuration: named profiles in `examples/service-profiles.toml`
//!   (or `--profiles PATH`), loaded with serde and installed once with
//!   `sage_lock::global::set_profiles` (which applies `SAGE_LOCK_PROFILE_<NAME>_*` environment
//!   overrides); `sage_lock::global::check_profiles` then makes sure every profile an annotation
//!   names is configured. The annotations name only the profile and the key.
//! - The process-wide client is installed with `sage_lock::global::install`.
//! - [`Bank::deposit`] locks `account:{account}` with the `accounts` profile (wait 2 s).
//! - [`Bank::transfer`] needs two accounts: `key = ["account:{from}", "account:{to}"]` takes both
//!   or neither, so two opposite transfers cannot each hold one account while waiting for the
//!   other; `Lease::fencing_token_of` gives each account's token.
//! - [`Bank::audit`] uses `try_lock`: it returns `Ok(None)` at once when the account is busy.
//! - [`Journal::record`] uses its own, non-global client (`client = self.locks`) and the
//!   `journal` profile.
//!
//! Balances live in Redis and are updated with a deliberately non-atomic read-modify-write
//! (`GET`, some work, `SET`), so only the locks keep concurrent transfers from losing money.
//! After `--seconds` of random transfers from `--tasks` concurrent tasks, the service checks that
//! the total balance is what it was funded with, that no balance went negative and that the
//! journal's sequence number matches its length; it exits non-zero when an invariant is violated.
//!
//! Uses `SAGE_LOCK_URL` when set (a cluster too), else starts a throwaway `redis-server`
//! (`--valkey`: `valkey-server`). On a server of the user's it leaves nothing: its data keys
//! carry the run's id (`bank:{<run>}:*`, one hash slot, so that a transfer's `MSET` works on a
//! cluster), its profiles' namespaces get `-<run>` appended (unlike a real service's), and it
//! removes both when it ends, one key at a time. `RUST_LOG=service=debug` logs every transfer with its fencing tokens.

use std::collections::HashMap;
use std::fmt;
use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use fred::clients::Client;
use fred::interfaces::{KeysInterface as _, ListInterface as _};
use rand::Rng as _;
use sage_lock::global;
use sage_lock::{LockClient, LockError, LockStats, Profiles, current_lease, locked};
use sage_lock_examples::cleanup::{delete_keys, lock_keys};
use sage_lock_examples::{ThrowawayServer, Usage, flag_value};

/// The profiles file used without `--profiles`.
const PROFILES_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/service-profiles.toml");

/// The part of the service's configuration file this example reads.
#[derive(Debug, serde::Deserialize)]
struct Config {
    lock_profiles: Profiles,
}

/// What every account is funded with at start.
const INITIAL_BALANCE: i64 = 1_000;
/// The largest single transfer.
const MAX_TRANSFER: i64 = 250;

/// The service's error type. `From<LockError>` is what `#[locked]` needs: a failed acquisition
/// (timeout, lost lock, server error) comes back as `Err(AppError::Lock(..))`.
#[derive(Debug)]
enum AppError {
    /// The lock could not be acquired or was lost.
    Lock(LockError),
    /// The balance store failed.
    Store(fred::error::Error),
    /// A transfer from an account to itself.
    SameAccount(u64),
    /// Not enough money on the source account (the transfer is declined, nothing changes).
    InsufficientFunds {
        account: u64,
        balance: i64,
        amount: i64,
    },
    /// An audit found a balance below zero: the locks did not do their job.
    Negative { account: u64, balance: i64 },
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

impl From<fred::error::Error> for AppError {
    fn from(error: fred::error::Error) -> Self {
        AppError::Store(error)
    }
}

impl fmt::Display for AppError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppError::Lock(error) => write!(f, "lock: {error}"),
            AppError::Store(error) => write!(f, "balance store: {error}"),
            AppError::SameAccount(account) => {
                write!(f, "cannot transfer from account {account} to itself")
            }
            AppError::InsufficientFunds {
                account,
                balance,
                amount,
            } => write!(
                f,
                "account {account} holds {balance}, cannot transfer {amount}"
            ),
            AppError::Negative { account, balance } => {
                write!(f, "account {account} has a negative balance {balance}")
            }
        }
    }
}

impl std::error::Error for AppError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AppError::Lock(error) => Some(error),
            AppError::Store(error) => Some(error),
            _ => None,
        }
    }
}

/// A transfer request.
#[derive(Debug, Clone, Copy)]
struct Transfer {
    from: u64,
    to: u64,
    amount: i64,
}

/// A completed transfer, with the fencing tokens of the two account locks it held.
#[derive(Debug, Clone, Copy)]
struct Receipt {
    transfer: Transfer,
    tokens: (u64, u64),
}

/// The fencing token of the innermost lock the current task holds (0 outside a lock body).
fn fencing_token() -> u64 {
    current_lease().map_or(0, |lease| lease.fencing_token())
}

/// Simulated work between reading and writing a balance: long enough that, without the locks,
/// concurrent transfers would overwrite each other's updates.
async fn think() {
    let micros = rand::rng().random_range(0..1_500);
    tokio::time::sleep(Duration::from_micros(micros)).await;
}

/// The accounts. Its locks use the global client and the service defaults.
#[derive(Debug)]
struct Bank {
    store: Client,
    /// Prefix of this run's data keys, so that runs against a shared server do not mix.
    run: String,
    /// This run's lock namespaces, by profile name (see [`per_run`]).
    namespaces: HashMap<String, String>,
}

impl Bank {
    /// `bank:{<run>}:balance:<account>`: the hash tag `{<run>}` keeps all of a run's balances in
    /// one cluster hash slot, so a transfer's `MSET` of two balances works on a cluster too.
    fn balance_key(&self, account: u64) -> String {
        format!("bank:{{{}}}:balance:{account}", self.run)
    }

    async fn balance(&self, account: u64) -> Result<i64, AppError> {
        let balance: Option<i64> = self.store.get(self.balance_key(account)).await?;
        Ok(balance.unwrap_or(0))
    }

    /// Adds `amount` to an account: lock `account:<account>` with the settings of the
    /// `accounts` profile (namespace, lease, and a 2 s wait).
    #[locked(profile = "accounts", key = "account:{account}")]
    async fn deposit(&self, account: u64, amount: i64) -> Result<i64, AppError> {
        let balance = self.balance(account).await? + amount;
        think().await;
        let () = self
            .store
            .set(self.balance_key(account), balance, None, None, false)
            .await?;
        tracing::info!(
            account,
            amount,
            balance,
            fencing_token = fencing_token(),
            "deposited"
        );
        Ok(balance)
    }

    /// Moves money between two accounts while holding both accounts' locks.
    async fn transfer(&self, from: u64, to: u64, amount: i64) -> Result<Receipt, AppError> {
        if from == to {
            return Err(AppError::SameAccount(from));
        }
        self.transfer_locked(from, to, amount).await
    }

    /// The transfer, under both accounts' locks: `key = [..]` takes all of them or none, in any
    /// order, without deadlock (`1 -> 2` and `2 -> 1` at once cannot each hold one account and
    /// wait for the other).
    #[locked(profile = "accounts", key = ["account:{from}", "account:{to}"])]
    async fn transfer_locked(&self, from: u64, to: u64, amount: i64) -> Result<Receipt, AppError> {
        let transfer = Transfer { from, to, amount };
        // Each key's own fencing token (lower account first), for a store that checks them.
        let token_of = |account: u64| {
            current_lease()
                .and_then(|lease| lease.fencing_token_of(&format!("account:{account}")))
                .unwrap_or(0)
        };
        let tokens = (token_of(from.min(to)), token_of(from.max(to)));
        let Transfer { from, to, amount } = transfer;
        // The racy part: read both balances, work, write both back.
        let from_balance = self.balance(from).await?;
        let to_balance = self.balance(to).await?;
        if from_balance < amount {
            return Err(AppError::InsufficientFunds {
                account: from,
                balance: from_balance,
                amount,
            });
        }
        think().await;
        // Both balances in one MSET: a body cancelled because its lock was lost has either
        // moved the money or not touched it, never half of it.
        self.store
            .mset(vec![
                (self.balance_key(from), from_balance - amount),
                (self.balance_key(to), to_balance + amount),
            ])
            .await?;
        tracing::debug!(
            from,
            to,
            amount,
            lower_lock_token = tokens.0,
            higher_lock_token = tokens.1,
            "transferred"
        );
        Ok(Receipt { transfer, tokens })
    }

    /// Reads a balance if nobody is changing the account right now: `Ok(None)` when its lock is
    /// busy (the body does not run).
    #[locked(profile = "accounts", key = "account:{account}", try_lock)]
    async fn audit(&self, account: u64) -> Result<Option<i64>, AppError> {
        let balance = self.balance(account).await?;
        think().await;
        if balance < 0 {
            return Err(AppError::Negative { account, balance });
        }
        Ok(balance)
    }
}

/// An append-only journal of transfers with a gap-free sequence number. It has its own client
/// (another pool of connections, possibly another server) and namespace, given per method.
#[derive(Debug)]
struct Journal {
    locks: LockClient,
    run: String,
}

impl Journal {
    fn keys(&self) -> (String, String) {
        (
            format!("bank:{{{}}}:journal:seq", self.run),
            format!("bank:{{{}}}:journal:entries", self.run),
        )
    }

    /// Appends a receipt and returns its sequence number. The sequence number is a non-atomic
    /// `GET` + `SET`, so only the lock keeps it equal to the journal's length.
    #[locked(profile = "journal", key = "journal:{self.run}", client = self.locks)]
    async fn record(&self, receipt: &Receipt) -> Result<u64, AppError> {
        let store = self.locks.fred();
        let (seq_key, entries_key) = self.keys();
        let last: Option<u64> = store.get(&seq_key).await?;
        let seq = last.unwrap_or(0) + 1;
        let Transfer { from, to, amount } = receipt.transfer;
        let entry = format!(
            "{seq} {from}->{to} {amount} tokens={}/{} journal-token={}",
            receipt.tokens.0,
            receipt.tokens.1,
            fencing_token()
        );
        let _: u64 = store.rpush(&entries_key, entry).await?;
        let () = store.set(&seq_key, seq, None, None, false).await?;
        Ok(seq)
    }
}

#[derive(Debug, Default)]
struct Tally {
    transfers: u64,
    declined: u64,
    timed_out: u64,
    errors: u64,
    journaled: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.transfers += other.transfers;
        self.declined += other.declined;
        self.timed_out += other.timed_out;
        self.errors += other.errors;
        self.journaled += other.journaled;
    }
}

/// One task: random transfers until the deadline, each recorded in the journal.
async fn transfer_loop(
    bank: Arc<Bank>,
    journal: Arc<Journal>,
    accounts: u64,
    deadline: Instant,
) -> Tally {
    let mut tally = Tally::default();
    while Instant::now() < deadline {
        let (from, to, amount) = {
            let mut rng = rand::rng();
            let from = rng.random_range(0..accounts);
            let to = (from + rng.random_range(1..accounts)) % accounts;
            (from, to, rng.random_range(1..=MAX_TRANSFER))
        };
        match bank.transfer(from, to, amount).await {
            Ok(receipt) => {
                tally.transfers += 1;
                match journal.record(&receipt).await {
                    Ok(_) => tally.journaled += 1,
                    Err(error) => {
                        tally.errors += 1;
                        eprintln!("journal: {error}");
                    }
                }
            }
            Err(AppError::InsufficientFunds { .. }) => tally.declined += 1,
            Err(AppError::Lock(LockError::TimedOut { .. })) => tally.timed_out += 1,
            Err(error) => {
                tally.errors += 1;
                eprintln!("transfer {from} -> {to}: {error}");
            }
        }
    }
    tally
}

#[derive(Debug, Default)]
struct Audits {
    done: u64,
    busy: u64,
    failed: u64,
}

/// Audits random accounts until the deadline, never waiting for a lock.
async fn audit_loop(bank: Arc<Bank>, accounts: u64, deadline: Instant) -> Audits {
    let mut audits = Audits::default();
    while Instant::now() < deadline {
        let account = rand::rng().random_range(0..accounts);
        match bank.audit(account).await {
            Ok(Some(_balance)) => audits.done += 1,
            Ok(None) => audits.busy += 1,
            Err(error) => {
                audits.failed += 1;
                eprintln!("audit of account {account}: {error}");
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    audits
}

fn stats_line(stats: &LockStats) -> String {
    format!(
        "{} acquisitions, {} busy retries, {} releases, {} timeouts, {} renewals, {} losses",
        stats.acquisitions,
        stats.busy_retries,
        stats.releases,
        stats.timeouts,
        stats.renewals,
        stats.losses
    )
}

/// What this binary's command line may hold.
const USAGE: Usage<'static> = Usage {
    flags: &["--valkey"],
    valued: &["--tasks", "--accounts", "--seconds", "--profiles"],
    text: "usage: cargo run -p sage-lock-examples --release --bin service -- [--tasks N] [--accounts N] [--seconds S] [--valkey] [--profiles PATH]",
};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    sage_lock_examples::finish(run().await)
}

/// The profiles with each namespace made this run's own (`accounts` becomes `accounts-<run>`),
/// and those namespaces by profile name: runs against a shared server then neither contend for
/// each other's locks nor leave keys in a namespace a real service may use. A service keeps its
/// configured namespaces; only this example, which may run against any server, does this.
fn per_run(
    profiles: Profiles,
    text: &str,
    run: &str,
) -> anyhow::Result<(Profiles, HashMap<String, String>)> {
    let table: toml::Table = toml::from_str(text)?;
    let configured = |name: &str| {
        table
            .get("lock_profiles")
            .and_then(|profiles| profiles.get(name))
            .and_then(|profile| profile.get("namespace"))
            .and_then(toml::Value::as_str)
            .unwrap_or("lock")
            .to_owned()
    };
    let mut namespaces = HashMap::new();
    let mut mine = Profiles::new();
    for (name, profile) in profiles.iter() {
        let namespace = format!("{}-{run}", configured(name));
        mine.insert(name, profile.clone().namespace(namespace.as_str()));
        namespaces.insert(name.to_owned(), namespace);
    }
    Ok((mine, namespaces))
}

/// Removes this run's keys from the server: its data (balances, journal) and what its locks
/// leave behind (fencing counters, grant times, the queues of waiters cut off), in this run's
/// own namespaces. One `DEL` per key: in a cluster they lie in several hash slots.
async fn remove_data(
    client: &LockClient,
    bank: &Bank,
    journal: &Journal,
    accounts: u64,
) -> anyhow::Result<()> {
    let (seq_key, entries_key) = journal.keys();
    let mut keys: Vec<Vec<u8>> = (0..accounts)
        .map(|a| bank.balance_key(a).into_bytes())
        .collect();
    keys.extend([seq_key.into_bytes(), entries_key.into_bytes()]);
    let locks = (0..accounts)
        .map(|a| ("accounts", format!("account:{a}")))
        .chain([("journal", format!("journal:{}", journal.run))]);
    for (profile, key) in locks {
        if let Some(namespace) = bank.namespaces.get(profile) {
            keys.extend(lock_keys(namespace, &key));
        }
    }
    delete_keys(client.fred(), keys).await?;
    Ok(())
}

async fn run() -> anyhow::Result<ExitCode> {
    if !USAGE.check_command_line()? {
        return Ok(ExitCode::SUCCESS);
    }
    tracing_subscriber::fmt()
        .with_ansi(std::io::stdout().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,service=info")),
        )
        .init();
    let tasks: usize = flag_value("--tasks")?.unwrap_or(8);
    let accounts: u64 = flag_value("--accounts")?.unwrap_or(6);
    let seconds: f64 = flag_value("--seconds")?.unwrap_or(4.0);
    if tasks == 0 || accounts < 2 {
        bail!("--tasks must be at least 1 and --accounts at least 2");
    }
    if !(seconds > 0.0 && seconds < 3600.0) {
        bail!("--seconds must be between 0 and 3600");
    }

    let server = ThrowawayServer::start()?;
    println!("server: {}", server.description());

    // All of the lock configuration, once, at start-up: the annotations only name profiles and
    // keys. A missing profile fails here, not on the first request.
    let path: String = flag_value("--profiles")?.unwrap_or_else(|| PROFILES_FILE.to_owned());
    let text = std::fs::read_to_string(&path)
        .map_err(|error| anyhow::anyhow!("reading the lock profiles {path}: {error}"))?;
    let config: Config = toml::from_str(&text)
        .map_err(|error| anyhow::anyhow!("invalid lock profiles in {path}: {error}"))?;
    let run = format!("{:08x}", rand::random::<u32>());
    let (profiles, namespaces) = per_run(config.lock_profiles, &text, &run)?;
    global::set_profiles(profiles)?;
    global::check_profiles()?;
    let client = LockClient::connect(server.url()).await?;
    global::install(client.clone())?;

    let bank = Arc::new(Bank {
        store: client.fred().clone(),
        run: run.clone(),
        namespaces,
    });
    let journal = Arc::new(Journal {
        locks: LockClient::connect(server.url()).await?,
        run,
    });

    for account in 0..accounts {
        bank.deposit(account, INITIAL_BALANCE).await?;
    }
    let funded = i64::try_from(accounts)? * INITIAL_BALANCE;
    println!(
        "running {tasks} transfer tasks and 1 auditor over {accounts} accounts for {seconds}s"
    );

    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let auditor = tokio::spawn(audit_loop(Arc::clone(&bank), accounts, deadline));
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            tokio::spawn(transfer_loop(
                Arc::clone(&bank),
                Arc::clone(&journal),
                accounts,
                deadline,
            ))
        })
        .collect();
    let stop: Vec<_> = workers
        .iter()
        .map(tokio::task::JoinHandle::abort_handle)
        .chain([auditor.abort_handle()])
        .collect();
    let work = async {
        let mut tally = Tally::default();
        for worker in workers {
            tally.add(&worker.await?);
        }
        anyhow::Ok((tally, auditor.await?))
    };
    let (tally, audits) = tokio::select! {
        done = work => done?,
        () = server.interrupted() => {
            // Ctrl-C: cancel every task (their locks are released), then take this run's data
            // off the server, which may be a shared one.
            for task in stop {
                task.abort();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let removed = remove_data(&client, &bank, &journal, accounts).await;
            journal.locks.quit().await;
            client.quit().await;
            match removed {
                Ok(()) => eprintln!("interrupted: transfers stopped, the run's data removed"),
                Err(error) => eprintln!(
                    "interrupted: transfers stopped; could not remove the run's data \
                     (keys bank:{{{}}}:*): {}",
                    bank.run,
                    sage_lock_examples::report(&error)
                ),
            }
            return Ok(ExitCode::from(130));
        }
    };
    let elapsed = started.elapsed();

    // The invariants.
    let mut balances = Vec::new();
    for account in 0..accounts {
        balances.push(bank.balance(account).await?);
    }
    let total: i64 = balances.iter().sum();
    let (seq_key, entries_key) = journal.keys();
    let seq: Option<u64> = client.fred().get(&seq_key).await?;
    let seq = seq.unwrap_or(0);
    let entries: u64 = client.fred().llen(&entries_key).await?;
    let conserved = total == funded;
    let non_negative = balances.iter().all(|balance| *balance >= 0);
    let journal_ok = seq == entries && seq == tally.journaled;

    println!();
    #[allow(clippy::cast_precision_loss)]
    let rate = tally.transfers as f64 / elapsed.as_secs_f64();
    println!(
        "transfers     {} done ({rate:.0}/s), {} declined (insufficient funds), {} timed out, {} errors",
        tally.transfers, tally.declined, tally.timed_out, tally.errors
    );
    println!(
        "audits        {} done, {} busy (Ok(None), not waited for), {} failed",
        audits.done, audits.busy, audits.failed
    );
    println!(
        "journal       {entries} entries, sequence {seq}, {} recorded",
        tally.journaled
    );
    println!("balances      {balances:?}");
    println!("total         {total} (funded {funded})");
    println!("accounts lock {}", stats_line(&client.stats()));
    println!("journal lock  {}", stats_line(&journal.locks.stats()));

    // Clean up this run's data keys (the server may be a shared one).
    remove_data(&client, &bank, &journal, accounts).await?;
    journal.locks.quit().await;
    client.quit().await;

    println!();
    if conserved && non_negative && journal_ok && audits.failed == 0 {
        println!(
            "CONSERVED: total balance {total} = {accounts} x {INITIAL_BALANCE}, no negative balance, journal sequence = length"
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "INVARIANT VIOLATED: total {total} (expected {funded}), non-negative {non_negative}, journal sequence {seq} / length {entries} / recorded {}",
            tally.journaled
        );
        Ok(ExitCode::from(1))
    }
}
