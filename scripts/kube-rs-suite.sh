#!/usr/bin/env bash
# kube-rs's own cluster tests: the `#[ignore = "needs cluster ..."]` tests that ship in the
# crates.io packages of kube, kube-client and kube-runtime, at the version krust itself
# uses (from Cargo.lock). They are copied from cargo's registry into a scratch workspace
# under target/ (never into the repository) and built there with krust's target dir, so
# the dependencies both share are built once.
#
#   scripts/kube-rs-suite.sh build         builds the suite
#   scripts/kube-rs-suite.sh run [ARGS]    builds if needed, then runs it against the
#                                          cluster of $KUBECONFIG (ARGS go to the tests)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
suite=$root/target/kube-rs-suite
export CARGO_TARGET_DIR=$root/target

prepare() {
  mkdir -p "$suite"
  # Where cargo unpacked each package (it does for every dependency it builds).
  cargo metadata --format-version 1 --locked | python3 -c '
import json, os, sys
meta = json.load(sys.stdin)
for p in meta["packages"]:
    if p["name"] in ("kube", "kube-client", "kube-runtime") and p["source"]:
        print(p["name"], os.path.dirname(p["manifest_path"]))
' | while read -r name dir; do
    rm -rf "${suite:?}/$name"
    cp -r "$dir" "$suite/$name"
  done
  # Publishing drops the path-only dev-dependency on kube that their tests use; put it back
  # as kube-rs's own workspace has it.
  printf '\n[dev-dependencies.kube]\npath = "../kube"\nfeatures = ["derive", "client", "ws"]\n' \
    >> "$suite/kube-client/Cargo.toml"
  printf '\n[dev-dependencies.kube]\npath = "../kube"\nfeatures = ["derive", "client", "runtime"]\n' \
    >> "$suite/kube-runtime/Cargo.toml"
  cat > "$suite/Cargo.toml" <<'EOF'
[workspace]
members = ["kube", "kube-client", "kube-runtime"]
resolver = "2"

# kube depends on kube-client and kube-runtime: use the copies whose tests run.
[patch.crates-io]
kube-client = { path = "kube-client" }
kube-runtime = { path = "kube-runtime" }

# krust's profile, so that shared dependencies are not built twice.
[profile.dev]
debug = "line-tables-only"

[profile.dev.package."*"]
debug = false
EOF
  # Start from krust's versions of everything both use.
  cp "$root/Cargo.lock" "$suite/Cargo.lock"
}

# What the tests need: the derive macro and runtime (kube), exec/attach over WebSocket.
cargo_test() {
  cargo test --manifest-path "$suite/Cargo.toml" -p kube -p kube-client -p kube-runtime \
    --lib --features kube/derive,kube/runtime,kube/ws,kube-client/ws "$@"
}

case "${1:-}" in
  build)
    prepare
    cargo_test --no-run
    ;;
  run)
    shift
    [ -f "$suite/Cargo.toml" ] || prepare
    : "${KUBECONFIG:?the cluster to test: set KUBECONFIG}"
    cargo_test --no-fail-fast -- --ignored "$@"
    ;;
  *)
    echo "usage: $0 build | run [test args]" >&2
    exit 2
    ;;
esac
