//! One real `redis-server` / `valkey-server` process on a loopback port, in its own temp dir.
//!
//! Lifetime: [`Server`] kills its process on drop. Because statics are never dropped and a test binary
//! can be killed, every server also gets a watchdog: a `sh` whose stdin is a pipe held only by the test
//! process. When the test process ends (normally, by panic or by SIGKILL) the pipe closes, and the
//! watchdog SIGKILLs the server and removes its temp dir.

mod config;
mod kind;
mod process;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::resp::{self, Reply};
use crate::tls::ServerCerts;

pub use config::ServerConfig;
pub use kind::{ServerKind, workspace_root};
use process::{
    Running, StartError, base_conf, conf_file_name, log_tail, new_temp_dir, pick_port, spawn,
};

/// How long a server (or a topology) may take to become ready before the harness panics.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Poll interval of every readiness wait.
pub const POLL: Duration = Duration::from_millis(20);

/// The hint every "binary missing" panic carries.
pub const SETUP_HINT: &str = "run `bash scripts/setup.sh` (from the repository root) to install redis-server and valkey-server";

/// How many fresh ports a start tries when the chosen one turns out to be taken.
const START_ATTEMPTS: usize = 8;

/// One server process. Killed on drop (and by its watchdog when the test process ends).
#[derive(Debug)]
pub struct Server {
    config: ServerConfig,
    binary: PathBuf,
    port: u16,
    dir: PathBuf,
    tls: Option<ServerCerts>,
    running: Mutex<Option<Running>>,
    /// Set by [`Server::pause`], cleared by [`Server::resume`].
    paused: std::sync::atomic::AtomicBool,
}

/// A server frozen by [`Server::frozen`]: resumed (`SIGCONT`) when dropped, also when the test
/// panics meanwhile.
#[derive(Debug)]
pub struct Frozen<'a>(&'a Server);

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        if self.0.is_running() && self.0.is_paused() {
            self.0.resume();
        }
    }
}

impl Server {
    /// A standalone server.
    pub fn start(kind: ServerKind) -> Server {
        Server::launch(ServerConfig::new(kind))
    }

    /// A standalone server with extra command-line arguments, e.g. `&["--maxmemory", "10mb"]`.
    pub fn start_with(kind: ServerKind, extra_args: &[&str]) -> Server {
        let mut config = ServerConfig::new(kind);
        config.args = extra_args.iter().map(|a| (*a).to_owned()).collect();
        Server::launch(config)
    }

