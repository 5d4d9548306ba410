#!/usr/bin/env bash
# Soak (issue 17): steady churn against `krust server` with its node — ConfigMaps
# created, updated and deleted, a Deployment scaled between 0 and 4 (pods start and
# stop), Jobs run, watches opened and closed — for a while, sampling every SOAK_EVERY
# seconds the server's resident memory, open files, live async tasks (its /metrics)
# and store size into a CSV. At the end it prints the first, last and largest value of
# each column and a chart of each over time, to see that none grows without bound.
#
#   scripts/soak.sh [minutes]   (default 60; needs root; target/debug/krust unless KRUST)
#   SOAK_DIR (default a new /tmp/krust-soak.*), SOAK_PORT (16543), SOAK_EVERY (30),
#   SOAK_EVENT_TTL (10m: Events expire after it, so an hour's run shows the store level
#   off; the server's default is upstream's 1h)
set -euo pipefail

minutes="${1:-60}"
here="$(cd "$(dirname "$0")" && pwd)"
krust="${KRUST:-$here/../target/debug/krust}"
dir="${SOAK_DIR:-$(mktemp -d /tmp/krust-soak.XXXXXX)}"
port="${SOAK_PORT:-16543}"
every="${SOAK_EVERY:-30}"
event_ttl="${SOAK_EVENT_TTL:-10m}"
mkdir -p "$dir"
export KUBECONFIG="$dir/kubeconfig"
csv="$dir/samples.csv"

"$krust" server --data-dir "$dir/data" --https-listen-port "$port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 \
  --write-kubeconfig "$KUBECONFIG" --kubelet-port 0 --cluster-cidr 10.96.0.0/16 \
  --nftables-table krust-soak --eviction-hard 'memory.available<100Mi' \
  --dns-port 15353 --ingress-http-port 18080 --ingress-https-port 18443 --event-ttl "$event_ttl" \
  >"$dir/server.log" 2>&1 &
server=$!
churners=()
cleanup() {
  for pid in "${churners[@]}"; do kill "$pid" 2>/dev/null || true; done
  kubectl delete deploy/soak --wait=true --timeout=60s >/dev/null 2>&1 || true
  kill -TERM "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  nft delete table ip krust-soak 2>/dev/null || true
}
trap cleanup EXIT
until kubectl get --raw /readyz >/dev/null 2>&1; do sleep 0.5; done
until kubectl get nodes 2>/dev/null | grep -q ' Ready'; do sleep 0.5; done

tls="$dir/data/server/tls"
metric() { # name: the value of an unlabelled sample of the server's /metrics
  curl -s --cacert "$tls/ca.crt" --cert "$tls/admin.crt" --key "$tls/admin.key" \
    "https://127.0.0.1:$port/metrics" | awk -v n="$1" '$1 == n {print $2; exit}'
}

kubectl create deployment soak --image=busybox --replicas=0 -- sleep 3600 >/dev/null
# ConfigMaps: create, update, delete, a hundred at a time.
( i=0; while true; do
    for n in $(seq 0 99); do kubectl create configmap "cm-$n" --from-literal=i="$i" >/dev/null 2>&1 || true; done
    for n in $(seq 0 99); do kubectl patch configmap "cm-$n" -p "{\"data\":{\"i\":\"u$i\"}}" >/dev/null 2>&1 || true; done
    kubectl delete configmaps --all --wait=false >/dev/null 2>&1 || true
    i=$((i + 1))
  done ) & churners+=($!)
# Pods: the Deployment up to 4 and down to 0, and a Job, every 20 s.
( i=0; while true; do
    kubectl scale deploy/soak --replicas=$(( (i % 2) * 4 )) >/dev/null 2>&1 || true
    kubectl create job "job-$i" --image=busybox -- true >/dev/null 2>&1 || true
    kubectl delete job "job-$((i - 3))" --wait=false >/dev/null 2>&1 || true
    i=$((i + 1)); sleep 20
  done ) & churners+=($!)
# Watches that come and go.
( while true; do timeout 15 kubectl get configmaps,pods -w >/dev/null 2>&1 || true; done ) & churners+=($!)

echo "minute,rss_mib,open_fds,tasks,store_mib" >"$csv"
start=$(date +%s)
end=$((start + minutes * 60))
while [ "$(date +%s)" -lt "$end" ]; do
  sleep "$every"
  rss=$(metric process_resident_memory_bytes)
  fds=$(metric process_open_fds)
  tasks=$(metric tokio_alive_tasks)
  store=$(du -sk "$dir/data/server/db" | awk '{print $1}')
  awk -v t=$(( $(date +%s) - start )) -v r="$rss" -v f="$fds" -v k="$tasks" -v s="$store" \
    'BEGIN { printf "%.1f,%.1f,%d,%d,%.1f\n", t / 60, r / 1048576, f, k, s / 1024 }' >>"$csv"
done

echo "samples: $csv"
awk -F, 'NR == 1 { for (i = 2; i <= NF; i++) name[i] = $i; next }
  { for (i = 2; i <= NF; i++) { if (NR == 2) first[i] = $i; last[i] = $i; if ($i > max[i]) max[i] = $i } }
  END { printf "%-10s %10s %10s %10s\n", "", "first", "last", "max";
        for (i = 2; i in name; i++) printf "%-10s %10s %10s %10s\n", name[i], first[i], last[i], max[i] }' "$csv"
# A chart per column: one row per sample, the bar scaled to the column's largest value.
for col in 2 3 4 5; do
  awk -F, -v c="$col" 'NR == 1 { title = $c; next } { t[NR] = $1; v[NR] = $c; if ($c > m) m = $c }
    END { print "\n" title " over minutes:"; for (i = 2; i <= NR; i++) {
            bar = ""; n = (m > 0) ? int(40 * v[i] / m) : 0; for (j = 0; j < n; j++) bar = bar "#";
            printf "%6s %-40s %s\n", t[i], bar, v[i] } }' "$csv"
done
