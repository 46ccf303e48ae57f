#!/usr/bin/env bash
# scripts/bench.sh — rain's benchmarks, each beside its baseline in one run.
#
#   scripts/bench.sh            every section
#   scripts/bench.sh idgen      grant serials: Next vs one Redis INCR per ID
#   scripts/bench.sh ring       shard ring Lookup (jump table) vs a plain sort.Search
#   scripts/bench.sh preload    1,000,000 packets into 8 sub-pools on 4 shards vs bare RPUSH
#   scripts/bench.sh grab       POST /grab over HTTP: rain on 4 shards vs the baseline
#                               (loadtest/baseline: one handler, one EVALSHA, one Redis)
#
# grab reads from the environment: DURATION (10s), CONNS (64), THREADS (2) for wrk;
# ROUNDS (1) measured runs per target, alternating which goes first, medians reported;
# WARMUP (2s, 0 for none) of unmeasured load before each run; REPEAT (0.2) share of
# requests from a user who already grabbed; PACKETS (2000000) and TOTAL_CENTS
# (200000000) per preloaded pool. For example:
#
#   DURATION=30s CONNS=128 ROUNDS=3 scripts/bench.sh grab
#
# Needs redis-server on PATH (scripts/test.sh installs it); grab also needs wrk and
# curl (Debian/Ubuntu: apt-get install -y wrk curl). The Go benchmarks start their
# own redis-server processes on free ports; so does grab, and everything it starts
# listens on 127.0.0.1 only and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(idgen ring preload grab)

