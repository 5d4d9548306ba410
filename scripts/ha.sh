#!/usr/bin/env bash
# A highly available krust on one machine: three servers, each in a network namespace
# of its own with an etcd member (the first with `--cluster-init`, the others joining
# it with its token), and N agents in namespaces of their own; scripts/multinode.sh with
# MN_SERVERS=3.
#
#   scripts/ha.sh up [N]         three servers and N agents (default 1)
#   scripts/ha.sh kill I         server I's machine lost: its etcd member and server SIGKILLed
#   scripts/ha.sh start I        server I started again on its data
#   scripts/ha.sh partition I    server I cut off the network; `heal I` joins it again
#   scripts/ha.sh down           everything stopped and removed
#
# Server I answers at https://10.99.9.(1+I):6443 (MN_SUBNET moves it); its kubeconfig is
# $MN_DIR/kubeconfig-I (MN_DIR default /tmp/krust-ha). Needs root.
set -euo pipefail
export MN_SERVERS=3 MN_NAME="${MN_NAME:-ha}" MN_DIR="${MN_DIR:-/tmp/krust-ha}"
export MN_SUBNET="${MN_SUBNET:-10.99.9}"
if [ "${1:-}" = up ] && [ -z "${2:-}" ]; then set -- up 1; fi
exec "$(dirname "$0")/multinode.sh" "$@"
