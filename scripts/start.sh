#!/usr/bin/env bash
# Builds krust (release) and starts a one-node cluster on the embedded store.
# The admin kubeconfig is written to /etc/krust/krust.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -p krust
# Upstream's disk thresholds (nodefs 10%, imagefs 15% free) evict every pod of a node
# on a nearly full disk (a 250 GB disk with 5 GB free is 2% free); the quick start keeps
# upstream's memory threshold and asks for 500 MiB of free disk. Pass --eviction-hard to
# choose others.
eviction=(--eviction-hard "memory.available<100Mi,nodefs.available<500Mi,imagefs.available<500Mi")
for arg in "$@"; do
  [[ $arg == --eviction-hard* ]] && eviction=()
done
exec ./target/release/krust server "${eviction[@]}" "$@"
