#!/usr/bin/env bash
# A highly available control plane on one machine: three `krust server`s (no nodes of
# their own) on loopback, the first with `--cluster-init`, the others joining it with
# its token; each runs an etcd member, together one etcd cluster.
#
#   scripts/ha.sh up      start the three servers; prints the kubeconfigs to use
#   scripts/ha.sh kill N  SIGKILL server N (1-3) and its etcd member, as a lost machine
#   scripts/ha.sh start N start server N again on its data
#   scripts/ha.sh down    stop everything and remove the state
#
# Server N serves the API on port 6443+100(N-1) (6443, 6543, 6643) and its etcd member on
# 2379+100(N-1) and 2380+100(N-1). Settings (environment): KRUST (the binary; default
# target/debug/krust, else krust on PATH), HA_DIR (state, default /tmp/krust-ha),
# HA_SERVER_ARGS (more flags for every server).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
KRUST="${KRUST:-$here/target/debug/krust}"
[ -x "$KRUST" ] || KRUST="$(command -v krust)"
DIR="${HA_DIR:-/tmp/krust-ha}"

port() { echo $((6443 + 100 * ($1 - 1))); }

start() {
  local n="$1" join=()
  if [ "$n" = 1 ]; then
    join=(--cluster-init)
  elif [ ! -d "$DIR/s$n/server/db/etcd/member" ]; then
    join=(--server "https://127.0.0.1:$(port 1)" --token "$(cat "$DIR/s1/server/token")")
  fi
  "$KRUST" server --disable-agent --disable-dns --disable-ingress \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --node-name "ha-$n" \
    --https-listen-port "$(port "$n")" --data-dir "$DIR/s$n" \
    --write-kubeconfig "$DIR/kubeconfig-$n" \
    --etcd-client-port $((2379 + 100 * (n - 1))) --etcd-peer-port $((2380 + 100 * (n - 1))) \
    --controller-manager-metrics-address 0 --scheduler-metrics-address 0 \
    "${join[@]}" ${HA_SERVER_ARGS:-} >>"$DIR/s$n.log" 2>&1 &
  echo $! >"$DIR/s$n.pid"
  for _ in $(seq 150); do
    curl -sk "https://127.0.0.1:$(port "$n")/readyz" >/dev/null 2>&1 && [ -s "$DIR/kubeconfig-$n" ] && return
    kill -0 "$(cat "$DIR/s$n.pid")" 2>/dev/null || break
    sleep 0.2
  done
  echo "server $n did not start: $DIR/s$n.log" >&2
  exit 1
}

up() {
  mkdir -p "$DIR"
  for n in 1 2 3; do start "$n"; done
  echo "three servers up; for example: export KUBECONFIG=$DIR/kubeconfig-2"
}

kill_server() {
  local n="$1"
  pkill -9 -f -- "--data-dir=$DIR/s$n/server/db/etcd" || true
  kill -9 "$(cat "$DIR/s$n.pid")" 2>/dev/null || true
}

down() {
  for n in 1 2 3; do
    [ -f "$DIR/s$n.pid" ] && kill "$(cat "$DIR/s$n.pid")" 2>/dev/null || true
  done
  for n in 1 2 3; do
    [ -f "$DIR/s$n.pid" ] && while kill -0 "$(cat "$DIR/s$n.pid")" 2>/dev/null; do sleep 0.2; done
    pkill -f -- "--data-dir=$DIR/s$n/server/db/etcd" || true
  done
  rm -rf "$DIR"
}

case "${1:-}" in
  up) up ;;
  kill) kill_server "$2" ;;
  start) start "$2" ;;
  down) down ;;
  *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