    /// Starts a server as configured and waits until it answers (`INFO` from this very process).
    ///
    /// # Panics
    /// When the binary is missing, or the server does not come up within [`START_TIMEOUT`]
    /// (the message includes its log tail).
    pub fn launch(config: ServerConfig) -> Server {
        let binary = config.kind.binary();
        let dir = new_temp_dir(&config);
        let tls = config
            .tls
            .then(|| ServerCerts::generate_with(&dir, config.tls_issue));
        let conf_path = dir.join(conf_file_name(&config));
        let mut conf = base_conf(&config, &dir);
        let auth_clients = config.tls_auth_clients;
        for line in tls.iter().flat_map(|certs| certs.conf_lines(auth_clients)) {
            conf.push_str(&line);
            conf.push('\n');
        }
        if let Err(e) = fs::write(&conf_path, conf) {
            panic!("writing {}: {e}", conf_path.display());
        }
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = pick_port(config.cluster_bus);
            match spawn(&config, &binary, &dir, port, Instant::now() + START_TIMEOUT) {
                Ok(running) => {
                    return Server {
                        config,
                        binary,
                        port,
                        dir,
                        tls,
                        running: Mutex::new(Some(running)),
                        paused: std::sync::atomic::AtomicBool::new(false),
                    };
                }
                Err(StartError::PortInUse(msg)) => last = msg,
                Err(StartError::Fatal(msg)) => {
                    let _ = fs::remove_dir_all(&dir);
                    panic!("{msg}");
                }
            }
        }
        let _ = fs::remove_dir_all(&dir);
        panic!(
            "could not start {} after {START_ATTEMPTS} ports: {last}",
            config.kind
        );
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn kind(&self) -> ServerKind {
        self.config.kind
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:PORT` (for a [`ServerConfig::tls`] server).
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// The certificates of a [`ServerConfig::tls`] server.
    pub fn tls_certs(&self) -> Option<&ServerCerts> {
        self.tls.as_ref()
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The server's temp dir (config, log, `nodes.conf`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// The last `lines` lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path(), lines)
    }

    /// The server's pid while it runs (also while paused).
    pub fn pid(&self) -> Option<u32> {
        self.state().as_ref().map(|r| r.server.id())
    }

    /// Whether the process is alive (a paused process is alive).
    pub fn is_running(&self) -> bool {
        let mut state = self.state();
        let exited = match state.as_mut() {
            None => return false,
            Some(running) => !matches!(running.server.try_wait(), Ok(None)),
        };
        if exited && let Some(running) = state.take() {
            running.stop();
        }
        !exited
    }

    /// SIGKILLs the server and waits until it is gone. No-op when it is not running.
    pub fn kill(&self) {
        if let Some(running) = self.state().take() {
            running.stop();
        }
    }

    /// SIGSTOP: the process stays alive, its sockets stay open, nothing is answered.
    ///
    /// # Panics
    /// When the server is not running.
    pub fn pause(&self) {
        self.signal("STOP");
        self.paused
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// SIGCONT after [`Server::pause`].
    pub fn resume(&self) {
        self.signal("CONT");
        self.paused
            .store(false, std::sync::atomic::Ordering::Release);
    }

    /// Whether [`Server::pause`] froze the server and nothing resumed it since.
    pub fn is_paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::Acquire)
    }

    /// [`Server::pause`], undone ([`Server::resume`]) when the guard is dropped.
    ///
    /// # Panics
    /// When the server is not running.
    #[must_use = "the server is resumed when the guard is dropped"]
    pub fn frozen(&self) -> Frozen<'_> {
        self.pause();
        Frozen(self)
    }

    fn signal(&self, sig: &str) {
        let Some(pid) = self.pid() else {
            panic!(
                "{} on port {} is not running: cannot send SIG{sig}",
                self.kind(),
                self.port
            );
        };
        let status = Command::new("sh")
            .args(["-c", "kill -s \"$1\" \"$2\"", "sh", sig, &pid.to_string()])
            .status();
        match status {
            Ok(s) if s.success() => {}
            other => panic!("kill -s {sig} {pid}: {other:?}"),
        }
    }

    /// Starts the server again on the SAME port, same temp dir and config file (so a replica follows
    /// its primary again, and a cluster node keeps its id via `nodes.conf`), with an empty dataset.
    /// Kills it first if it still runs. Waits until it answers.
    ///
    /// # Panics
    /// When it does not come up within [`START_TIMEOUT`] (e.g. another process took the port).
    pub fn restart(&self) {
        let mut state = self.state();
        if let Some(running) = state.take() {
            running.stop();
        }
        // No persistence: whatever RDB replication left behind must not be loaded.
        let _ = fs::remove_file(self.dir.join("dump.rdb"));
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match spawn(&self.config, &self.binary, &self.dir, self.port, deadline) {
                Ok(running) => {
                    *state = Some(running);
                    return;
                }
                // Someone else holds the port (maybe briefly): retry until the deadline.
                Err(StartError::PortInUse(_)) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(100));
                }
                Err(StartError::PortInUse(msg) | StartError::Fatal(msg)) => {
                    panic!("restart: {msg}")
                }
            }
        }
    }

    /// [`resp::cmd`] on this server.
    pub fn cmd(&self, args: &[&str]) -> Result<Reply, String> {
        resp::cmd(self.port, args)
    }

    /// [`resp::cmd_ok`] on this server.
    pub fn cmd_ok(&self, args: &[&str]) -> Reply {
        resp::cmd_ok(self.port, args)
    }

    /// [`resp::info_field`] on this server.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        resp::info_field(self.port, section, field)
    }

    /// A one-line description plus the log tail, for panic messages.
    pub fn describe(&self) -> String {
        format!(
            "{} {}on port {} (dir {}), log tail:\n{}",
            self.kind(),
            if self.config.sentinel {
                "sentinel "
            } else {
                ""
            },
            self.port,
            self.dir.display(),
            self.log_tail(15)
        )
    }

    fn state(&self) -> MutexGuard<'_, Option<Running>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}