# Processes and directories that sections start and make; cleanup stops and
# removes them on any exit (normal, error, Ctrl-C).
started=()
scratch=()
cleanup() {
  local p i
  for p in ${started[@]+"${started[@]}"}; do kill -TERM "$p" 2>/dev/null || true; done
  for p in ${started[@]+"${started[@]}"}; do
    # Give servers 5 s to shut down gracefully, then kill them.
    for ((i = 0; i < 50; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  started=()
  for p in ${scratch[@]+"${scratch[@]}"}; do rm -rf "$p"; done
  scratch=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bench_idgen() {
  echo "== idgen: go test -run x -bench . -benchtime 2s ./internal/idgen"
  local out
  # (Not tee /dev/stderr: with stderr sent to a file, that reopens the file at
  # offset 0 and overwrites what is there.)
  out=$(go test -run x -bench . -benchtime 2s ./internal/idgen | grep '^Benchmark')
  echo "$out"
  local next incr
  next=$(awk '$1 ~ /^BenchmarkNext-/ {print $3}' <<<"$out")
  incr=$(awk '$1 ~ /^BenchmarkIncr-/ {print $3}' <<<"$out")
  awk -v n="$next" -v i="$incr" 'BEGIN {
    printf "idgen: Next %.2f ns/op, INCR baseline %.0f ns/op: Next is %.0fx faster (target <= 25 ns/op)\n", n, i, i / n }'
}

bench_ring() {
  echo "== ring: go test -run x -bench . -benchmem ./internal/shard"
  go test -run x -bench . -benchmem ./internal/shard | grep -E '^Benchmark'
}

bench_preload() {
  echo "== preload: go test -run x -bench Preload -benchtime 5x ./internal/grab"
  go test -run x -bench Preload -benchtime 5x ./internal/grab | grep -E '^Benchmark'
}

# free_port VAR sets VAR to a TCP port on 127.0.0.1 that nothing listens on, below
# the usual ephemeral range and not handed out before in this run. (It sets a
# variable rather than printing: $(...) would run it in a subshell that forgets
# taken_ports.) Someone may take the port before we bind it; wait_port then fails
# loudly rather than measuring the wrong thing.
taken_ports=" "
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 12000))
    [[ $taken_ports == *" $p "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      taken_ports+="$p "
      printf -v "$1" %d "$p"
      return
    fi
  done
}

# wait_port PID PORT NAME LOG: until PORT accepts connections; fails if PID dies
# or 20 s pass.
wait_port() {
  local pid=$1 port=$2 name=$3 log=$4 i
  for ((i = 0; i < 200; i++)); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "bench.sh: $name exited before listening on $port; its log:" >&2
      cat "$log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "bench.sh: $name not listening on $port after 20 s; its log:" >&2
  cat "$log" >&2
  return 1
}

# start_redis VAR DIR: one throwaway redis-server (no persistence) in DIR on a free
# port, which goes into VAR once it accepts connections.
start_redis() {
  local dir=$2 rp # not "port": printf -v must reach the caller's variable
  free_port rp
  mkdir -p "$dir"
  redis-server --bind 127.0.0.1 --port "$rp" --dir "$dir" --save "" --appendonly no \
    --daemonize no --logfile "" >"$dir/redis.log" 2>&1 &
  started+=($!)
  wait_port $! "$rp" "redis-server $dir" "$dir/redis.log"
  printf -v "$1" %d "$rp"
}

# grab_load NAME PORT ROUND: preloads a fresh pool on the server at PORT, warms it
# up, then runs the measured wrk; its report goes to the terminal and to
# $tmp/NAME.ROUND.wrk. Every round grabs from a pool of its own, so no round meets
# the grants of an earlier one (a fuller grants hash is slower).
grab_load() {
  local name=$1 port=$2 round=$3 code pool=bench
  [ "$round" -gt 1 ] && pool=bench$round
  echo "== grab: $name on 127.0.0.1:$port (round $round): preload pool $pool, $packets packets, $total cents"
  code=$(curl -sS -o "$tmp/$name.preload" -w '%{http_code}' --max-time 300 \
    -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    -d "{\"pool_id\":\"$pool\",\"total_cents\":$total,\"count\":$packets}" \
    "http://127.0.0.1:$port/admin/pools")
  if [ "$code" != 201 ] && [ "$code" != 200 ]; then
    echo "bench.sh: $name: POST /admin/pools answered $code: $(cat "$tmp/$name.preload")" >&2
    return 1
  fi
  if [ "$warmup" != 0 ] && [ "$warmup" != 0s ]; then
    POOL=$pool PREFIX=w REPEAT=$repeat wrk -t"$threads" -c"$conns" -d"$warmup" \
      -s loadtest/wrk/grab.lua "http://127.0.0.1:$port" >/dev/null
  fi
  echo "== grab: $name: wrk -t$threads -c$conns -d$duration --latency (REPEAT=$repeat)"
  POOL=$pool PREFIX=u REPEAT=$repeat wrk -t"$threads" -c"$conns" -d"$duration" --latency \
    -s loadtest/wrk/grab.lua "http://127.0.0.1:$port" | tee "$tmp/$name.$round.wrk"
}

# grab_summary NAME prints, over NAME's rounds, the medians of grabs/s, req/s, p50
# and p99 (µs), then the sums of each status and of socket errors, from the
# "statuses" and "result" lines that grab.lua printed.
#
# grabs/s counts the answers API.md means (200 granted/already_granted, 410
# sold_out) per second; requests shed with 503 or failed otherwise are left out, so
# a server cannot look fast by refusing work. req/s is wrk's raw figure.
grab_summary() {
  awk '
    function median(a, n,   i, j, t) {
      for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    FNR == 1 { n++ }
    $1 == "statuses" || $1 == "result" { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[n, kv[1]] = kv[2] } }
    END {
      for (i = 1; i <= n; i++) {
        g[i] = (v[i, "200"] + v[i, "410"]) / (v[i, "duration_us"] / 1e6)
        q[i] = v[i, "rps"]; p50[i] = v[i, "p50_us"]; p99[i] = v[i, "p99_us"]
        s200 += v[i, "200"]; s410 += v[i, "410"]; s503 += v[i, "503"]; so += v[i, "other"]; se += v[i, "errors"]
      }
      printf "%.0f %.0f %d %d %d %d %d %d %d\n", median(g, n), median(q, n), median(p50, n), median(p99, n), s200, s410, s503, so, se
    }' "$tmp/$1".*.wrk
}

bench_grab() {
  local duration=${DURATION:-10s} conns=${CONNS:-64} threads=${THREADS:-2}
  local warmup=${WARMUP:-2s} repeat=${REPEAT:-0.2} rounds=${ROUNDS:-1}
  local packets=${PACKETS:-2000000} total=${TOTAL_CENTS:-200000000}
  local tool
  for tool in redis-server wrk curl; do
    command -v "$tool" >/dev/null 2>&1 || {
      echo "bench.sh: $tool not on PATH (Debian/Ubuntu: apt-get install -y redis-server wrk curl)" >&2
      return 1
    }
  done
  # tmp and token are seen by grab_load and grab_summary (bash scoping is dynamic).
  local tmp token
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/rain-bench.XXXXXX")
  scratch+=("$tmp")
  token=bench-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')

  echo "== grab: go build ./cmd/rain ./loadtest/baseline"
  go build -o "$tmp/rain" ./cmd/rain
  go build -o "$tmp/baseline" ./loadtest/baseline

  # rain: 4 shards of weight 1. The baseline: its own, fifth redis-server.
  local shards="" i port
  for i in 1 2 3 4; do
    start_redis port "$tmp/s$i"
    shards+="${shards:+,}s$i=1@127.0.0.1:$port"
  done
  local bredis rport bport
  start_redis bredis "$tmp/baseline-redis"
  free_port rport
  free_port bport

  "$tmp/rain" serve --listen "127.0.0.1:$rport" --redis "$shards" --admin-token "$token" \
    >"$tmp/rain.log" 2>&1 &
  started+=($!)
  local rpid=$!
  "$tmp/baseline" -listen "127.0.0.1:$bport" -redis "127.0.0.1:$bredis" -admin-token "$token" \
    >"$tmp/baseline.log" 2>&1 &
  started+=($!)
  wait_port $! "$bport" baseline "$tmp/baseline.log"
  wait_port "$rpid" "$rport" rain "$tmp/rain.log"
  for ((i = 0; i < 200; i++)); do
    curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$rport/healthz" 2>/dev/null && break
    sleep 0.1
  done
  curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$rport/healthz" || {
    echo "bench.sh: rain: /healthz not 200 after 20 s; its log:" >&2
    cat "$tmp/rain.log" >&2
    return 1
  }

  # Rounds alternate which target goes first, so neither always gets the cooler,
  # quieter machine.
  local r
  for ((r = 1; r <= rounds; r++)); do
    if ((r % 2)); then
      grab_load rain "$rport" "$r"
      grab_load baseline "$bport" "$r"
    else
      grab_load baseline "$bport" "$r"
      grab_load rain "$rport" "$r"
    fi
  done

  local n gps rps p50 p99 s200 s410 s503 sother errs rgps r50 r99
  echo "== grab: $rounds round(s) of -t$threads -c$conns -d$duration, REPEAT=$repeat; medians over rounds"
  for n in rain baseline; do
    read -r gps rps p50 p99 s200 s410 s503 sother errs < <(grab_summary "$n")
    awk -v n="$n" -v g="$gps" -v q="$rps" -v p50="$p50" -v p99="$p99" 'BEGIN {
      printf "grab: %-8s %7d grabs/s (%d req/s)  p50 %6.2f ms  p99 %6.2f ms  ", n, g, q, p50 / 1000, p99 / 1000 }'
    echo "statuses 200=$s200 410=$s410 503=$s503 other=$sother errors=$errs"
    [ "$s410" = 0 ] || echo "grab: warning: $n sold out during a run: raise PACKETS or shorten DURATION" >&2
    if [ "$n" = rain ]; then rgps=$gps r50=$p50 r99=$p99; fi
  done
  awk -v rg="$rgps" -v r50="$r50" -v r99="$r99" -v bg="$gps" -v b50="$p50" -v b99="$p99" 'BEGIN {
    printf "grab: rain/baseline %.2fx grabs/s, p50 %.2fx, p99 %.2fx (target: grabs/s >= 1.00x)\n",
      rg / bg, r50 / b50, r99 / b99 }'
  cleanup
}

for s in "${sections[@]}"; do
  case "$s" in
    idgen) bench_idgen ;;
    ring) bench_ring ;;
    preload) bench_preload ;;
    grab) bench_grab ;;
    *) echo "bench.sh: unknown section $s (have: idgen ring preload grab)" >&2; exit 2 ;;
  esac
done
