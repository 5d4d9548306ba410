#!/usr/bin/env bash
# The official Python client's own e2e suite (kubernetes-client/python's
# `kubernetes/e2e_test`) against a fresh `krust server` with its node. The suite is in no
# package: bring a checkout in by hand and never commit it. The checkout's own client is
# what runs (pytest puts the checkout first on the path); a virtualenv under target/
# with the client from PyPI (SUITE_CLIENT, default 37.*) brings its dependencies.
#
#   scripts/python-suite.sh CHECKOUT [pytest args]   (needs root; target/debug/krust
#                                                    unless KRUST)
#
# Two of its tests run pods of the `python` and `nginx` images, which an offline
# machine cannot pull; this script builds local stand-ins into the node's airgap images
# directory before the server starts: `python`, Debian's own python3 with its standard
# library, and `nginx`, busybox's httpd serving nginx's welcome page on port 80.
set -euo pipefail

src="$(cd "${1:?usage: $0 CHECKOUT [pytest args]}" && pwd)"
shift
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/.."
krust="${KRUST:-$root/target/debug/krust}"
venv="$root/target/python-suite/venv"
dir="$(mktemp -d /tmp/krust-python-suite.XXXXXX)"
port="${SUITE_PORT:-16643}"
images="$dir/data/agent/images"
export KUBECONFIG="$dir/kubeconfig"

if [ ! -x "$venv/bin/pytest" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "kubernetes==${SUITE_CLIENT:-37.*}" pytest
fi

# A docker-archive image from a root directory: image REFERENCE ROOTFS OUT ENTRYPOINT...
image() {
  /usr/bin/python3 - "$@" <<'EOF'
import hashlib, io, json, sys, tarfile
reference, rootfs, out, *entrypoint = sys.argv[1:]
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w") as t:
    t.add(rootfs, arcname=".")
layer = layer.getvalue()
layer_id = hashlib.sha256(layer).hexdigest()
config = json.dumps({
    "architecture": "amd64", "os": "linux",
    "config": {"Entrypoint": entrypoint,
               "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer_id]},
}).encode()
config_id = hashlib.sha256(config).hexdigest()
manifest = json.dumps([{"Config": config_id + ".json", "RepoTags": [reference],
                        "Layers": [layer_id + "/layer.tar"]}]).encode()
with tarfile.open(out, mode="w") as t:
    for name, data in [(layer_id + "/layer.tar", layer), (config_id + ".json", config),
                       ("manifest.json", manifest)]:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
EOF
}

# Copies a binary and the shared libraries it loads into ROOTFS.
with_libraries() { # ROOTFS BINARY
  cp --parents -L "$2" "$1"
  ldd "$2" | grep -o '/[^ ]*' | while read -r lib; do cp --parents -L "$lib" "$1"; done
}

mkdir -p "$images"
python="$(readlink -f /usr/bin/python3)"
rootfs="$dir/rootfs-python"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/usr/lib" "$rootfs/tmp"
with_libraries "$rootfs" "$python"
cp -a "/usr/lib/$(basename "$python")" "$rootfs/usr/lib/"
rm -rf "$rootfs/usr/lib/$(basename "$python")/test"
ln -s "$python" "$rootfs/usr/local/bin/python"
ln -s "$python" "$rootfs/usr/local/bin/python3"
image docker.io/library/python:latest "$rootfs" "$images/python.tar" python3

rootfs="$dir/rootfs-nginx"
mkdir -p "$rootfs/bin" "$rootfs/usr/share/nginx/html"
cp /usr/bin/busybox "$rootfs/bin/busybox"
ln -s busybox "$rootfs/bin/sh"
cat >"$rootfs/usr/share/nginx/html/index.html" <<'EOF'
<!DOCTYPE html>
<html>
<head><title>Welcome to nginx!</title></head>
<body>
<h1>Welcome to nginx!</h1>
<p>A stand-in for the nginx image: busybox httpd, built by krust's scripts/python-suite.sh.</p>
</body>
</html>
EOF
image docker.io/library/nginx:latest "$rootfs" "$images/nginx.tar" \
  /bin/busybox httpd -f -p 80 -h /usr/share/nginx/html
rm -rf "$dir"/rootfs-*

"$krust" server --data-dir "$dir/data" --https-listen-port "$port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 \
  --write-kubeconfig "$KUBECONFIG" --kubelet-port 0 --cluster-cidr 10.60.0.0/16 \
  --nftables-table krust-python-suite --eviction-hard 'memory.available<100Mi' \
  --dns-port 15354 --ingress-http-port 18081 --ingress-https-port 18444 --controller-manager-metrics-address 0 \
  --scheduler-metrics-address 0 --proxy-metrics-address 0 --dns-metrics-address 0 \
  --ingress-metrics-address 0 >"$dir/server.log" 2>&1 &
server=$!
cleanup() {
  # krust leaves pods running when it stops (as k3s does): delete them first, so that
  # no pod keeps an address the next run's node would hand out again.
  kubectl delete deploy,ds,sts,rs,rc,jobs,cronjobs --all -A --wait=false >/dev/null 2>&1 || true
  kubectl delete pods --all -A --grace-period=1 --timeout=120s >/dev/null 2>&1 || true
  kill -TERM "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  nft delete table ip krust-python-suite 2>/dev/null || true
  echo "server log and data: $dir"
}
trap cleanup EXIT
until kubectl get --raw /readyz >/dev/null 2>&1; do sleep 0.5; done
until kubectl get nodes 2>/dev/null | grep -q ' Ready'; do sleep 0.5; done

# From the checkout's root: the suite reads its YAML files by relative path.
cd "$src"
"$venv/bin/pytest" kubernetes/e2e_test "$@"
