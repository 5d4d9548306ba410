#!/usr/bin/env bash
# Stops krust on this machine and everything its node left running, as k3s-killall.sh
# does: containers outlive `krust server` and `krust agent` on purpose (a restart or an
# upgrade keeps pods running), so this is how to end them. Installed as
# /usr/local/bin/krust-killall.sh by scripts/install.sh.
#
# In order: the krust services (when systemd runs them) and every krust process of the
# data dir; the node's containers (runc), shims and containerd; the pods' network
# namespaces; mounts under the data dir; the node's bridge, the VXLAN device and the
# nftables tables of the Service proxy, egress masquerade and NetworkPolicy.
#
# Settings (environment): KRUST_DATA_DIR (default /var/lib/krust), KRUST_NFT_TABLE (the
# Service proxy's table, default krust). Needs root.
set -uo pipefail

DATA_DIR="${KRUST_DATA_DIR:-/var/lib/krust}"
DATA_DIR="${DATA_DIR%/}"
NFT_TABLE="${KRUST_NFT_TABLE:-krust}"
CONTAINERD="$DATA_DIR/agent/containerd"

[ "$(id -u)" = 0 ] || { echo "krust-killall.sh must run as root" >&2; exit 1; }

if [ -d /run/systemd/system ]; then
  for unit in krust krust-agent; do
    systemctl stop "$unit" 2>/dev/null || true
  done
fi

# krust processes of this data dir: named by --data-dir, or (for the default one) by
# KRUST_DATA_DIR in their environment or no --data-dir at all.
krust_pids() {
  local pid cmdline
  for pid in $(pgrep -x krust); do
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || continue
    case "$cmdline" in
      *"--data-dir=$DATA_DIR "* | *"--data-dir $DATA_DIR "*) echo "$pid" ;;
      *--data-dir*) ;;
      *)
        if [ "$DATA_DIR" = /var/lib/krust ] ||
          tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "KRUST_DATA_DIR=$DATA_DIR"; then
          echo "$pid"
        fi
        ;;
    esac
  done
}

pids="$(krust_pids)"
if [ -n "$pids" ]; then
  kill -TERM $pids 2>/dev/null || true
  for _ in $(seq 50); do
    pids="$(krust_pids)"
    [ -z "$pids" ] && break
    sleep 0.2
  done
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
fi

# The pods' network namespaces, as their sandboxes' specs name them (read before the
# containers go, with their bundles).
namespaces="$(cat "$CONTAINERD"/state/io.containerd.runtime.v2.task/k8s.io/*/config.json 2>/dev/null |
  grep -o '"path":"/var/run/netns/[^"]*"\|"path":"/run/netns/[^"]*"' |
  sed 's/.*"\(.*\)"$/\1/; s#^/var/run/#/run/#' | sort -u)"

# The containers (under each runtime handler's root: runc's, and crun's where the node
# offered it), their shims and containerd.
for runtime in runc crun; do
  root="$CONTAINERD/$runtime/k8s.io"
  [ -d "$root" ] || continue
  for id in $("$runtime" --root "$root" list -q 2>/dev/null); do
    "$runtime" --root "$root" delete --force "$id" 2>/dev/null || true
  done
done
pkill -KILL -f "$CONTAINERD" 2>/dev/null || true

# The node's pod range, from the CNI configuration the kubelet wrote.
subnet="$(grep -o '"subnet": *"[0-9./]*"' "$CONTAINERD/net.d/"*.conflist 2>/dev/null |
  head -1 | sed 's/.*"\([0-9./]*\)"$/\1/')"
in_subnet() { # ADDRESS: whether it lies in the pod range (a /24 or wider)
  [ -n "$subnet" ] || return 1
  local net="${subnet%/*}" bits="${subnet#*/}" a b c d n1 n2 n3 n4
  IFS=. read -r a b c d <<<"$1"
  IFS=. read -r n1 n2 n3 n4 <<<"$net"
  local ip=$(((a << 24) | (b << 16) | (c << 8) | d))
  local base=$(((n1 << 24) | (n2 << 16) | (n3 << 8) | n4))
  local mask=$(((0xffffffff << (32 - bits)) & 0xffffffff))
  [ $((ip & mask)) = $((base & mask)) ]
}

# Namespaces of pods whose task is gone but whose address says they were this node's.
for ns in $(ls /run/netns 2>/dev/null); do
  for addr in $(ip -n "$ns" -4 -o addr show 2>/dev/null | awk '{print $4}' | cut -d/ -f1); do
    if in_subnet "$addr"; then
      namespaces="$namespaces /run/netns/$ns"
      break
    fi
  done
done
for ns in $namespaces; do
  ip netns delete "$(basename "$ns")" 2>/dev/null || { umount "$ns" 2>/dev/null; rm -f "$ns"; }
done

# Mounts under the data dir, deepest first.
awk -v dir="$DATA_DIR/" 'index($2, dir) == 1 {print $2}' /proc/self/mounts | sort -r |
  while read -r target; do umount -l "$target" 2>/dev/null || true; done

# The node's bridge (the one holding the range's first address) names its tables.
if [ -n "$subnet" ]; then
  gateway="$(echo "${subnet%/*}" | awk -F. '{printf "%d.%d.%d.%d", $1, $2, $3, $4 + 1}')"
  bridge="$(ip -4 -o addr show | awk -v gw="$gateway" 'index($4, gw "/") == 1 {print $2}' | head -1)"
  if [ -n "$bridge" ] && [ "${bridge#krust}" != "$bridge" ]; then
    tag="${bridge#krust}"
    ip link delete "$bridge" 2>/dev/null || true
    nft delete table ip "krust-egress-$tag" 2>/dev/null || true
    nft delete table ip "krust-policy-$tag" 2>/dev/null || true
  fi
fi
# The VXLAN device, when it carries this node's range (its `.0` address) and no other
# node's (several nodes may share this network namespace).
vxlan_addrs="$(ip -4 -o addr show dev flannel.1 2>/dev/null | awk '{print $4}' | cut -d/ -f1)"
if [ -n "$vxlan_addrs" ]; then
  ours=true
  for addr in $vxlan_addrs; do in_subnet "$addr" || ours=false; done
  [ "$ours" = true ] && ip link delete flannel.1 2>/dev/null
fi
nft delete table ip "$NFT_TABLE" 2>/dev/null || true
exit 0
