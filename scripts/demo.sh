#!/usr/bin/env bash
# Runs the multi-process demo: installs a server binary if missing (idempotent); the demo starts a
# throwaway server itself unless SAGE_LOCK_URL points at one. Extra arguments go to the demo
# (e.g. --workers 6 --keys 2 --seconds 10).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec cargo run --quiet --release -p sage-lock-examples --bin demo -- "$@"
