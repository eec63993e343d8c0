//! Shared helpers of the sage-lock examples.
//!
//! [`ThrowawayServer`] gives every example a server to talk to: the one `SAGE_LOCK_URL` names, or
//! a private `redis-server` / `valkey-server` started on a free loopback port in a temporary
//! directory, without persistence, and stopped again when the example ends (on drop, on Ctrl-C,
//! and — through a small watchdog process — even when the example is killed).

// Doctests (the README's snippets too) warn about nothing but unused items.
#![doc(test(attr(deny(warnings), allow(unused))))]

pub mod cleanup;
pub mod cli;
pub mod existing_url;
pub mod floor;
pub mod locks_tool;
pub mod multiprocess;

/// The README's Rust snippets, compiled by `cargo test -p sage-lock-examples --doc` (part of
/// `scripts/test.sh`) so that what users copy cannot go stale. Hosted here, in a crate that is
/// not published, because the README lies outside the `sage-lock` package directory.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

pub use cli::{Usage, finish, flag_value, has_flag, percentile, report};

use std::fmt;
use std::fs;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// The environment variable naming an existing server to use instead of starting one.
pub const URL_VARIABLE: &str = "SAGE_LOCK_URL";
/// The environment variable choosing the server kind (`redis` or `valkey`).
pub const SERVER_VARIABLE: &str = "SAGE_LOCK_SERVER";

/// How long a started server may take to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Which server binary to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// `redis-server`.
    Redis,
    /// `valkey-server`.
    Valkey,
}

impl ServerKind {
    /// `valkey` when the command line has `--valkey` or `SAGE_LOCK_SERVER=valkey`, else `redis`.
    #[must_use]
    pub fn from_env_and_args() -> ServerKind {
        let flag = std::env::args().any(|arg| arg == "--valkey");
        let env = std::env::var(SERVER_VARIABLE).is_ok_and(|v| v.eq_ignore_ascii_case("valkey"));
        if flag || env {
            ServerKind::Valkey
        } else {
            ServerKind::Redis
        }
    }

    /// The executable's file name.
    #[must_use]
    pub fn binary_name(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis-server",
            ServerKind::Valkey => "valkey-server",
        }
    }

    /// The environment variable that points at the binary directly.
    #[must_use]
    pub fn env_var(self) -> &'static str {
        match self {
            ServerKind::Redis => "SAGE_LOCK_REDIS_SERVER",
            ServerKind::Valkey => "SAGE_LOCK_VALKEY_SERVER",
        }
    }

    /// Finds the binary: `$SAGE_LOCK_{REDIS,VALKEY}_SERVER`, then `PATH`, then
    /// `<workspace>/.tools/bin/`.
    ///
    /// # Errors
    /// When none is found, with a message saying how to install one.
    pub fn binary(self) -> anyhow::Result<PathBuf> {
        let name = self.binary_name();
        let var = self.env_var();
        if let Some(value) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let path = PathBuf::from(value);
            if is_executable(&path) {
                return Ok(path);
            }
            bail!(
                "{var}={} is not an executable file: fix or unset it, run `bash scripts/setup.sh`, or set {URL_VARIABLE}",
                path.display()
            );
        }
        if let Some(path) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&path) {
                let candidate = dir.join(name);
                if is_executable(&candidate) {
                    return Ok(candidate);
                }
            }
        }
        let tools = workspace_root().join(".tools").join("bin").join(name);
        if is_executable(&tools) {
            return Ok(tools);
        }
        bail!(
            "no {name} found (looked at ${var}, PATH and {}): run `bash scripts/setup.sh` or set {URL_VARIABLE}",
            tools.display()
        )
    }
}

impl fmt::Display for ServerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.binary_name())
    }
}

/// The workspace root (the parent of the examples crate).
#[must_use]
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A server for an example: an existing one (`SAGE_LOCK_URL`), or a private, throwaway process.
///
/// ```no_run
/// # fn demo() -> anyhow::Result<()> {
/// let server = sage_lock_examples::ThrowawayServer::start()?;
/// println!("using {}", server.url());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ThrowawayServer {
    url: String,
    description: String,
    /// `None` when the server came from `SAGE_LOCK_URL`.
    owned: Option<Arc<Mutex<Owned>>>,
}

