//! Starting one server process: its config file, temp dir, free port, watchdog and log.

use std::collections::BTreeSet;
use std::collections::hash_map::RandomState;
use std::fs::{self, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::{POLL, START_TIMEOUT, ServerConfig};
use crate::resp::{self, parse_info_field};

/// Ports are picked at random in `PORT_MIN..PORT_MAX`: below Linux's ephemeral range (32768+), so an
/// outgoing connection never steals a picked port, and `port + 10000` (the cluster bus) is in range too.
const PORT_MIN: u16 = 12_000;
const PORT_MAX: u16 = 22_700;

#[derive(Debug)]
pub(super) struct Running {
    pub(super) server: Child,
    /// `sh` blocked on `cat` of a pipe only the test process writes to; its `stdin` is that pipe.
    watchdog: Child,
}

impl Running {
    /// SIGKILLs and reaps the server and its watchdog.
    pub(super) fn stop(mut self) {
        // Watchdog first: once the server is reaped its pid may be reused, and the watchdog must not
        // be left holding it.
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        drop(self.watchdog.stdin.take());
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

pub(super) enum StartError {
    /// The port (or its cluster bus port) was taken: try another.
    PortInUse(String),
    Fatal(String),
}
pub(super) fn conf_file_name(config: &ServerConfig) -> &'static str {
    if config.sentinel {
        "sentinel.conf"
    } else {
        "server.conf"
    }
}

pub(super) fn base_conf(config: &ServerConfig, dir: &Path) -> String {
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

pub(super) fn new_temp_dir(config: &ServerConfig) -> PathBuf {
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
pub(super) fn pick_port(cluster_bus: bool) -> u16 {
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

pub(super) fn log_tail(path: &Path, lines: usize) -> String {
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
pub(super) fn spawn(
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
