#!/usr/bin/env bash
# scripts/bench.sh — rain's benchmarks, each beside its baseline in one run.
#
#   scripts/bench.sh            every section
#   scripts/bench.sh idgen      grant serials: Next vs one Redis INCR per ID
#
# Needs redis-server on PATH (scripts/test.sh installs it). The Go benchmarks
# start their own redis-server processes on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."

sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(idgen)

bench_idgen() {
  echo "== idgen: go test -run x -bench . -benchtime 2s ./internal/idgen"
  local out
  out=$(go test -run x -bench . -benchtime 2s ./internal/idgen | tee /dev/stderr | grep '^Benchmark')
  local next incr
  next=$(awk '$1 ~ /^BenchmarkNext-/ {print $3}' <<<"$out")
  incr=$(awk '$1 ~ /^BenchmarkIncr-/ {print $3}' <<<"$out")
  awk -v n="$next" -v i="$incr" 'BEGIN {
    printf "idgen: Next %.2f ns/op, INCR baseline %.0f ns/op: Next is %.0fx faster (target <= 25 ns/op)\n", n, i, i / n }'
}

for s in "${sections[@]}"; do
  case "$s" in
    idgen) bench_idgen ;;
    *) echo "bench.sh: unknown section $s (have: idgen)" >&2; exit 2 ;;
  esac
done