#[derive(Debug)]
struct Owned {
    server: Option<Child>,
    watchdog: Option<Child>,
    dir: PathBuf,
}

impl Owned {
    /// Stops the watchdog (so it cannot signal a reused pid), then the server; removes the dir.
    fn stop(&mut self) {
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl ThrowawayServer {
    /// Uses `SAGE_LOCK_URL` when set and something answers at its address; otherwise starts
    /// the server kind chosen by `--valkey` / `SAGE_LOCK_SERVER` (see
    /// [`ServerKind::from_env_and_args`]), saying on stderr when `SAGE_LOCK_URL` was not
    /// reachable.
    ///
    /// # Errors
    /// When no binary is found or the server does not come up.
    pub fn start() -> anyhow::Result<ThrowawayServer> {
        let url = std::env::var(URL_VARIABLE).ok().filter(|u| !u.is_empty());
        ThrowawayServer::existing_or_start(url, ServerKind::from_env_and_args())
    }

    /// The server at `url` when something answers there (see [`existing_url::probe`]);
    /// otherwise a private server of `kind`, started here.
    ///
    /// # Errors
    /// When no binary is found or the server does not come up.
    pub fn existing_or_start(
        url: Option<String>,
        kind: ServerKind,
    ) -> anyhow::Result<ThrowawayServer> {
        let Some(url) = url else {
            return ThrowawayServer::start_kind(kind);
        };
        let shown = existing_url::redact(&url);
        match existing_url::probe(&url) {
            Ok(()) => Ok(ThrowawayServer {
                description: format!("existing server {shown} (from {URL_VARIABLE})"),
                url,
                owned: None,
            }),
            Err(why) => {
                eprintln!(
                    "warning: {URL_VARIABLE}={shown} is not reachable ({why}); starting a \
                     throwaway server instead (start that server, or unset {URL_VARIABLE})"
                );
                let mut server = ThrowawayServer::start_kind(kind)?;
                server.description =
                    format!("{} ({URL_VARIABLE} was not reachable)", server.description);
                Ok(server)
            }
        }
    }

    /// Starts a private server of `kind` (ignores `SAGE_LOCK_URL`).
    ///
    /// # Errors
    /// When no binary is found or the server does not come up.
    pub fn start_kind(kind: ServerKind) -> anyhow::Result<ThrowawayServer> {
        let binary = kind.binary()?;
        let mut last_error = None;
        // A picked port can be taken by someone else before the server binds it: try a few.
        for _ in 0..5 {
            match ThrowawayServer::spawn(kind, &binary) {
                Ok(server) => return Ok(server),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("could not start {kind}")))
    }

    fn spawn(kind: ServerKind, binary: &Path) -> anyhow::Result<ThrowawayServer> {
        let port = free_port()?;
        let dir =
            std::env::temp_dir().join(format!("sage-lock-example-{}-{port}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let log = dir.join("server.log");
        let spawned = Command::new(binary)
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()));
        let server = match spawned {
            Ok(server) => server,
            Err(error) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(error);
            }
        };
        let watchdog = spawn_watchdog(server.id(), &dir);
        let owned = Arc::new(Mutex::new(Owned {
            server: Some(server),
            watchdog,
            dir: dir.clone(),
        }));
        let this = ThrowawayServer {
            url: format!("redis://127.0.0.1:{port}"),
            description: format!("{kind} ({}) on 127.0.0.1:{port}", binary.display()),
            owned: Some(Arc::clone(&owned)),
        };
        // On failure `this` is dropped, which stops the process and removes the directory.
        wait_until_ready(port, &owned).with_context(|| {
            let tail = fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            format!(
                "{kind} on port {port} did not answer PING; its log ends with:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })?;
        stop_on_signal(&owned);
        Ok(this)
    }

    /// The URL to connect to.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What this server is, for printing.
    #[must_use]
    pub fn description(&self) -> &str {
        &self.description
    }

    /// True when this process started the server (so it may, e.g., flush it freely).
    #[must_use]
    pub fn is_private(&self) -> bool {
        self.owned.is_some()
    }

    /// Resolves on Ctrl-C when this is the user's server (`SAGE_LOCK_URL`), for the example to
    /// take its own data off it; never for a throwaway server, which stops on Ctrl-C by itself
    /// (and exits), taking the data with it.
    pub async fn interrupted(&self) {
        if self.is_private() || tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for ThrowawayServer {
    fn drop(&mut self) {
        if let Some(owned) = &self.owned {
            owned.lock().unwrap_or_else(PoisonError::into_inner).stop();
        }
    }
}

fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// A `sh` that waits for its stdin (a pipe only this process holds) to close, then kills the
/// server and removes its directory: the server never outlives this process, however it ends.
fn spawn_watchdog(pid: u32, dir: &Path) -> Option<Child> {
    let script = "read _ignored; kill -9 \"$1\" 2>/dev/null; rm -rf \"$2\"";
    Command::new("sh")
        .args(["-c", script, "sage-lock-watchdog", &pid.to_string()])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

fn wait_until_ready(port: u16, owned: &Mutex<Owned>) -> anyhow::Result<()> {
    let started = Instant::now();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    loop {
        if ping(addr).is_ok() {
            return Ok(());
        }
        {
            let mut guard = owned.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(server) = guard.server.as_mut()
                && let Ok(Some(status)) = server.try_wait()
            {
                bail!("the server exited at start-up ({status})");
            }
        }
        if started.elapsed() > START_TIMEOUT {
            bail!("no PONG within {START_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ping(addr: SocketAddr) -> anyhow::Result<()> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    stream.write_all(b"PING\r\n")?;
    let mut line = String::new();
    BufReader::new(&mut stream).read_line(&mut line)?;
    if line.starts_with("+PONG") {
        Ok(())
    } else {
        bail!("unexpected reply {line:?}")
    }
}

/// Best effort: on Ctrl-C (or SIGTERM) stop the server and exit, when a tokio runtime is running.
fn stop_on_signal(owned: &Arc<Mutex<Owned>>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let owned = Arc::downgrade(owned);
    runtime.spawn(async move {
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            result = tokio::signal::ctrl_c() => {
                if result.is_err() {
                    return;
                }
            }
            () = terminate => {}
        }
        if let Some(owned) = owned.upgrade() {
            owned.lock().unwrap_or_else(PoisonError::into_inner).stop();
            eprintln!("\ninterrupted: stopped the throwaway server");
        }
        std::process::exit(130);
    });
}

#[cfg(test)]
mod tests {
    use super::{ServerKind, ThrowawayServer};

    #[test]
    fn an_unreachable_existing_url_gets_a_throwaway_server_instead() {
        let dead_port = super::free_port().expect("a free port");
        let dead = format!("redis://127.0.0.1:{dead_port}");
        let server = ThrowawayServer::existing_or_start(Some(dead.clone()), ServerKind::Redis)
            .expect("a throwaway server");
        assert!(server.is_private(), "{}", server.description());
        assert_ne!(server.url(), dead);
        assert!(
            server.description().contains("was not reachable"),
            "{}",
            server.description()
        );
        let port: u16 = server
            .url()
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .expect("a port in the URL");
        super::ping((std::net::Ipv4Addr::LOCALHOST, port).into()).expect("it answers PING");
        // A reachable URL is used as it is, and its credentials are not printed.
        let with_password = format!("redis://user:secret@127.0.0.1:{port}");
        let existing =
            ThrowawayServer::existing_or_start(Some(with_password.clone()), ServerKind::Redis)
                .expect("the existing server");
        assert!(!existing.is_private());
        assert_eq!(existing.url(), with_password);
        assert!(
            !existing.description().contains("secret"),
            "{}",
            existing.description()
        );
    }
}
