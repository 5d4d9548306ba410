#!/usr/bin/env bash
# Builds krust (release) and starts a one-node cluster on the embedded store.
# The admin kubeconfig is written to /etc/krust/krust.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -p krust
exec ./target/release/krust server "$@"
