//! The coordinator's worker processes: spawning (the `chaos` binary re-executed in worker mode),
//! SIGKILL with respawn, SIGSTOP/SIGCONT, RSS, and the stop protocol over stdin/stdout.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead as _, BufReader, Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::Primitive;
use super::clock::now_ns;
use super::history::{Event, Record};

/// What every worker is started with.
#[derive(Clone, Debug)]
pub struct Spawn {
    pub exe: PathBuf,
    pub dir: PathBuf,
    pub url: String,
    pub replicated: bool,
    pub store_port: u16,
    pub lease: Duration,
    pub seed: u64,
    pub primitives: Vec<Primitive>,
}

/// One live worker process.
#[derive(Debug)]
pub struct WorkerProc {
    pub slot: u32,
    pub name: String,
    pub history: PathBuf,
    pub stderr: PathBuf,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

/// A worker process that is gone: killed by the nemesis, or exited at the end.
#[derive(Debug)]
pub struct Finished {
    pub name: String,
    pub history: PathBuf,
    pub stderr: PathBuf,
    /// When the nemesis SIGKILLed it.
    pub killed_at: Option<u64>,
    /// Exit status, when it exited on its own.
    pub status: Option<ExitStatus>,
}

/// All workers of a run.
#[derive(Debug)]
pub struct Fleet {
    spawn: Spawn,
    pub live: Vec<WorkerProc>,
    pub finished: Vec<Finished>,
    generations: HashMap<u32, u32>,
}

impl Fleet {
    pub fn start(spawn: Spawn, workers: u32) -> Result<Fleet, String> {
        let mut fleet = Fleet {
            spawn,
            live: Vec::new(),
            finished: Vec::new(),
            generations: HashMap::new(),
        };
        for slot in 0..workers {
            let worker = fleet.spawn_worker(slot)?;
            fleet.live.push(worker);
        }
        Ok(fleet)
    }

    fn spawn_worker(&mut self, slot: u32) -> Result<WorkerProc, String> {
        let generation = self.generations.entry(slot).or_insert(0);
        let name = format!("w{slot}g{generation}");
        *generation += 1;
        let s = &self.spawn;
        let history = s.dir.join(format!("{name}.history"));
        let stderr = s.dir.join(format!("{name}.stderr"));
        let stderr_file =
            File::create(&stderr).map_err(|e| format!("creating {}: {e}", stderr.display()))?;
        let seed = s
            .seed
            .wrapping_mul(1_000_003)
            .wrapping_add(u64::from(slot) * 7919)
            ^ u64::from(*generation);
        let mut child = Command::new(&s.exe)
            .arg("--worker")
            .args(["--url", &s.url])
            .args(["--replicated", if s.replicated { "1" } else { "0" }])
            .args(["--store-port", &s.store_port.to_string()])
            .arg("--history")
            .arg(&history)
            .args(["--lease-ms", &s.lease.as_millis().to_string()])
            .args(["--seed", &seed.to_string()])
            .args(["--slot", &slot.to_string()])
            .args(["--primitives", &Primitive::list_text(&s.primitives)])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr_file)
            .spawn()
            .map_err(|e| format!("spawning worker {name} ({}): {e}", s.exe.display()))?;
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(WorkerProc {
            slot,
            name,
            history,
            stderr,
            child,
            stdin,
            lines,
        })
    }

    fn index(&self, slot: u32) -> Option<usize> {
        self.live.iter().position(|w| w.slot == slot)
    }

    /// Slots of workers that hold a lock right now (per the tail of their history).
    pub fn holders(&self) -> Vec<u32> {
        self.live
            .iter()
            .filter(|w| holds_lock(&w.history))
            .map(|w| w.slot)
            .collect()
    }

