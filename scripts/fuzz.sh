#!/usr/bin/env bash
# Coverage-guided fuzzing (issue 17): builds the cargo-fuzz targets in fuzz/ and runs
# each for a while over its corpus (fuzz/corpus/<target>, started from the committed
# seeds in fuzz/seeds/<target>; the corpus itself is not committed), then prints per
# target the executions, the coverage reached and whether it crashed.
#
#   scripts/fuzz.sh [seconds per target] [target...]   (default 60 s, every target)
#   FUZZ_DEV=1: unoptimized build (the test command's short run: it builds in a few
#   minutes). Otherwise cargo-fuzz's release build, at opt-level 1: with its one
#   codegen unit, opt-level 3 took over 20 minutes for the apiserver on two cores,
#   opt-level 1 about 8, and runs the apiserver target ~20x faster than unoptimized.
#
# Runs on stable Rust: no sanitizer (the code fuzzed has no unsafe blocks; a panic, an
# internal error or a hang is the finding). A crash leaves its
# input in fuzz/artifacts/<target>/; `cargo fuzz run -s none <target> <file>` replays it.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"
seconds="${1:-60}"
shift || true
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
mode=()
[ -z "${FUZZ_DEV:-}" ] || mode=(--dev)
export CARGO_PROFILE_RELEASE_OPT_LEVEL="${CARGO_PROFILE_RELEASE_OPT_LEVEL:-1}"
cargo fuzz build -s none "${mode[@]}"
failed=0
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target" "artifacts/$target"
  log="artifacts/$target/last-run.log"
  status=ok
  cargo fuzz run -s none "${mode[@]}" "$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 \
    >"$log" 2>&1 || status=CRASHED
  runs=$(awk '/stat::number_of_executed_units/ {print $NF}' "$log")
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
  corpus=$(find "corpus/$target" -type f | wc -l)
  printf '%-20s %-8s %12s execs  %-22s corpus %s\n' "$target" "$status" "${runs:-?}" "${cov:-cov: ?}" "$corpus"
  if [ "$status" != ok ]; then
    failed=1
    grep -E 'panicked at|ERROR: libFuzzer|Test unit written' "$log" | head -5
  fi
done
exit "$failed"
