#!/usr/bin/env bash
# Runs the whole test suite: installs the server binaries if missing (idempotent), then every
# test of the workspace (unit, doc, integration against real Redis and Valkey servers in every
# topology, trybuild UI tests). Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec cargo test --workspace --all-features "$@"