    /// SIGKILLs the worker in `slot` and starts a new one there; returns the killed one's name.
    pub fn kill_and_respawn(&mut self, slot: u32) -> Result<String, String> {
        let i = self
            .index(slot)
            .ok_or_else(|| format!("no worker in slot {slot}"))?;
        let mut worker = self.live.remove(i);
        let _ = worker.child.kill();
        let killed_at = now_ns();
        let _ = worker.child.wait();
        let name = worker.name.clone();
        self.finished.push(Finished {
            name: worker.name,
            history: worker.history,
            stderr: worker.stderr,
            killed_at: Some(killed_at),
            status: None,
        });
        let fresh = self.spawn_worker(slot)?;
        self.live.push(fresh);
        Ok(name)
    }

    /// Sends `STOP` or `CONT` to the worker in `slot`; returns its name.
    pub fn signal(&self, slot: u32, signal: &str) -> Result<String, String> {
        let i = self
            .index(slot)
            .ok_or_else(|| format!("no worker in slot {slot}"))?;
        let worker = &self.live[i];
        send_signal(worker.child.id(), signal)?;
        Ok(worker.name.clone())
    }

    /// `VmRSS` in KiB of every live worker, by name.
    pub fn rss(&self) -> HashMap<String, u64> {
        self.live
            .iter()
            .filter_map(|w| Some((w.name.clone(), rss_kib(w.child.id())?)))
            .collect()
    }

    /// Tells every worker to stop and waits (up to `timeout`) for each to answer `stopped`.
    /// Returns the names of those that did not.
    pub fn stop_all(&mut self, timeout: Duration) -> Vec<String> {
        for worker in &mut self.live {
            if let Some(stdin) = worker.stdin.as_mut() {
                let _ = stdin.write_all(b"stop\n").and_then(|()| stdin.flush());
            }
        }
        let deadline = Instant::now() + timeout;
        let mut silent = Vec::new();
        for worker in &self.live {
            let mut answered = false;
            while let Ok(line) = worker
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                if line.trim() == "stopped" {
                    answered = true;
                    break;
                }
            }
            if !answered {
                silent.push(worker.name.clone());
            }
        }
        silent
    }

    /// Lets every worker exit (killing those that do not within `timeout`) and reaps them.
    pub fn exit_all(&mut self, timeout: Duration) {
        for worker in &mut self.live {
            drop(worker.stdin.take());
        }
        let deadline = Instant::now() + timeout;
        for mut worker in self.live.drain(..) {
            let status = loop {
                match worker.child.try_wait() {
                    Ok(Some(status)) => break Some(status),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    _ => {
                        let _ = worker.child.kill();
                        break worker.child.wait().ok();
                    }
                }
            };
            self.finished.push(Finished {
                name: worker.name,
                history: worker.history,
                stderr: worker.stderr,
                killed_at: None,
                status,
            });
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for worker in &mut self.live {
            let _ = send_signal(worker.child.id(), "CONT");
            let _ = worker.child.kill();
            let _ = worker.child.wait();
        }
    }
}

/// `kill -s SIGNAL pid`.
pub fn send_signal(pid: u32, signal: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status()
        .map_err(|e| format!("kill -s {signal} {pid}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -s {signal} {pid}: {status}"))
    }
}

/// `VmRSS` of a process in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Whether the last events of some task in the history at `path` show a held lock.
fn holds_lock(path: &Path) -> bool {
    const TAIL: u64 = 8 * 1024;
    let Ok(mut file) = File::open(path) else {
        return false;
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if file
        .seek(SeekFrom::Start(len.saturating_sub(TAIL)))
        .is_err()
    {
        return false;
    }
    let mut text = String::new();
    if file.read_to_string(&mut text).is_err() {
        return false;
    }
    let mut holding: HashMap<u32, bool> = HashMap::new();
    for record in text.lines().filter_map(|l| l.parse::<Record>().ok()) {
        match record.event {
            Event::Acquired { .. } => {
                holding.insert(record.task, true);
            }
            Event::Released { .. } | Event::Error { .. } => {
                holding.insert(record.task, false);
            }
            _ => {}
        }
    }
    holding.values().any(|&h| h)
}
