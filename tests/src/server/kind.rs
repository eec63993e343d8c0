//! Which server, and where its binary is.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::SETUP_HINT;

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
