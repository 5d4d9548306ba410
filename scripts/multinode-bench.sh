#!/usr/bin/env bash
# Multi-node figures on one machine (issue 16's benchmarks): how long `multinode.sh up`
# takes until every node is Ready, and pod-to-pod throughput and latency across two
# nodes against the same pair on one node, for each backend (vxlan, host-gw).
# Throughput: 512 MiB through busybox nc; latency: busybox ping, 20 packets.
#
#   scripts/multinode-bench.sh          (needs root; uses target/debug/krust unless KRUST)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
export MN_NAME=mnb MN_SUBNET=10.99.40 MN_DIR=/tmp/krust-multinode-bench
export MN_AGENT_ARGS="${MN_AGENT_ARGS:---eviction-hard=memory.available<100Mi}"
kc() { KUBECONFIG="$MN_DIR/kubeconfig" kubectl "$@"; }
trap '"$here/multinode.sh" down >/dev/null 2>&1 || true' EXIT

pod() { # name node
  kc run "$1" --image=busybox --restart=Never \
    --overrides="{\"spec\":{\"nodeName\":\"$2\"}}" -- sleep 3600 >/dev/null
}

throughput() { # from to-ip: MiB/s
  kc exec "$2" -- sh -c 'nc -l -p 5001 > /dev/null' &
  local server=$!
  sleep 1
  local start end
  start=$(date +%s.%N)
  kc exec "$1" -- sh -c "dd if=/dev/zero bs=1M count=512 2>/dev/null | nc $3 5001"
  end=$(date +%s.%N)
  wait "$server" || true
  echo "scale=1; 512 / ($end - $start)" | bc
}

latency() { # from to-ip: average RTT in ms
  kc exec "$1" -- ping -c 20 -i 0.2 -q "$2" | awk -F/ '/avg/ {print $4}'
}

for backend in vxlan host-gw; do
  export MN_BACKEND=$backend
  "$here/multinode.sh" down >/dev/null 2>&1 || true
  start=$(date +%s.%N)
  "$here/multinode.sh" up 2 >/dev/null
  ready=$(echo "$(date +%s.%N) - $start" | bc)
  pod a n1; pod b n1; pod c n2
  kc wait --for=condition=Ready pod/a pod/b pod/c --timeout=60s >/dev/null
  ip_b=$(kc get pod b -o jsonpath='{.status.podIP}')
  ip_c=$(kc get pod c -o jsonpath='{.status.podIP}')
  same_tp=$(throughput a b "$ip_b")
  cross_tp=$(throughput a c "$ip_c")
  same_rtt=$(latency a "$ip_b")
  cross_rtt=$(latency a "$ip_c")
  printf '%-8s server + 2 nodes Ready in %.1f s | same node: %s MiB/s, %s ms | across nodes: %s MiB/s, %s ms | throughput ratio %s\n' \
    "$backend" "$ready" "$same_tp" "$same_rtt" "$cross_tp" "$cross_rtt" \
    "$(echo "scale=2; $cross_tp / $same_tp" | bc)"
done
