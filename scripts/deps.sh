#!/usr/bin/env bash
# Installs what krust needs to build, run and test on Debian, if it is missing.
# Safe to run again: it only installs what is not there.
set -euo pipefail

need_apt=()
have() { command -v "$1" >/dev/null 2>&1; }
have curl || need_apt+=(curl)
have gcc || need_apt+=(gcc)
# static glibc: the network policy tests build a static pod program
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need_apt+=(libc6-dev)
have git || need_apt+=(git)
[ -e /usr/share/doc/ca-certificates ] || need_apt+=(ca-certificates)
have kubectl || need_apt+=(kubectl)
# protoc builds the etcd and CRI gRPC clients; etcd backs the etcd-backend tests.
have protoc || need_apt+=(protobuf-compiler)
have etcd || need_apt+=(etcd-server)
# etcdctl reads the raw etcd keys in the encryption-at-rest tests.
have etcdctl || need_apt+=(etcd-client)
# The node: containerd + runc (or crun) run containers, the CNI plugins wire pods, busybox-static
# makes the locally built images, nftables carries Service rules.
have containerd || need_apt+=(containerd)
have runc || need_apt+=(runc)
# crun is the second runtime handler RuntimeClasses can name.
have crun || need_apt+=(crun)
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
dpkg -s busybox-static >/dev/null 2>&1 || need_apt+=(busybox-static)
have nft || need_apt+=(nftables)
# The install test checks krust's systemd units with systemd's own verifier.
have systemd-analyze || need_apt+=(systemd)
# The Ingress TLS test makes its certificates with openssl.
have openssl || need_apt+=(openssl)
# The CNI portmap plugin (hostPort) programs iptables.
have iptables || need_apt+=(iptables)
# The pod network across nodes drives ip and bridge (iproute2); the multi-node harness
# enters node namespaces with nsenter (util-linux).
{ have ip && have bridge; } || need_apt+=(iproute2)
have nsenter || need_apt+=(util-linux)
# The hostile-client tests hold raw TLS connections open with openssl s_client.
have openssl || need_apt+=(openssl)
# The registry tests run Debian's registry (distribution 2.8) with htpasswd auth
# (apache2-utils) and push their images with skopeo.
have docker-registry || need_apt+=(docker-registry)
have skopeo || need_apt+=(skopeo)
have htpasswd || need_apt+=(apache2-utils)
# The official Python client, which the tests drive too (Debian's python3).
/usr/bin/python3 -c 'import kubernetes' >/dev/null 2>&1 || need_apt+=(python3-kubernetes)

if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  for pkg in "${need_apt[@]}"; do
    if [ "$pkg" = kubectl ]; then
      # kubectl is not in Debian; use the upstream apt repository.
      if ! apt-cache show kubectl >/dev/null 2>&1; then
        apt-get install -y -qq apt-transport-https gpg curl ca-certificates
        curl -fsSL https://pkgs.k8s.io/core:/stable:/v1.32/deb/Release.key | gpg --dearmor -o /usr/share/keyrings/kubernetes-apt-keyring.gpg
        echo 'deb [signed-by=/usr/share/keyrings/kubernetes-apt-keyring.gpg] https://pkgs.k8s.io/core:/stable:/v1.32/deb/ /' > /etc/apt/sources.list.d/kubernetes.list
        apt-get update -qq
      fi
    fi
    apt-get install -y -qq "$pkg"
  done
  # Debian starts the packaged etcd and registry as services; the tests start their own.
  if command -v systemctl >/dev/null 2>&1; then
    [[ " ${need_apt[*]} " == *" etcd-server "* ]] && systemctl disable --now etcd >/dev/null 2>&1
    [[ " ${need_apt[*]} " == *" docker-registry "* ]] && systemctl disable --now docker-registry >/dev/null 2>&1
    true
  fi
fi

if ! have cargo; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    curl -fsSL https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked cargo-nextest
fi

# crun refuses to run on a hybrid cgroup host whose cgroup2 hierarchy still holds
# controllers (these VMs leave hugetlb there). The agent gives each such controller a v1
# hierarchy when it starts containerd; doing it here, before any test, keeps that from
# happening under the containers of agents already running.
if [ -r /sys/fs/cgroup/unified/cgroup.controllers ]; then
  for controller in $(cat /sys/fs/cgroup/unified/cgroup.controllers); do
    mkdir -p "/sys/fs/cgroup/$controller"
    mount -t cgroup -o "$controller" cgroup "/sys/fs/cgroup/$controller" || true
  done
fi
