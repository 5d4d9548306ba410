#!/usr/bin/env bash
# Runs every test: unit tests, the store suite and the end-to-end tests that drive the
# real kubectl against real krust servers (the node's again under crun), then a short
# run of each fuzz target (FUZZ_SECONDS each, default 30; scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --workspace --all-targets
# kube-rs's cluster tests (run by the e2e test kube_rs) are built here, not inside a test.
scripts/kube-rs-suite.sh build
cargo nextest run --workspace --no-fail-fast "$@"
if [ $# -eq 0 ]; then
  # The node's end-to-end tests again with crun as the default runtime handler (the run
  # above uses runc): every kubelet test passes with both.
  KRUST_DEFAULT_RUNTIME=crun cargo nextest run -p krust --test e2e --no-fail-fast kubelet:: streams::
fi
FUZZ_DEV=1 scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
