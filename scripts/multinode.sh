#!/usr/bin/env bash
# A multi-node krust cluster on one machine: `krust server` (no node of its own) on a
# bridge, and N nodes, each a network namespace on that bridge running `krust agent`
# (its own containerd, data dir and pod range) that joins with the server's token.
# With MN_SERVERS=3 (scripts/ha.sh) the control plane is highly available: three
# servers, each in a network namespace of its own with an etcd member, the first with
# `--cluster-init`, the others joining it.
#
#   scripts/multinode.sh up [N]     start the server(s) and N nodes (default 3); prints
#                                   the kubeconfig to use
#   scripts/multinode.sh down       stop everything, remove the namespaces and the state
# With several servers also:
#   scripts/multinode.sh kill I     SIGKILL server I's etcd member and server (a lost machine)
#   scripts/multinode.sh start I    start server I again on its data
#   scripts/multinode.sh partition I   cut server I off the network; `heal I` joins it again
#
# Settings (environment): KRUST (the binary; default target/debug/krust, else krust on
# PATH), MN_DIR (state, default /tmp/krust-multinode), MN_NAME (prefix of the bridge,
# namespaces and links, default mn), MN_SUBNET (first three octets of the node network,
# default 10.99.8; the host is .1, the server .1 (several: server i is .(1+i)), node i
# is .(10+i)), MN_PORT (apiserver port, default 6443), MN_SERVERS (1 or more, default
# 1), MN_BACKEND (vxlan or host-gw, default vxlan), MN_CLUSTER_CIDR (default
# 10.42.0.0/16), MN_SERVER_ARGS and MN_AGENT_ARGS (more flags for the servers and for
# every agent). Needs root.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
KRUST="${KRUST:-$here/target/debug/krust}"
[ -x "$KRUST" ] || KRUST="$(command -v krust)"
DIR="${MN_DIR:-/tmp/krust-multinode}"
NAME="${MN_NAME:-mn}"
SUBNET="${MN_SUBNET:-10.99.8}"
PORT="${MN_PORT:-6443}"
BACKEND="${MN_BACKEND:-vxlan}"
CLUSTER_CIDR="${MN_CLUSTER_CIDR:-10.42.0.0/16}"
SERVICE_CIDR="10.43.0.0/16"
BRIDGE="${NAME}br"
SERVERS="${MN_SERVERS:-1}"
if [ "$SERVERS" -gt 1 ]; then SERVER_IP="$SUBNET.2"; else SERVER_IP="$SUBNET.1"; fi

node_ns() { echo "$NAME-n$1"; }
server_ns() { echo "$NAME-s$1"; }

# A network namespace NS on the bridge with address IP, its host side named LINK.
add_ns() {
  local ns="$1" link="$2" ip="$3"
  ip netns add "$ns"
  ip link add "$link" type veth peer name eth0 netns "$ns"
  ip link set "$link" master "$BRIDGE" up
  ip -n "$ns" addr add "$ip/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
}

# Server I of several, in its namespace: the first starts the cluster, the others join
# it (or, on their data, rejoin).
start_server() {
  local i="$1" ip="$SUBNET.$((1 + $1))" join=()
  if [ "$i" = 1 ]; then
    join=(--cluster-init)
  elif [ ! -d "$DIR/s$i/server/db/etcd/member" ]; then
    join=(--server "https://$SERVER_IP:$PORT" --token "$(cat "$DIR/s1/server/token")")
  fi
  rm -f "$DIR/kubeconfig-$i"
  nsenter --net="/run/netns/$(server_ns "$i")" "$KRUST" server --disable-agent \
    --bind-address "$ip" --advertise-address "$ip" --node-ip "$ip" --node-name "s$i" \
    --https-listen-port "$PORT" --data-dir "$DIR/s$i" --write-kubeconfig "$DIR/kubeconfig-$i" \
    --cluster-cidr "$CLUSTER_CIDR" --service-cidr "$SERVICE_CIDR" "${join[@]}" \
    ${MN_SERVER_ARGS:-} >>"$DIR/s$i.log" 2>&1 &
  echo $! >"$DIR/s$i.pid"
  for _ in $(seq 300); do [ -s "$DIR/kubeconfig-$i" ] && return 0; sleep 0.2; done
  echo "server $i did not start: $DIR/s$i.log" >&2
  exit 1
}

kill_server() {
  pkill -9 -f -- "--data-dir=$DIR/s$1/server/db/etcd" || true
  kill -9 "$(cat "$DIR/s$1.pid")" 2>/dev/null || true
}

