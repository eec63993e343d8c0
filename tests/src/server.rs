//! One real `redis-server` / `valkey-server` process on a loopback port, in its own temp dir.
//!
//! Lifetime: [`Server`] kills its process on drop. Because statics are never dropped and a test binary
//! can be killed, every server also gets a watchdog: a `sh` whose stdin is a pipe held only by the test
//! process. When the test process ends (normally, by panic or by SIGKILL) the pipe closes, and the
//! watchdog SIGKILLs the server and removes its temp dir.

use std::collections::BTreeSet;
use std::collections::hash_map::RandomState;
use std::fs::{self, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::resp::{self, Reply, parse_info_field};
use crate::tls::ServerCerts;

/// How long a server (or a topology) may take to become ready before the harness panics.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Poll interval of every readiness wait.
pub const POLL: Duration = Duration::from_millis(20);

/// The hint every "binary missing" panic carries.
pub const SETUP_HINT: &str = "run `bash scripts/setup.sh` (from the repository root) to install redis-server and valkey-server";

/// Ports are picked at random in `PORT_MIN..PORT_MAX`: below Linux's ephemeral range (32768+), so an
/// outgoing connection never steals a picked port, and `port + 10000` (the cluster bus) is in range too.
const PORT_MIN: u16 = 12_000;
const PORT_MAX: u16 = 22_700;
/// How many fresh ports a start tries when the chosen one turns out to be taken.
const START_ATTEMPTS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServerKind {
    Redis,
    Valkey,
}

impl ServerKind {
    pub const ALL: [ServerKind; 2] = [ServerKind::Redis, ServerKind::Valkey];

    /// `"redis"` or `"valkey"`.
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis",
            ServerKind::Valkey => "valkey",
        }
    }

    /// The executable's file name.
    pub fn binary_name(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis-server",
            ServerKind::Valkey => "valkey-server",
        }
    }

    /// The environment variable that overrides binary discovery.
    pub fn env_var(self) -> &'static str {
        match self {
            ServerKind::Redis => "SAGE_LOCK_REDIS_SERVER",
            ServerKind::Valkey => "SAGE_LOCK_VALKEY_SERVER",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            ServerKind::Redis => 0,
            ServerKind::Valkey => 1,
        }
    }

    /// The server binary: `$SAGE_LOCK_{REDIS,VALKEY}_SERVER`, else `PATH`, else `<workspace>/.tools/bin/`.
    ///
    /// # Panics
    /// When none is found, with a message telling to run `bash scripts/setup.sh`.
    pub fn binary(self) -> PathBuf {
        self.try_binary().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`ServerKind::binary`] without the panic.
    pub fn try_binary(self) -> Result<PathBuf, String> {
        let name = self.binary_name();
        let var = self.env_var();
        if let Some(value) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let path = PathBuf::from(value);
            return if is_executable(&path) {
                Ok(path)
            } else {
                Err(format!(
                    "{var}={} is not an executable file: fix or unset it, or {SETUP_HINT}",
                    path.display()
                ))
            };
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
        Err(format!(
            "{name} not found (looked at ${var}, PATH and {}): {SETUP_HINT}",
            tools.display()
        ))
    }

    /// The first line of `<binary> --version`.
    pub fn version(self) -> String {
        let binary = self.binary();
        match Command::new(&binary).arg("--version").output() {
            Ok(out) => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            Err(e) => panic!("{} --version: {e}", binary.display()),
        }
    }
}

impl std::fmt::Display for ServerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What to start. The harness always writes a config file with loopback bind, no persistence,
/// fast replication (`repl-diskless-sync no`, `repl-diskless-load swapdb`, `rdb-del-sync-files yes`)
/// and `DEBUG` enabled; `conf` lines are appended to it.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub kind: ServerKind,
    /// Extra lines for the config file (e.g. `replicaof 127.0.0.1 1234`, `cluster-enabled yes`).
    /// Lines in the file survive [`Server::restart`] and `CONFIG REWRITE`.
    pub conf: Vec<String>,
    /// Extra command-line arguments, after `<conf> [--sentinel] --port P` (e.g. `--maxmemory 10mb`).
    pub args: Vec<String>,
    /// Start as a Sentinel (`<binary> <conf> --sentinel`).
    pub sentinel: bool,
    /// Pick a port whose cluster bus port (`port + 10000`) is free too.
    pub cluster_bus: bool,
    /// TLS only: `--port 0 --tls-port P` with certificates generated in the temp dir (see
    /// [`ServerConfig::tls`]).
    pub tls: bool,
    /// With [`ServerConfig::tls`]: clients must present a certificate (`tls-auth-clients yes`).
    pub tls_auth_clients: bool,
}

