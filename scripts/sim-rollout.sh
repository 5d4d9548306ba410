#!/bin/sh
# Usage: scripts/sim-rollout.sh NODES REPLICAS (after `cargo build --release -p krust
# --bins`): a release krust server without a node agent, `krust sim` with NODES nodes,
# then a Deployment of REPLICAS pods; prints seconds since the create and readyReplicas
# once a second, then the RSS (KiB) and CPU time of the server and the sim.
set -e
N=${1:-1000}; R=${2:-10000}
D=${TMPDIR:-/tmp}/krust-sim-rollout; rm -rf $D; mkdir -p $D
K=$(dirname "$0")/../target/release/krust
$K server --disable-agent --disable-dns --disable-ingress --node-cidr-mask-size 26 \
  --https-listen-port 18443 --bind-address 127.0.0.1 --advertise-address 127.0.0.1 \
  --data-dir $D/data --write-kubeconfig $D/kc > $D/server.log 2>&1 &
echo $! > $D/server.pid
sleep 3
$K sim --kubeconfig $D/kc --nodes $N > $D/sim.log 2>&1 &
echo $! > $D/sim.pid
export KUBECONFIG=$D/kc
until [ "$(kubectl get nodes --no-headers 2>/dev/null | grep -c ' Ready ')" -ge "$N" ]; do sleep 1; done
echo "nodes ready: $(date +%s.%N)"
start=$(date +%s.%N)
kubectl create deployment web --image=busybox --replicas=$R >/dev/null
while :; do
  r=$(kubectl get deploy web -o jsonpath='{.status.readyReplicas}' 2>/dev/null)
  now=$(date +%s.%N)
  echo "$(echo "$now $start" | awk '{printf "%.1f", $1 - $2}') ${r:-0}"
  [ "${r:-0}" -ge "$R" ] && break
  sleep 1
done
ps -o rss=,time=,cmd= -p $(cat $D/server.pid) -p $(cat $D/sim.pid) | cut -c1-80
kill $(cat $D/sim.pid) $(cat $D/server.pid)