up() {
  local n="${1:-3}"
  mkdir -p "$DIR"
  ip link add "$BRIDGE" type bridge 2>/dev/null || true
  ip addr replace "$SUBNET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  if [ "$SERVERS" -gt 1 ]; then
    for i in $(seq "$SERVERS"); do
      add_ns "$(server_ns "$i")" "${NAME}s$i" "$SUBNET.$((1 + i))"
      start_server "$i"
    done
    cp "$DIR/kubeconfig-1" "$DIR/kubeconfig"
    mkdir -p "$DIR/server/server"
    cp "$DIR/s1/server/token" "$DIR/server/server/token"
  else
    "$KRUST" server --disable-agent --bind-address "$SERVER_IP" --advertise-address "$SERVER_IP" \
      --node-ip "$SERVER_IP" --https-listen-port "$PORT" --data-dir "$DIR/server" \
      --write-kubeconfig "$DIR/kubeconfig" --cluster-cidr "$CLUSTER_CIDR" \
      --service-cidr "$SERVICE_CIDR" ${MN_SERVER_ARGS:-} >"$DIR/server.log" 2>&1 &
    echo $! >"$DIR/server.pid"
  fi
  for _ in $(seq 100); do [ -s "$DIR/server/server/token" ] && break; sleep 0.2; done
  [ -s "$DIR/server/server/token" ] || { echo "the server did not start: $DIR/server.log" >&2; exit 1; }
  local token
  token="$(cat "$DIR/server/server/token")"
  for i in $(seq "$n"); do
    local ns ip
    ns="$(node_ns "$i")"
    ip="$SUBNET.$((10 + i))"
    add_ns "$ns" "${NAME}n$i" "$ip"
    # No default route out of the machine; Service addresses are reached on-link
    # (the node's Service rules rewrite them before they leave).
    ip -n "$ns" route add "$SERVICE_CIDR" dev eth0
    # `nsenter`, not `ip netns exec`: the latter remounts /sys and hides the cgroups.
    nsenter --net="/run/netns/$ns" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
    nsenter --net="/run/netns/$ns" "$KRUST" agent --server "https://$SERVER_IP:$PORT" \
      --token "$token" --data-dir "$DIR/n$i" --node-name "n$i" --node-ip "$ip" \
      --cluster-cidr "$CLUSTER_CIDR" --flannel-backend "$BACKEND" ${MN_AGENT_ARGS:-} \
      >"$DIR/n$i.log" 2>&1 &
    echo $! >"$DIR/n$i.pid"
  done
  for _ in $(seq 300); do
    local ready
    ready="$(KUBECONFIG="$DIR/kubeconfig" kubectl get nodes --no-headers 2>/dev/null | grep -c ' Ready ' || true)"
    if [ "$ready" -ge "$n" ]; then
      echo "krust: $n nodes Ready; export KUBECONFIG=$DIR/kubeconfig"
      return 0
    fi
    sleep 0.2
  done
  echo "the nodes did not become Ready; logs in $DIR" >&2
  exit 1
}

down() {
  # s*.pid: server.pid and those of the HA servers.
  for pidfile in "$DIR"/n*.pid "$DIR"/s*.pid; do
    [ -f "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 1
  for node in "$DIR"/n*/; do
    [ -d "$node" ] || continue
    local runtime root
    for runtime in runc crun; do
      root="$node/agent/containerd/$runtime/k8s.io"
      [ -d "$root" ] || continue
      for id in $("$runtime" --root "$root" list -q 2>/dev/null); do
        "$runtime" --root "$root" delete --force "$id" 2>/dev/null || true
      done
    done
    pkill -KILL -f "${node%/}/agent/containerd" 2>/dev/null || true
    grep -o " ${node%/}[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  done
  # s*.pid: server.pid and those of the HA servers.
  for pidfile in "$DIR"/n*.pid "$DIR"/s*.pid; do
    [ -f "$pidfile" ] || continue
    kill -9 "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  # Servers' etcd members end with their servers; wait for them to let go of the data.
  for _ in $(seq 50); do pgrep -f -- "--data-dir=$DIR/s" >/dev/null || break; sleep 0.1; done
  pkill -9 -f -- "--data-dir=$DIR/s" 2>/dev/null || true
  ip link del "$BRIDGE" 2>/dev/null || true
  for ns in $(ip netns list | awk '{print $1}' | grep "^$NAME-[ns][0-9]" || true); do
    ip netns delete "$ns" || true
  done
  # The pods' namespaces (containerd pins them under /run/netns): those of the
  # containers removed above have no process left.
  for ns in $(ip netns list | awk '{print $1}' | grep '^cni-' || true); do
    if [ -z "$(ip netns pids "$ns" 2>/dev/null)" ]; then
      ip netns delete "$ns" 2>/dev/null || true
    fi
  done
  rm -rf "$DIR"
}

case "${1:-}" in
  up) up "${2:-3}" ;;
  down) down ;;
  kill) kill_server "$2" ;;
  start) start_server "$2" ;;
  partition) ip link set "${NAME}s$2" down ;;
  heal) ip link set "${NAME}s$2" up ;;
  *) sed -n '2,25p' "$0" >&2; exit 2 ;;
esac
