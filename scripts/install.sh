#!/usr/bin/env bash
# Installs krust as a service, as k3s's install script does: the binary in
# /usr/local/bin, a systemd unit (`krust.service` for a server, `krust-agent.service`
# for an agent) that restarts on failure and leaves containers running when krust stops
# or is upgraded (`KillMode=process`, `Delegate=yes`), and krust-killall.sh and
# krust-uninstall.sh beside the binary.
#
#   scripts/install.sh                                    a server
#   INSTALL_KRUST_EXEC="server --cluster-init" scripts/install.sh
#   KRUST_URL=https://10.0.0.1:6443 KRUST_TOKEN=K10... scripts/install.sh   an agent
#
# Settings (environment, k3s's names with KRUST for K3S):
#   INSTALL_KRUST_EXEC        the command and its flags (default `server`, or `agent`
#                             when KRUST_URL is set)
#   KRUST_URL, KRUST_TOKEN    the server to join and the token (kept in the unit's
#                             environment file, readable by root only)
#   INSTALL_KRUST_BIN         the binary to install (default target/release/krust of
#                             this checkout, else krust on PATH)
#   INSTALL_KRUST_BIN_DIR     where it goes (default /usr/local/bin)
#   INSTALL_KRUST_SYSTEMD_DIR where the unit goes (default /etc/systemd/system)
#   INSTALL_KRUST_SKIP_ENABLE, INSTALL_KRUST_SKIP_START   true to leave the unit alone
# An upgrade is the same command with a new binary: the service restarts on it and
# keeps every object and running pod. Where systemd is not PID 1 the unit is written,
# checked, and nothing is started. Needs root.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
BIN_DIR="${INSTALL_KRUST_BIN_DIR:-/usr/local/bin}"
SYSTEMD_DIR="${INSTALL_KRUST_SYSTEMD_DIR:-/etc/systemd/system}"
BIN="${INSTALL_KRUST_BIN:-$here/../target/release/krust}"
[ -x "$BIN" ] || BIN="$(command -v krust || true)"
[ -x "$BIN" ] || { echo "no krust binary: build it (cargo build --release) or set INSTALL_KRUST_BIN" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "install.sh must run as root" >&2; exit 1; }

if [ -n "${INSTALL_KRUST_EXEC:-}" ]; then
  EXEC="$INSTALL_KRUST_EXEC"
elif [ -n "${KRUST_URL:-}" ]; then
  EXEC="agent"
else
  EXEC="server"
fi
case "$EXEC" in
  server*) UNIT=krust ;;
  agent*) UNIT=krust-agent ;;
  *) echo "INSTALL_KRUST_EXEC must start with server or agent: $EXEC" >&2; exit 1 ;;
esac
if [ "$UNIT" = krust-agent ] && { [ -z "${KRUST_URL:-}" ] || [ -z "${KRUST_TOKEN:-}" ]; }; then
  echo "an agent needs KRUST_URL and KRUST_TOKEN" >&2
  exit 1
fi

# The binary, replaced in one rename so a running service never sees half of it.
mkdir -p "$BIN_DIR" "$SYSTEMD_DIR"
if [ "$(readlink -f "$BIN")" != "$(readlink -f "$BIN_DIR/krust" 2>/dev/null || true)" ]; then
  install -m 0755 "$BIN" "$BIN_DIR/krust.new"
  mv -f "$BIN_DIR/krust.new" "$BIN_DIR/krust"
fi
install -m 0755 "$here/killall.sh" "$BIN_DIR/krust-killall.sh"
install -m 0755 "$here/uninstall.sh" "$BIN_DIR/krust-uninstall.sh"

env_file="$SYSTEMD_DIR/$UNIT.service.env"
umask 077
{
  [ -n "${KRUST_URL:-}" ] && echo "KRUST_URL=$KRUST_URL"
  [ -n "${KRUST_TOKEN:-}" ] && echo "KRUST_TOKEN=$KRUST_TOKEN"
  true
} >"$env_file"
umask 022

cat >"$SYSTEMD_DIR/$UNIT.service" <<UNIT
[Unit]
Description=krust, a Kubernetes-compatible orchestrator in one binary
Wants=network-online.target
After=network-online.target

[Install]
WantedBy=multi-user.target

[Service]
Type=exec
EnvironmentFile=-$env_file
# Containers run under their shims in the unit's cgroup: stopping or restarting krust
# (an upgrade) stops only krust itself, as k3s's unit does.
KillMode=process
Delegate=yes
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
TimeoutStartSec=0
Restart=always
RestartSec=5s
ExecStartPre=-/sbin/modprobe br_netfilter
ExecStartPre=-/sbin/modprobe overlay
ExecStart=$BIN_DIR/krust $EXEC
UNIT

if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify "$SYSTEMD_DIR/$UNIT.service"
fi

if [ ! -d /run/systemd/system ]; then
  echo "systemd is not running here (PID 1 is $(ps -p 1 -o comm=)): $SYSTEMD_DIR/$UNIT.service is written and nothing was started; run '$BIN_DIR/krust $EXEC' yourself"
  exit 0
fi
systemctl daemon-reload
[ "${INSTALL_KRUST_SKIP_ENABLE:-false}" = true ] || systemctl enable "$UNIT"
if [ "${INSTALL_KRUST_SKIP_START:-false}" != true ]; then
  systemctl restart "$UNIT"
  echo "krust started: $UNIT.service"
fi