impl ServerConfig {
    pub fn new(kind: ServerKind) -> ServerConfig {
        ServerConfig {
            kind,
            conf: Vec::new(),
            args: Vec::new(),
            sentinel: false,
            cluster_bus: false,
            tls: false,
            tls_auth_clients: false,
        }
    }

    pub fn conf_line(mut self, line: impl Into<String>) -> ServerConfig {
        self.conf.push(line.into());
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> ServerConfig {
        self.args.push(arg.into());
        self
    }

    pub fn sentinel(mut self) -> ServerConfig {
        self.sentinel = true;
        self
    }

    /// TLS only: no plaintext port (`--port 0`), `--tls-port P`, a CA and a server certificate
    /// for [`crate::tls::SERVER_SAN`] generated with `openssl` in the temp dir
    /// ([`Server::tls_certs`]), `tls-auth-clients no`. The harness's plaintext admin commands
    /// ([`Server::cmd`]) do not work on it: readiness is read from the log.
    pub fn tls(mut self) -> ServerConfig {
        self.tls = true;
        self
    }

    /// [`ServerConfig::tls`] with `tls-auth-clients yes`: clients present
    /// [`crate::tls::ServerCerts::client_cert`].
    pub fn tls_mutual(mut self) -> ServerConfig {
        self.tls = true;
        self.tls_auth_clients = true;
        self
    }

    /// Cluster mode: `cluster-enabled yes`, `nodes.conf` in the temp dir, bus port kept free.
    pub fn cluster(mut self, node_timeout_ms: u64) -> ServerConfig {
        self.cluster_bus = true;
        self.conf.push("cluster-enabled yes".to_owned());
        self.conf.push("cluster-config-file nodes.conf".to_owned());
        self.conf
            .push(format!("cluster-node-timeout {node_timeout_ms}"));
        self
    }
}

#[derive(Debug)]
struct Running {
    server: Child,
    /// `sh` blocked on `cat` of a pipe only the test process writes to; its `stdin` is that pipe.
    watchdog: Child,
}

impl Running {
    /// SIGKILLs and reaps the server and its watchdog.
    fn stop(mut self) {
        // Watchdog first: once the server is reaped its pid may be reused, and the watchdog must not
        // be left holding it.
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        drop(self.watchdog.stdin.take());
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

enum StartError {
    /// The port (or its cluster bus port) was taken: try another.
    PortInUse(String),
    Fatal(String),
}

/// One server process. Killed on drop (and by its watchdog when the test process ends).
#[derive(Debug)]
pub struct Server {
    config: ServerConfig,
    binary: PathBuf,
    port: u16,
    dir: PathBuf,
    tls: Option<ServerCerts>,
    running: Mutex<Option<Running>>,
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
        let tls = config.tls.then(|| ServerCerts::generate(&dir));
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
    }

    /// SIGCONT after [`Server::pause`].
    pub fn resume(&self) {
        self.signal("CONT");
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

fn conf_file_name(config: &ServerConfig) -> &'static str {
    if config.sentinel {
        "sentinel.conf"
    } else {
        "server.conf"
    }
}

fn base_conf(config: &ServerConfig, dir: &Path) -> String {
    let mut lines = vec![
        "bind 127.0.0.1".to_owned(),
        "daemonize no".to_owned(),
        format!("dir {}", dir.display()),
        "save \"\"".to_owned(),
        "appendonly no".to_owned(),
    ];
    if !config.sentinel {
        lines.extend(
            [
                // Primary: RDB to disk, then stream. A diskless (socket) sync holds the command
                // stream until the replica's first ACK (sent once a second), so the first WAIT
                // after startup took ~0.8 s.
                "repl-diskless-sync no",
                "repl-diskless-sync-delay 0",
                // Replica: load the RDB straight from the socket. Valkey 9's load from disk is
                // only noticed by a 1 s cron, which made every sync take > 1 s.
                "repl-diskless-load swapdb",
                // Delete the sync RDB, so that a restarted server starts empty.
                "rdb-del-sync-files yes",
                "enable-debug-command yes",
                "enable-protected-configs yes",
            ]
            .map(str::to_owned),
        );
    }
    lines.extend(config.conf.iter().cloned());
    lines.push(String::new());
    lines.join("\n")
}

fn new_temp_dir(config: &ServerConfig) -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join("sage-lock-harness").join(format!(
        "{}-{seq}-{}{}",
        std::process::id(),
        config.kind.name(),
        if config.sentinel { "-sentinel" } else { "" }
    ));
    let _ = fs::remove_dir_all(&dir);
    if let Err(e) = fs::create_dir_all(&dir) {
        panic!("creating {}: {e}", dir.display());
    }
    dir
}

fn random_u64() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(SEQ.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.finish()
}

fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A free port in `PORT_MIN..PORT_MAX` that this process never handed out before.
fn pick_port(cluster_bus: bool) -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let span = u64::from(PORT_MAX - PORT_MIN);
    for _ in 0..10_000 {
        let offset = u16::try_from(random_u64() % span).unwrap_or(0);
        let port = PORT_MIN + offset;
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
        if handed_out.contains(&port) {
            continue;
        }
        if bindable(port) && (!cluster_bus || bindable(port + 10_000)) {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("no free loopback port in {PORT_MIN}..{PORT_MAX}");
}

fn log_tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(no log at {}: {e})", path.display()),
    }
}

/// The log written since byte `from`.
fn log_since(path: &Path, from: u64) -> String {
    let mut text = String::new();
    if let Ok(mut file) = fs::File::open(path)
        && file.seek(SeekFrom::Start(from)).is_ok()
    {
        let mut bytes = Vec::new();
        let _ = file.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    text
}

fn tail_of(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Starts the process (plus watchdog) on `port` and waits until it answers as itself.
fn spawn(
    config: &ServerConfig,
    binary: &Path,
    dir: &Path,
    port: u16,
    deadline: Instant,
) -> Result<Running, StartError> {
    let what = format!(
        "{} {}on port {port} ({})",
        config.kind,
        if config.sentinel { "sentinel " } else { "" },
        dir.display()
    );
    let fatal = |msg: String| StartError::Fatal(format!("{what}: {msg}"));
    let log_path = dir.join("server.log");
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| fatal(format!("opening {}: {e}", log_path.display())))?;
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = writeln!(
        log,
        "=== harness: starting {} on port {port}",
        binary.display()
    );
    let log_err = log
        .try_clone()
        .map_err(|e| fatal(format!("cloning log handle: {e}")))?;

    let mut command = Command::new(binary);
    command.arg(dir.join(conf_file_name(config)));
    if config.sentinel {
        command.arg("--sentinel");
    }
    if config.tls {
        command.args(["--port", "0", "--tls-port"]);
    } else {
        command.arg("--port");
    }
    command
        .arg(port.to_string())
        .args(&config.args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    let mut server = command
        .spawn()
        .map_err(|e| fatal(format!("spawning {}: {e}", binary.display())))?;

    let watchdog = Command::new("sh")
        .args([
            "-c",
            // Blocks until the test process is gone (the pipe's only writer), then cleans up.
            "cat >/dev/null 2>&1; kill -9 \"$1\" 2>/dev/null; rm -rf \"$2\"",
            "sage-lock-harness-watchdog",
        ])
        .arg(server.id().to_string())
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let watchdog = match watchdog {
        Ok(w) => w,
        Err(e) => {
            let _ = server.kill();
            let _ = server.wait();
            return Err(fatal(format!("spawning the watchdog sh: {e}")));
        }
    };
    let mut running = Running { server, watchdog };
    let pid = running.server.id().to_string();

    loop {
        if let Ok(Some(status)) = running.server.try_wait() {
            running.stop();
            let log = log_since(&log_path, log_start);
            let msg = format!(
                "exited during startup ({status}); log:\n{}",
                tail_of(&log, 20)
            );
            return Err(if log.contains("in use") {
                StartError::PortInUse(format!("{what}: {msg}"))
            } else {
                fatal(msg)
            });
        }
        // A TLS-only server has no plaintext port to ask: ready once it says so and accepts
        // connections (it started on the port, so the port is its own).
        if config.tls
            && log_since(&log_path, log_start).contains("Ready to accept connections")
            && std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok()
        {
            return Ok(running);
        }
        // Ready when INFO answers from THIS process (not from whoever else may hold the port).
        if !config.tls
            && let Ok(info) = resp::info_timeout(port, "server", Duration::from_secs(1))
            && parse_info_field(&info, "process_id").as_deref() == Some(pid.as_str())
        {
            return Ok(running);
        }
        if Instant::now() >= deadline {
            running.stop();
            return Err(fatal(format!(
                "not answering after {START_TIMEOUT:?}; log:\n{}",
                tail_of(&log_since(&log_path, log_start), 20)
            )));
        }
        thread::sleep(POLL);
    }
}
