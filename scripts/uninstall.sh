#!/usr/bin/env bash
# Removes krust from this machine, as k3s-uninstall.sh does: everything krust-killall.sh
# ends, then the units, the binary and these scripts, the admin kubeconfig and the data
# dir (the store, certificates, images, volumes). Installed as
# /usr/local/bin/krust-uninstall.sh by scripts/install.sh.
#
# Settings (environment): KRUST_DATA_DIR (default /var/lib/krust),
# INSTALL_KRUST_BIN_DIR (default /usr/local/bin), INSTALL_KRUST_SYSTEMD_DIR (default
# /etc/systemd/system), KRUST_CONFIG_DIR (default /etc/krust). Needs root.
set -euo pipefail

DATA_DIR="${KRUST_DATA_DIR:-/var/lib/krust}"
BIN_DIR="${INSTALL_KRUST_BIN_DIR:-/usr/local/bin}"
SYSTEMD_DIR="${INSTALL_KRUST_SYSTEMD_DIR:-/etc/systemd/system}"
CONFIG_DIR="${KRUST_CONFIG_DIR:-/etc/krust}"

[ "$(id -u)" = 0 ] || { echo "krust-uninstall.sh must run as root" >&2; exit 1; }

killall="$BIN_DIR/krust-killall.sh"
[ -x "$killall" ] || killall="$(dirname "$0")/killall.sh"
KRUST_DATA_DIR="$DATA_DIR" "$killall"

for unit in krust krust-agent; do
  if [ -d /run/systemd/system ]; then
    systemctl disable "$unit" 2>/dev/null || true
  fi
  rm -f "$SYSTEMD_DIR/$unit.service" "$SYSTEMD_DIR/$unit.service.env"
done
[ -d /run/systemd/system ] && systemctl daemon-reload
rm -rf "$DATA_DIR" "$CONFIG_DIR"
rm -f "$BIN_DIR/krust" "$BIN_DIR/krust-killall.sh" "$BIN_DIR/krust-uninstall.sh"
echo "krust removed"
