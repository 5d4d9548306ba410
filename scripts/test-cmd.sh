#!/usr/bin/env bash
# Upstream kubectl's own command-line suite (test/cmd, through a runner that is not part
# of this repository: pass its run.sh) against krust, as upstream runs it: with the
# static token `admin-token` (user admin in system:masters) that the suite's
# authorization, swagger and exec-credential tests present, which a runner starting a
# plain `krust server` would not accept. Everything after RUNNER goes to it; its
# environment (TEST_CMD_ONLY, TEST_CMD_OUT, ...) is passed through.
#
#   scripts/test-cmd.sh RUNNER [args]   (krust: target/release/krust unless KRUST_BIN)
set -euo pipefail

runner="$(cd "$(dirname "${1:?usage: $0 RUNNER [args]}")" && pwd)/$(basename "$1")"
shift
root="$(cd "$(dirname "$0")/.." && pwd)"
krust="${KRUST_BIN:-$root/target/release/krust}"
[ -x "$krust" ] || { echo "no krust binary at $krust (cargo build --release)"; exit 1; }
dir="$(mktemp -d /tmp/krust-test-cmd.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
printf 'admin-token,admin,admin,"system:masters"\n' >"$dir/tokens.csv"
# The runner starts `$KRUST_BIN server ...`: this stand-in adds the token file.
cat >"$dir/krust" <<WRAPPER
#!/bin/sh
if [ "\$1" = server ]; then
  shift
  exec "$krust" server --token-auth-file "$dir/tokens.csv" "\$@"
fi
exec "$krust" "\$@"
WRAPPER
chmod +x "$dir/krust"
cd "$root"
KRUST_BIN="$dir/krust" bash "$runner" "$@"
