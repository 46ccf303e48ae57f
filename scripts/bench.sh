#!/usr/bin/env bash
# scripts/bench.sh — rain's benchmarks, each beside its baseline in one run.
#
#   scripts/bench.sh            every section
#   scripts/bench.sh idgen      grant serials: Next vs one Redis INCR per ID
#   scripts/bench.sh preload    1,000,000 packets into 8 sub-pools on 4 shards vs bare RPUSH
#   scripts/bench.sh grab       POST /grab over HTTP: rain on 4 shards vs the baseline
#                               (loadtest/baseline: one handler, one EVALSHA, one Redis),
#                               ending with one grab's CPU and latency targets beside
#                               their figures (RAIN_SHARDS=1: on 1 shard)
#   scripts/bench.sh driver     the load driver's own ceiling (against `rainload fixed`)
#                               beside the rate rain sustains, in the same run
#   scripts/bench.sh pool       overload: 2x and 4x rain's peak, open-loop, worker pool
#                               on and --workers=off side by side (see bench_pool)
#   scripts/bench.sh soldout    answers/s on a sold-out pool vs a handler that only
#                               decodes and answers a fixed JSON (see bench_soldout)
#   scripts/bench.sh cluster    rain on a 3-primary Redis Cluster beside rain on 3 named
#                               shards, and what a slot move costs the grabs on it
#                               (see bench_cluster)
#   scripts/bench.sh durability grab throughput with the shards on appendfsync always
#                               (what rain requires) beside everysec (see bench_durability)
#   scripts/bench.sh memory     what a pool leaves on its shards from its preload to its close
#                               (see bench_memory)
#   scripts/bench.sh settle     grants/s settled by rain settle into a ledger file and into
#                               PostgreSQL, beside the saturated grab rate that made them
#                               (see bench_settle)
#   scripts/bench.sh budget     where one grab's microseconds go, process and Redis, rain on 1
#                               and 4 shards at 64 and 256 connections, beside the floors (a
#                               fixed answer on net/http and on fasthttp, the claim path alone,
#                               and as four copies at once: four shards' Redis) and the
#                               minimal design (see bench_budget)
#   BEFORE=REV scripts/bench.sh versus
#                               POST /grab over HTTP: rain built at git revision REV
#                               beside rain built from the working tree, rounds
#                               alternating (what a change costs; see bench_versus);
#                               OPEN=1 adds open-loop runs at LOAD x the saturated rate;
#                               BEFORE_FLAGS and AFTER_FLAGS add rain serve flags to
#                               either side (BEFORE=HEAD AFTER_FLAGS="--workers off":
#                               what a flag costs); BEFORE_ENV and AFTER_ENV set
#                               variables of either side's process
#                               (AFTER_ENV="GOMAXPROCS=1")
#
# rain runs on 4 shards (RAIN_SHARDS=N: N; budget sets its own), each a
# redis-server on this machine, so their fsyncs share one disk.
# rain's shards run with an AOF and appendfsync always (RAIN_FSYNC=everysec runs
# them relaxed); the baseline's Redis with appendfsync everysec (BASELINE_FSYNC).
# The baseline runs on one Redis (BASELINE_SHARDS=N: on N, its users split over
# them by a hash of their id, the minimal design sharded as rain is).
# RAIN_ENV and BASELINE_ENV set variables of rain serve's and the baseline's
# processes (RAIN_ENV=GOMAXPROCS=1 BASELINE_ENV=GOMAXPROCS=1).
# rain serve writes one outbox entry per batch of grants (RAIN_OUTBOX=packed: one
# per grant; fields: a field per value, its default) and names a batch's grants
# by one deadline index member (RAIN_DEADLINE_INDEX=grant: a member per grant,
# its default).
#
# grab and driver load their targets with loadtest/rainload, an open-loop driver:
# requests are due at the times of a fixed arrival rate, whatever the answers, and
# one that finds -max-inflight requests in flight is dropped (counted, not sent
# later). Every figure they print comes from rainload's summaries. grab measures
# each target twice per round:
#
#   saturated  offered RATE/s, far above what either target serves, with at most
#              INFLIGHT requests in flight over CONNS connections (by default
#              64/64: every connection always busy, as wrk -c64 was). The target
#              answers as fast as it can and the rest is dropped, so grabs/s is
#              its capacity under the same offered load for both; the latencies
#              are at that concurrency.
#   at R/s     both targets at the same sustainable rate R = LOAD × the lower of
#              the two saturated goodputs of the round: latency of each under
#              equal, open-loop load (nothing should drop here). LOAD is 0.5, not
#              higher: what this shared 2-core machine gives a target swings by a
#              quarter from run to run, and under open-loop load a dip below the
#              offered rate builds a backlog that the latencies then measure.
#
# A step search for each target's highest sustainable rate would cost a minute per
# target on this machine, and its answer swings with the machine's noise as much as
# the saturated figure; the saturated runs give the capacity in one short run, and
# the equal-load runs give latencies that do not depend on a concurrency setting.
#
# grab reads from the environment: RATE (100000) offered per second when saturating;
# CONNS (64) connections; INFLIGHT (CONNS) requests in flight when saturating;
# DURATION (5s) per measured run; LOAD (0.5); ROUNDS (3) rounds, alternating which
# target goes first, medians reported; WARMUP (2s, 0 for none) of unmeasured
# saturating load before each target's runs; REPEAT (0.2) share of requests from a
# user who already grabbed; PACKETS (2000000) and TOTAL_CENTS (200000000) per
# preloaded pool. driver reads the same, and DRIVER_RATE (200000) offered per
# second to `rainload fixed`. For example:
#
#   DURATION=10s ROUNDS=5 scripts/bench.sh grab
#
# REPORT=path.html writes one self-contained HTML page (no network needed to view
# it) with charts over time of every load run of grab and driver: latency
# percentiles, throughput, shed and dropped requests, rain's worker-pool gauges and
# remaining stock (scraped from rain each second). With REPORT, grab also runs a
# rain-shaped spike against rain: from 5% of twice rain's saturated goodput, ramp
# in 2 s to twice it, hold 5 s, ramp down in 3 s, with up to SPIKE_CONNS (4000)
# requests in flight, each on its own connection, on a pool of 6 seconds' worth
# of packets, so that the chart shows the spike, what rain sheds, its worker pool
# growing, and the stock running out.
#
#   REPORT=/tmp/rain-bench.html scripts/bench.sh grab driver
#
# Needs redis-server on PATH (scripts/test.sh installs it); grab and driver also
# need curl (Debian/Ubuntu: apt-get install -y redis-server curl). The Go
# benchmarks start their own redis-server processes on free ports; so do grab and
# driver, and everything they start listens on 127.0.0.1 only and is stopped on
# exit.
set -euo pipefail
cd "$(dirname "$0")/.."

sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(idgen preload grab cluster durability settle memory driver pool soldout budget)

# Processes and directories that sections start and make; cleanup stops and
# removes them on any exit (normal, error, Ctrl-C). kept holds what lives until
# the script exits (the tools built once, the report's material).
started=()
scratch=()
kept=()
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
trap 'cleanup; for p in ${kept[@]+"${kept[@]}"}; do rm -rf "$p"; done' EXIT
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

bench_preload() {
  echo "== preload: go test -run x -bench Preload -benchtime 5x ./internal/catalog"
  go test -run x -bench Preload -benchtime 5x ./internal/catalog | grep -E '^Benchmark'
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

# start_redis VAR DIR [FSYNC]: one throwaway redis-server in DIR on a free port,
# which goes into VAR once it accepts connections. With FSYNC (always, everysec)
# it keeps an AOF with that appendfsync; without, no persistence. The caller's
# redis_args, if any, go on its command line too.
start_redis() {
  local dir=$2 fsync=${3:-} rp # not "port": printf -v must reach the caller's variable
  local persist=(--appendonly no)
  [ -z "$fsync" ] || persist=(--appendonly yes --appendfsync "$fsync")
  free_port rp
  mkdir -p "$dir"
  # The latency monitor records every fsync that takes 10 ms or more (see
  # slowest_fsync).
  redis-server --bind 127.0.0.1 --port "$rp" --dir "$dir" --save "" "${persist[@]}" \
    --latency-monitor-threshold 10 \
    ${redis_args[@]+"${redis_args[@]}"} --daemonize no --logfile "" >"$dir/redis.log" 2>&1 &
  started+=($!)
  redis_pid=$!
  wait_port $! "$rp" "redis-server $dir" "$dir/redis.log"
  printf -v "$1" %d "$rp"
}


# build_tools: rain, the baseline and rainload, built once into $bin.
bin=""
build_tools() {
  [ -n "$bin" ] && return 0
  bin=$(mktemp -d "${TMPDIR:-/tmp}/rain-bench-bin.XXXXXX")
  kept+=("$bin")
  echo "== go build ./cmd/rain ./loadtest/baseline ./loadtest/rainload"
  go build -o "$bin/rain" ./cmd/rain
  go build -o "$bin/baseline" ./loadtest/baseline
  go build -o "$bin/rainload" ./loadtest/rainload
}

# need_tools CMD...: fails with how to install what is missing.
need_tools() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || {
      echo "bench.sh: $tool not on PATH (Debian/Ubuntu: apt-get install -y redis-server curl)" >&2
      return 1
    }
  done
}

# start_rain VAR [FLAG...]: rain serve on $rain_shards (4 unless set) fresh
# redis-server shards of weight 1, with the admin token $token and any extra
# FLAGs; its port goes into VAR once
# /healthz answers. The shards keep an AOF with appendfsync $rain_fsync (always
# unless set: the durability rain serve requires; anything else runs it with
# --durability relaxed). User auth is off (--user-auth none, which rain serve
# on real shards needs said; a rain built before it existed is not given it)
# unless a FLAG says otherwise. A batch's grants share one outbox entry
# (RAIN_OUTBOX=batch unless RAIN_OUTBOX says packed or fields: the form a
# deployment runs once its rain settle reads it; a rain built before that
# form runs packed, and one before the flag ignores the variable), and a
# batch's grants share a deadline index member
# (RAIN_DEADLINE_INDEX=batch unless it says grant: the form a deployment runs
# once every rain serve reads it). Uses $tmp (bash scoping is dynamic).
rain_fsync=${RAIN_FSYNC:-always}
rain_shards=${RAIN_SHARDS:-4}
rain_outbox=${RAIN_OUTBOX:-batch}
rain_deadline_index=${RAIN_DEADLINE_INDEX:-batch}

# user_auth_none BIN: no_user_auth=(--user-auth none) when BIN's rain serve
# takes it (and so requires it on real shards), else empty.
# user_auth_none BIN also sets outbox to $rain_outbox, or packed when BIN's
# rain serve has no batch form.
user_auth_none() {
  no_user_auth=()
  outbox=$rain_outbox
  # The help is read whole first: with pipefail, grep -q leaving early
  # would fail the pipe when rain is still writing (SIGPIPE).
  local help
  help=$("$1" serve -h 2>&1 || true)
  if grep -q -- '"none": off' <<<"$help"; then
    no_user_auth=(--user-auth none)
  fi
  if [ "$outbox" = batch ] && ! grep -q -- '"batch" (one entry' <<<"$help"; then
    outbox=packed
  fi
}
rain_seq=0
start_rain() {
  local shards="" i p dir redis=""
  rain_seq=$((rain_seq + 1))
  dir="$tmp/rain$rain_seq"
  for ((i = 1; i <= ${rain_shards:-4}; i++)); do
    start_redis p "$dir/s$i" "$rain_fsync"
    redis+="${redis:+ }$redis_pid"
    shards+="${shards:+,}s$i=1@127.0.0.1:$p"
  done
  start_rain_on "$1" "$dir" "$shards" "$redis" "${@:2}"
}

# start_rain_on VAR DIR SHARDS PIDS [FLAG...]: rain serve on the shards SHARDS
# (a --redis value) whose redis-server processes are PIDS (for the CPU they
# cost), logging into DIR; otherwise as start_rain.
start_rain_on() {
  local dir=$2 shards=$3 redis=$4 rp pid i durability=()
  [ "$rain_fsync" = always ] || durability=(--durability relaxed)
  user_auth_none "${rain_bin:-$bin/rain}"
  free_port rp
  # rain_env: variables of this process (versus's BEFORE_ENV, AFTER_ENV;
  # else RAIN_ENV), split on spaces; env execs, so $! is rain's PID.
  # shellcheck disable=SC2086
  RAIN_OUTBOX=$outbox RAIN_DEADLINE_INDEX=$rain_deadline_index env ${rain_env:-${RAIN_ENV:-}} "${rain_bin:-$bin/rain}" serve --listen "127.0.0.1:$rp" --redis "$shards" --admin-token "$token" \
    "${durability[@]}" "${no_user_auth[@]}" "${@:5}" \
    >"$dir/rain.log" 2>&1 &
  pid=$!
  started+=("$pid")
  wait_port "$pid" "$rp" rain "$dir/rain.log"
  for ((i = 0; i < 200; i++)); do
    curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$rp/healthz" 2>/dev/null && break
    sleep 0.1
  done
  curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$rp/healthz" || {
    echo "bench.sh: rain: /healthz not 200 after 20 s; its log:" >&2
    cat "$dir/rain.log" >&2
    return 1
  }
  app_of[$rp]=$pid redis_of[$rp]=$redis shards_of[$rp]=$shards
  printf -v "$1" %d "$rp"
}

# app_of[PORT] and redis_of[PORT] are the PIDs of the target listening on
# PORT and of its Redis processes, for the CPU each run costs (see load);
# shards_of[PORT] its --redis; redis_ports_of[PORT] the ports of its Redis
# processes (the baseline's; a rain's are in shards_of).
declare -A app_of redis_of shards_of redis_ports_of

# cpu_ticks PID...: their utime + stime so far, in clock ticks (/proc/PID/stat).
cpu_ticks() {
  local pid sum=0 f
  for pid in "$@"; do
    [ -r "/proc/$pid/stat" ] || continue
    # Fields after the command name in parentheses (which may hold spaces):
    # utime and stime are the 12th and 13th of them.
    f=$(sed 's/^.*) //' "/proc/$pid/stat")
    set -- $f
    sum=$((sum + ${12} + ${13}))
  done
  echo "$sum"
}
clk_tck=$(getconf CLK_TCK)

# start_baseline VAR: the baseline on its own redis-server (AOF with appendfsync
# $BASELINE_FSYNC, everysec unless set: the minimal design's usual setting);
# its port into VAR, its Redis's port into redis_ports_of[VAR's port]. With
# BASELINE_SHARDS=N (1 unless set), on N redis-servers, its users split over
# them by a hash of their id: the minimal design sharded as rain is, so that
# what the shards alone cost on this machine is measured beside rain.
start_baseline() {
  local br bp i addrs="" pids="" ports=""
  for ((i = 1; i <= ${BASELINE_SHARDS:-1}; i++)); do
    start_redis br "$tmp/baseline-redis$i" "${BASELINE_FSYNC:-everysec}"
    addrs+="${addrs:+,}127.0.0.1:$br" pids+="${pids:+ }$redis_pid" ports+="${ports:+ }$br"
  done
  free_port bp
  # shellcheck disable=SC2086
  env ${BASELINE_ENV:-} "$bin/baseline" -listen "127.0.0.1:$bp" -redis "$addrs" -admin-token "$token" \
    >"$tmp/baseline.log" 2>&1 &
  started+=($!)
  app_of[$bp]=$! redis_of[$bp]=$pids redis_ports_of[$bp]=$ports
  wait_port $! "$bp" baseline "$tmp/baseline.log"
  printf -v "$1" %d "$bp"
}

# start_fixed VAR [SERVER]: `rainload fixed -server SERVER` (bare unless given:
# the driver's ceiling; net/http or fasthttp: the floors of budget), the
# fixed-answer server; its port into VAR.
start_fixed() {
  local fp server=${2:-bare} log
  log="$tmp/fixed-${server//\//}.log"
  free_port fp
  "$bin/rainload" fixed -server "$server" -listen "127.0.0.1:$fp" >"$log" 2>&1 &
  started+=($!)
  app_of[$fp]=$! redis_of[$fp]=""
  wait_port $! "$fp" "rainload fixed -server $server" "$log"
  printf -v "$1" %d "$fp"
}

# load NAME KIND ROUND PORT FLAG...: one measured rainload run against
# 127.0.0.1:PORT. Its printed summary goes to the terminal and to
# $tmp/NAME.KIND.ROUND.out (the "result" line there is what the figures are made
# of); with REPORT, its timeline joins the report.
load() {
  local name=$1 kind=$2 round=$3 port=$4
  shift 4
  local base="$tmp/$name.$kind.$round"
  local args="$*"
  args=${args//-admin-token $token/-admin-token T} # the token stays off the screen
  echo "== $section: $name $kind (round $round): rainload $args"
  local app0 redis0 app1 redis1 fsync batches0=""
  slowest_fsync "$port" >/dev/null # resets the shards' latency monitors
  # A rain's batches to its shards over the run (see add_batches).
  [ -z "${shards_of[$port]:-}" ] || batches0=$(batch_totals "$port")
  app0=$(cpu_ticks ${app_of[$port]:-}) redis0=$(cpu_ticks ${redis_of[$port]:-})
  "$bin/rainload" -url "http://127.0.0.1:$port" -progress 0 -summary "$base.json" \
    -timeline "$base.jsonl" "$@" >"$base.out" 2>"$base.err" || {
    echo "bench.sh: rainload failed:" >&2
    cat "$base.err" "$base.out" >&2
    return 1
  }
  # CPU per answered request, of the target's process and of its Redis
  # processes, appended to the result line (app_us, redis_us).
  app1=$(cpu_ticks ${app_of[$port]:-}) redis1=$(cpu_ticks ${redis_of[$port]:-})
  fsync=$(slowest_fsync "$port")
  awk -v a=$((app1 - app0)) -v r=$((redis1 - redis0)) -v hz="$clk_tck" -v f="$fsync" \
    -v n="$(result_of "$base.out" answered)" '
    $1 == "result" { $0 = $0 sprintf(" app_us=%.1f redis_us=%.1f fsync_ms=%d", n ? a * 1e6 / hz / n : 0, n ? r * 1e6 / hz / n : 0, f) }
    { print }' "$base.out" >"$base.out.tmp" && mv "$base.out.tmp" "$base.out"
  [ -z "$batches0" ] || add_batches "$base.out" "$batches0" "$(batch_totals "$port")"
  grep -E '^  (offered|statuses|accepted|driver lag)' "$base.out" || true
  if [ -n "$report_dir" ]; then
    report_seq=$((report_seq + 1))
    local keep
    keep=$(printf '%s/%03d.jsonl' "$report_dir" "$report_seq")
    cp "$base.jsonl" "$keep"
    report_runs+=("$section: $name $kind, round $round: ${args//-admin-token T /}=$keep")
  fi
}

# warm NAME PORT FLAG...: unmeasured load for WARMUP (any -preload among FLAGs
# happens here); with WARMUP=0 only the preload, if any, runs.
warm() {
  local name=$1 port=$2
  shift 2
  local d=$warmup
  if [ "$d" = 0 ] || [ "$d" = 0s ]; then
    case " $* " in *" -preload "*) d=1ms ;; *) return 0 ;; esac
  fi
  "$bin/rainload" -url "http://127.0.0.1:$port" -progress 0 -duration "$d" "$@" \
    >"$tmp/$name.warm.out" 2>&1 || {
    echo "bench.sh: $name: warm-up failed:" >&2
    cat "$tmp/$name.warm.out" >&2
    return 1
  }
}

# result_of FILE KEY prints KEY's value on the "result" line of rainload's output FILE.
result_of() {
  awk -v k="$2" '$1 == "result" { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) print kv[2] } }' "$1"
}

# med NAME KIND KEY prints the median of KEY over NAME's KIND runs (all rounds).
med() {
  local f
  for f in "$tmp/$1.$2".*.out; do result_of "$f" "$3"; done | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

# most NAME KIND KEY prints the largest KEY of NAME's KIND runs (0 for none).
most() {
  local f
  for f in "$tmp/$1.$2".*.out; do result_of "$f" "$3"; done | awk '$1 > m { m = $1 } END { printf "%d\n", m }'
}

# total NAME KIND KEY prints the sum of KEY over NAME's KIND runs.
total() {
  local f
  for f in "$tmp/$1.$2".*.out; do result_of "$f" "$3"; done | awk '{ s += $1 } END { printf "%d\n", s }'
}

# figure LINE...: prints a result line, and keeps it for the report's notes.
figure() {
  echo "$*"
  [ -z "$report_dir" ] || echo "$*" >>"$report_dir/notes.txt"
}

# bench_settings reads the environment shared by grab and driver into the
# caller's locals (bash scoping is dynamic).
bench_settings() {
  rate=${RATE:-100000} conns=${CONNS:-64} duration=${DURATION:-5s} warmup=${WARMUP:-2s}
  inflight=${INFLIGHT:-$conns} rounds=${ROUNDS:-3} repeat=${REPEAT:-0.2}
  packets=${PACKETS:-2000000} total=${TOTAL_CENTS:-200000000} share=${LOAD:-0.5}
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/rain-bench.XXXXXX")
  scratch+=("$tmp")
  token=bench-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
}

# saturate NAME PORT ROUND [FLAG...]: preload pool bench<ROUND> and warm up (in
# one unmeasured run), then one saturated run (kind "sat") with the extra FLAGs.
# Every round grabs from a pool of its own, so no round meets the grants of an
# earlier one (a fuller grants hash is slower).
saturate() {
  local name=$1 port=$2 round=$3
  shift 3
  local pool=bench$round
  warm "$name" "$port" -pool "$pool" -admin-token "$token" -preload "$packets:$total" \
    -rate "$rate" -max-inflight "$inflight" -conns "$conns" -user-prefix "w$round." -repeat "$repeat"
  load "$name" sat "$round" "$port" -pool "$pool" -rate "$rate" -duration "$duration" \
    -max-inflight "$inflight" -conns "$conns" -user-prefix "s$round." -repeat "$repeat" "$@"
}

# print_row LABEL NAME KIND: one line of figures, medians over rounds; errors and
# sold-out are sums.
print_row() {
  local label=$1 name=$2 kind=$3
  figure "$(awk -v l="$label" -v n="$name" -v g="$(med "$name" "$kind" goodput_rps)" \
    -v p50="$(med "$name" "$kind" p50_ms)" -v p99="$(med "$name" "$kind" p99_ms)" \
    -v p999="$(med "$name" "$kind" p999_ms)" -v shed="$(med "$name" "$kind" shed_rps)" \
    -v off="$(med "$name" "$kind" offered_rps)" -v drop="$(total "$name" "$kind" dropped)" \
    -v sched="$(total "$name" "$kind" scheduled)" -v err="$(total "$name" "$kind" errors)" \
    -v app="$(med "$name" "$kind" app_us)" -v rds="$(med "$name" "$kind" redis_us)" \
    -v fs="$(most "$name" "$kind" fsync_ms)" 'BEGIN {
      printf "%s %-8s %7.0f grabs/s  p50 %6.2f ms  p99 %6.2f ms  p99.9 %6.2f ms  shed %.0f/s  errors %d  dropped %.1f%% of %.0f/s offered  CPU/answer %.1f + %.1f us (process + redis)%s\n",
        l, n, g, p50, p99, p999, shed, err, sched ? 100 * drop / sched : 0, off, app, rds, (fs > 0 ? sprintf("  slowest fsync %d ms", fs) : "") }')"
  [ "$section" = soldout ] || [ "$(total "$name" "$kind" sold_out)" = 0 ] ||
    echo "$section: warning: $name sold out during a $kind run: raise PACKETS or shorten DURATION" >&2
}

bench_grab() {
  need_tools redis-server curl
  local section=grab rate conns duration warmup inflight rounds repeat packets total share tmp token
  bench_settings
  build_tools
  local rport bport
  start_rain rport
  start_baseline bport

  # Rounds alternate which target goes first, so neither always gets the cooler,
  # quieter machine. Each round: both saturated, then both at the round's equal
  # rate.
  local r n eq order
  for ((r = 1; r <= rounds; r++)); do
    order="rain baseline"
    ((r % 2)) || order="baseline rain"
    for n in $order; do
      if [ "$n" = rain ]; then
        saturate rain "$rport" "$r" -admin-token "$token" -scrape
      else
        saturate baseline "$bport" "$r"
      fi
    done
    eq=$(awk -v a="$(result_of "$tmp/rain.sat.$r.out" goodput_rps)" \
      -v b="$(result_of "$tmp/baseline.sat.$r.out" goodput_rps)" -v s="$share" \
      'BEGIN { m = a < b ? a : b; printf "%d\n", m * s }')
    for n in $order; do
      local port=$bport scrape=()
      [ "$n" = rain ] && port=$rport scrape=(-admin-token "$token" -scrape)
      load "$n" eq "$r" "$port" -pool "bench$r" -rate "$eq" -duration "$duration" -conns "$conns" \
        -user-prefix "e$r." -repeat "$repeat" "${scrape[@]}"
    done
  done

  echo "== grab: $rounds round(s) of $duration, REPEAT=$repeat, medians over rounds (errors: sums)"
  echo "   saturated: $rate/s offered, -max-inflight $inflight -conns $conns; at R/s: R = $share x the round's lower saturated goodput (medians of R shown)"
  print_row "grab: saturated" rain sat
  print_row "grab: saturated" baseline sat
  local eqm
  eqm=$(med rain eq offered_rps)
  print_row "$(printf 'grab: at %6.0f/s' "$eqm")" rain eq
  print_row "$(printf 'grab: at %6.0f/s' "$eqm")" baseline eq
  figure "$(awk -v rg="$(med rain sat goodput_rps)" -v bg="$(med baseline sat goodput_rps)" \
    -v r50="$(med rain eq p50_ms)" -v b50="$(med baseline eq p50_ms)" \
    -v r99="$(med rain eq p99_ms)" -v b99="$(med baseline eq p99_ms)" \
    -v r999="$(med rain eq p999_ms)" -v b999="$(med baseline eq p999_ms)" -v eq="$eqm" 'BEGIN {
      printf "grab: rain/baseline %.2fx grabs/s saturated; at %.0f/s p50 %.2fx, p99 %.2fx, p99.9 %.2fx (target: grabs/s >= 1.00x)\n",
        rg / bg, eq, r50 / b50, r99 / b99, r999 / b999 }')"
  # What a claim of rain's waits for: its shard's batches (claims each, and
  # a batch's round trip from the lane), saturated and in the open loop.
  figure "$(awk -v sc="$(med rain sat batch_claims)" -v sm="$(med rain sat batch_ms)" \
    -v ec="$(med rain eq batch_claims)" -v em="$(med rain eq batch_ms)" -v eq="$eqm" 'BEGIN {
      printf "grab: rain, batches to its shards: saturated %.1f claims each, round trip %.2f ms; at %.0f/s %.1f claims each, round trip %.2f ms\n",
        sc, sm, eq, ec, em }')"
  # The CPU and latency targets of one grab against the minimal design, for
  # the shard count and connections of this run; they are set against the
  # minimal design on appendfsync always (BASELINE_FSYNC=always).
  figure "$(awk -v ra="$(med rain sat app_us)" -v rr="$(med rain sat redis_us)" \
    -v ba="$(med baseline sat app_us)" -v br="$(med baseline sat redis_us)" \
    -v r50="$(med rain eq p50_ms)" -v b50="$(med baseline eq p50_ms)" \
    -v r99="$(med rain eq p99_ms)" -v b99="$(med baseline eq p99_ms)" \
    -v shards="$rain_shards" -v conns="$conns" -v eq="$eqm" -v bf="${BASELINE_FSYNC:-everysec}" 'BEGIN {
      lim = shards == 1 ? 0.5 : 0.7
      cpu = (ra + rr) / (ba + br)
      printf "grab: targets, rain on %d shard(s), %d conns: CPU per grab %.1f / %.1f us = %.2fx (target <= %.1fx: %s)", shards, conns, ra + rr, ba + br, cpu, lim, cpu <= lim ? "met" : "not met"
      redis = rr / br
      if (conns >= 256) printf "; Redis CPU per grab %.2fx (target <= 0.4x: %s)", redis, redis <= 0.4 ? "met" : "not met"
      else printf "; Redis CPU per grab %.2fx (its target, <= 0.4x, is at 256 conns)", redis
      printf "; open loop at %.0f/s: p50 %.2fx, p99 %.2fx (target <= 1.2x each: %s)", eq, r50 / b50, r99 / b99, (r50 / b50 <= 1.2 && r99 / b99 <= 1.2) ? "met" : "not met"
      if (bf != "always") printf " [the targets are against the minimal design on always: this run had it on %s; BASELINE_FSYNC=always]", bf
      printf "\n" }')"

  if [ -n "$report_dir" ]; then
    # The rain: twice what rain serves saturated, from a drizzle, on a pool that
    # holds about 6 s of rain's goodput. Each of SPIKE_CONNS requests in flight
    # has a connection of its own, as phones do; more than rain's worker pool
    # runs and queues (--workers-max + --workers-queue, 2048 by default), so that
    # what rain sheds shows.
    local peak low stock spike_conns=${SPIKE_CONNS:-4000}
    peak=$(awk -v g="$(med rain sat goodput_rps)" 'BEGIN { printf "%d\n", 2 * g }')
    low=$((peak / 20))
    stock=$((peak * 3))
    load rain spike 1 "$rport" -pool spike -admin-token "$token" -scrape \
      -preload "$stock:$((stock * 100))" -start-rate "$low" \
      -stages "3s:$low,2s:$peak,5s:$peak,3s:0,1s:0" -max-inflight "$spike_conns" -conns "$spike_conns" \
      -repeat "$repeat"
    figure "$(awk -v peak="$peak" -v stock="$stock" -v g="$(result_of "$tmp/rain.spike.1.out" goodput_rps)" \
      -v p99="$(result_of "$tmp/rain.spike.1.out" p99_ms)" -v shed="$(result_of "$tmp/rain.spike.1.out" shed_rps)" \
      -v so="$(result_of "$tmp/rain.spike.1.out" sold_out)" -v drop="$(result_of "$tmp/rain.spike.1.out" dropped)" \
      -v err="$(result_of "$tmp/rain.spike.1.out" errors)" 'BEGIN {
        printf "grab: spike on rain: %d/s -> %d/s -> 0 over 14 s, %d packets: goodput %.0f/s, p99 %.1f ms, shed %.0f/s, sold_out %d, dropped %d, errors %d\n",
          peak / 20, peak, stock, g, p99, shed, so, drop, err }')"
    # Put the spike first in the report.
    local last=$((${#report_runs[@]} - 1))
    report_runs=("${report_runs[$last]}" "${report_runs[@]:0:$last}")
  fi
  cleanup
}

# start_cluster VAR DIR N: a Redis Cluster of N primaries (no replicas), each
# on an AOF with appendfsync $rain_fsync, made with redis-cli --cluster create;
# its seeds (host:port+host:port+...) into VAR, its PIDs into cluster_pids.
start_cluster() {
  local dir=$2 n=$3 i np nb addrs=() sd="" a
  cluster_pids=""
  for ((i = 1; i <= n; i++)); do
    free_port np
    free_port nb
    mkdir -p "$dir/c$i"
    redis-server --bind 127.0.0.1 --port "$np" --dir "$dir/c$i" --save "" --appendonly yes \
      --appendfsync "$rain_fsync" --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-port "$nb" --cluster-node-timeout 5000 --daemonize no --logfile "" \
      >"$dir/c$i/redis.log" 2>&1 &
    started+=($!)
    cluster_pids+="${cluster_pids:+ }$!"
    wait_port $! "$np" "redis-server $dir/c$i" "$dir/c$i/redis.log"
    addrs+=("127.0.0.1:$np")
    sd+="${sd:++}127.0.0.1:$np"
  done
  redis-cli --cluster create "${addrs[@]}" --cluster-yes >"$dir/create.log" 2>&1 || {
    cat "$dir/create.log" >&2
    return 1
  }
  for a in "${addrs[@]}"; do
    for ((i = 0; i < 200; i++)); do
      redis-cli -p "${a#*:}" cluster info | grep -q '^cluster_state:ok' && break
      sleep 0.1
    done
  done
  printf -v "$1" %s "$sd"
}

# slot_owner PORT SLOT prints the node id and port of the primary that owns
# SLOT, as the node at PORT sees the cluster.
slot_owner() {
  redis-cli -p "$1" cluster nodes | awk -v s="$2" '$3 ~ /master/ {
    for (i = 9; i <= NF; i++) { n = split($i, r, "-"); if (n == 1) r[2] = r[1]
      if (s + 0 >= r[1] + 0 && s + 0 <= r[2] + 0) { split($2, a, "[:@]"); print $1, a[2]; exit } } }'
}

# move_slot SEEDPORT SLOT: moves SLOT to another primary as redis-cli
# --cluster reshard does (IMPORTING/MIGRATING, MIGRATE 100 keys at a time,
# SETSLOT NODE on every primary), while rain serves it.
move_slot() {
  local seed=$1 slot=$2 src sport dst dport keys p
  read -r src sport < <(slot_owner "$seed" "$slot")
  read -r dst dport < <(redis-cli -p "$seed" cluster nodes | awk -v s="$src" '$3 ~ /master/ && $1 != s { split($2, a, "[:@]"); print $1, a[2]; exit }')
  redis-cli -p "$dport" cluster setslot "$slot" importing "$src" >/dev/null
  redis-cli -p "$sport" cluster setslot "$slot" migrating "$dst" >/dev/null
  while :; do
    mapfile -t keys < <(redis-cli -p "$sport" cluster getkeysinslot "$slot" 100)
    [ ${#keys[@]} -gt 0 ] && [ -n "${keys[0]}" ] || break
    redis-cli -p "$sport" migrate 127.0.0.1 "$dport" "" 0 10000 keys "${keys[@]}" >/dev/null
  done
  for p in $(redis-cli -p "$seed" cluster nodes | awk '$3 ~ /master/ { split($2, a, "[:@]"); print a[2] }'); do
    redis-cli -p "$p" cluster setslot "$slot" node "$dst" >/dev/null
  done
}

# bench_cluster: rain on a Redis Cluster of 3 primaries beside rain on 3 named
# shards (every server on appendfsync always), saturated, rounds alternating
# which goes first: grabs/s and CPU per answer of each, the cluster's primaries
# counted as its Redis. Then what a slot move costs: rain on the cluster at
# LOAD x its saturated goodput, one run as is and one during which the slot of
# one sub-pool moves to another primary (its keys migrated 100 at a time, as
# redis-cli --cluster reshard does): latencies and errors of both, and how
# long the move took.
bench_cluster() {
  need_tools redis-server redis-cli curl
  local section=cluster rate conns duration warmup inflight rounds repeat packets total share tmp token
  bench_settings
  build_tools
  local nport cport seeds named="" pids="" i p dir
  dir="$tmp/named"
  for i in 1 2 3; do
    start_redis p "$dir/s$i" "$rain_fsync"
    pids+="${pids:+ }$redis_pid"
    named+="${named:+,}s$i=1@127.0.0.1:$p"
  done
  start_rain_on nport "$dir" "$named" "$pids"
  mkdir -p "$tmp/cluster"
  start_cluster seeds "$tmp/cluster" 3
  start_rain_on cport "$tmp/cluster" "c1=1@cluster/$seeds" "$cluster_pids"
  local r n order
  for ((r = 1; r <= rounds; r++)); do
    order="named cluster"
    ((r % 2)) || order="cluster named"
    for n in $order; do
      local port=$nport
      [ "$n" = cluster ] && port=$cport
      saturate "$n" "$port" "$r" -admin-token "$token"
    done
  done
  local eq seed=${seeds%%+*}
  seed=${seed#*:}
  eq=$(awk -v g="$(med cluster sat goodput_rps)" -v s="$share" 'BEGIN { printf "%d\n", g * s }')
  warm still "$cport" -pool still -admin-token "$token" -preload "$packets:$total" -rate "$eq" -conns "$conns" -user-prefix w
  load still eq 1 "$cport" -pool still -rate "$eq" -duration "$duration" -conns "$conns" -user-prefix e -repeat "$repeat"
  warm moving "$cport" -pool moving -admin-token "$token" -preload "$packets:$total" -rate "$eq" -conns "$conns" -user-prefix w
  local key slot began took
  key=$(for p in $(redis-cli -p "$seed" cluster nodes | awk '$3 ~ /master/ { split($2, a, "[:@]"); print a[2] }'); do
    redis-cli -p "$p" --scan --pattern 'rain:{moving:0*:meta'; done | head -1)
  slot=$(redis-cli -p "$seed" cluster keyslot "$key")
  load moving eq 1 "$cport" -pool moving -rate "$eq" -duration "$duration" -conns "$conns" -user-prefix e -repeat "$repeat" &
  local loader=$!
  sleep "$(awk -v d="${duration%s}" 'BEGIN { print d / 3 }')"
  began=$(date +%s%N)
  move_slot "$seed" "$slot"
  took=$((($(date +%s%N) - began) / 1000000))
  wait "$loader"
  echo "== cluster: $rounds round(s) of $duration, medians over rounds (errors: sums)"
  print_row "cluster: saturated" named sat
  print_row "cluster: saturated" cluster sat
  figure "$(awk -v c="$(med cluster sat goodput_rps)" -v n="$(med named sat goodput_rps)" \
    -v ca="$(med cluster sat app_us)" -v na="$(med named sat app_us)" \
    -v cr="$(med cluster sat redis_us)" -v nr="$(med named sat redis_us)" 'BEGIN {
    printf "cluster: 3 primaries serve %.2fx the grabs/s of 3 named shards; CPU per answer %.2fx (process) and %.2fx (redis)\n", c / n, ca / na, cr / nr }')"
  print_row "$(printf 'cluster: at %6.0f/s' "$eq")" still eq
  print_row "$(printf 'cluster: at %6.0f/s' "$eq")" moving eq
  figure "cluster: the slot of sub-pool 0 ($key, slot $slot) moved to another primary in $took ms during the 'moving' run"
  cleanup
}

# bench_durability: what fsyncing every acknowledged grant costs. rain on 4
# shards with appendfsync always (what rain serve requires) beside rain on 4
# shards with appendfsync everysec (--durability relaxed), saturated, rounds
# alternating which goes first, medians. Batching shares one fsync among a
# pipelined batch of claims, so the cost falls as batches fill.
bench_durability() {
  need_tools redis-server curl
  local section=durability rate conns duration warmup inflight rounds repeat packets total share tmp token
  bench_settings
  build_tools
  local aport eport
  rain_fsync=always start_rain aport
  rain_fsync=everysec start_rain eport
  local r n order
  for ((r = 1; r <= rounds; r++)); do
    order="always everysec"
    ((r % 2)) || order="everysec always"
    for n in $order; do
      local port=$aport
      [ "$n" = everysec ] && port=$eport
      saturate "$n" "$port" "$r" -admin-token "$token"
    done
  done
  echo "== durability: $rounds round(s) of $duration, medians over rounds (errors: sums)"
  print_row "durability: saturated" always sat
  print_row "durability: saturated" everysec sat
  figure "$(awk -v a="$(med always sat goodput_rps)" -v e="$(med everysec sat goodput_rps)" 'BEGIN {
    printf "durability: appendfsync always serves %.2fx the grabs/s of everysec\n", a / e }')"
  cleanup
}


# start_postgres VAR DIR: a throwaway PostgreSQL server (initdb in DIR, fsync
# on, as production runs) on a free port of 127.0.0.1; its URL into VAR. As
# root it runs as the postgres user, as PostgreSQL requires.
start_postgres() {
  local dir=$2 pp bindir initdb run=()
  initdb=$(command -v initdb 2>/dev/null || ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | tail -1 || true)
  [ -n "$initdb" ] || {
    echo "bench.sh: PostgreSQL's initdb not found (Debian/Ubuntu: apt-get install -y postgresql)" >&2
    return 1
  }
  bindir=$(dirname "$(readlink -f "$initdb")")
  mkdir -p "$dir"
  if [ "$(id -u)" -eq 0 ]; then
    chmod 755 "$tmp" "$dir"
    chown postgres "$dir"
    run=(runuser -u postgres --)
  fi
  "${run[@]}" "$bindir/initdb" -D "$dir/data" -A trust -U rain -E UTF8 >"$dir/initdb.log" 2>&1 || {
    cat "$dir/initdb.log" >&2
    return 1
  }
  free_port pp
  "${run[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/pg.log" -w -t 30 \
    -o "-p $pp -k $dir -c listen_addresses=127.0.0.1" start >/dev/null || {
    cat "$dir/pg.log" >&2
    return 1
  }
  pg_pid=$(head -1 "$dir/data/postmaster.pid")
  started+=("$pg_pid")
  printf -v "$1" 'postgres://rain@127.0.0.1:%d/postgres?sslmode=disable' "$pp"
}

# metric_of URL NAME prints the value of the metric NAME at URL (0 if none).
metric_of() {
  { curl -fsS --max-time 2 "$1" 2>/dev/null || true; } | awk -v n="$2" '$1 == n { v = $2 } END { print v + 0 }'
}

# bench_settle: settlement beside the grabs it settles. For each sink (a
# ledger file, then PostgreSQL on a private server with fsync on), rain on 4
# fresh shards (appendfsync always) takes one saturated run of grabs
# (DURATION) on a pool whose hold outlasts the run, with no settlement
# running; then one rain settle drains the outboxes, timed from its start
# until rain_settle_delivered_total reaches the grants made: grants/s
# settled beside the saturated grab rate of the same run, and the CPU each
# grant cost settle, the shards and the database (from /proc). Last, "live":
# rain settle into PostgreSQL running during a saturated run, as in a rain:
# the largest settlement lag sampled (rain_settle_lag_seconds, each 0.2 s),
# and how long after the grabs it caught up.
bench_settle() {
  need_tools redis-server curl
  local section=settle rate conns duration warmup inflight rounds repeat packets total share tmp token
  bench_settings
  build_tools
  local mode
  for mode in ledger postgres live; do
    local rport sport pgurl="" pg_pid="" out=() spid=""
    start_rain rport
    free_port sport
    if [ "$mode" = ledger ]; then
      out=(--ledger "$tmp/ledger.jsonl")
    else
      start_postgres pgurl "$tmp/pg.$mode"
      out=(--postgres "$pgurl")
    fi
    local metrics="http://127.0.0.1:$sport/metrics" sampler=""
    if [ "$mode" = live ]; then
      start_settle
      (while :; do metric_of "$metrics" rain_settle_lag_seconds; sleep 0.2; done >"$tmp/lag") &
      sampler=$!
      started+=("$sampler")
    fi
    saturate "$mode" "$rport" 1 -admin-token "$token"
    local t_grabs grants
    t_grabs=$(date +%s.%N)
    grants=$(curl -fsS -H "Authorization: Bearer $token" "http://127.0.0.1:$rport/admin/pools/bench1" |
      awk -F'"held_count":|"confirmed_count":' '{ split($2, h, ","); split($3, c, ","); print h[1] + c[1] }')
    local redis_pids=${redis_of[$rport]} t0 t1 r0 p0 c1 r1 p1 n=0 i
    r0=$(cpu_ticks $redis_pids) p0=$(cpu_ticks $pg_pid $(pgrep -P "${pg_pid:-0}" 2>/dev/null || true))
    t0=$(date +%s.%N)
    [ -n "$spid" ] || start_settle
    for ((i = 0; i < 6000; i++)); do
      n=$(metric_of "$metrics" rain_settle_delivered_total)
      [ "$n" -ge "$grants" ] && break
      sleep 0.1
    done
    t1=$(date +%s.%N)
    c1=$(cpu_ticks "$spid") r1=$(cpu_ticks $redis_pids) p1=$(cpu_ticks $pg_pid $(pgrep -P "${pg_pid:-0}" 2>/dev/null || true))
    [ "$n" -ge "$grants" ] || echo "bench.sh: settle ($mode) delivered $n of $grants grants in 10 minutes" >&2
    if [ "$mode" = live ]; then
      figure "$(awk -v n="$n" -v g="$(med "$mode" sat goodput_rps)" -v lag="$(sort -g "$tmp/lag" | tail -1)" \
        -v after="$(awk -v a="$t_grabs" -v b="$t1" 'BEGIN { print b - a }')" 'BEGIN {
        printf "settle: live into postgres during a saturated run (%.0f grabs/s): %d grants, largest lag %.2f s, caught up %.1f s after the grabs\n",
          g, n, lag, after }')"
    else
      figure "$(awk -v s="$mode" -v n="$n" -v t="$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
        -v g="$(med "$mode" sat goodput_rps)" -v c="$c1" -v r=$((r1 - r0)) -v p=$((p1 - p0)) -v hz="$clk_tck" 'BEGIN {
        printf "settle: into %-8s %7d grants in %5.1f s = %6.0f grants/s, %.2fx the saturated grab rate (%.0f grabs/s); CPU/grant %.1f + %.1f + %.1f us (settle + redis + postgres)\n",
          s, n, t, n / t, n / t / g, g, c * 1e6 / hz / n, r * 1e6 / hz / n, p * 1e6 / hz / n }')"
    fi
    cleanup
  done
}

# start_settle: rain settle on the shards of $rport into "${out[@]}", its
# health and metrics on $sport; its PID into spid (bench_settle's locals).
start_settle() {
  "$bin/rain" settle --redis "${shards_of[$rport]}" --listen "127.0.0.1:$sport" --consumer bench "${out[@]}" \
    >"$tmp/settle.$mode.log" 2>&1 &
  spid=$!
  started+=("$spid")
}

# bench_versus: rain built at git revision $BEFORE beside rain built from the
# working tree, each on 4 fresh shards, saturated, rounds alternating which
# goes first: goodput, latency and CPU per answer of each (what a change of
# the hot path costs). With OPEN=1 each round then runs both at the same
# open-loop rate, LOAD x the round's lower saturated goodput, as grab does:
# the latency a change costs or saves below saturation.
bench_versus() {
  need_tools redis-server curl git
  [ -n "${BEFORE:-}" ] || { echo "bench.sh: versus needs BEFORE=<git revision>" >&2; return 2; }
  local section=versus rate conns duration warmup inflight rounds repeat packets total share tmp token
  bench_settings
  build_tools
  local tree="$tmp/before-tree"
  git worktree add -q --detach "$tree" "$BEFORE"
  echo "== go build ./cmd/rain at $BEFORE ($(git rev-parse --short "$BEFORE"))"
  (cd "$tree" && go build -o "$bin/rain-before" ./cmd/rain)
  git worktree remove --force "$tree"
  local bport aport
  # Each side's flags are split on spaces (unquoted on purpose).
  rain_env="${BEFORE_ENV:-}" rain_bin="$bin/rain-before" start_rain bport ${BEFORE_FLAGS:-}
  rain_env="${AFTER_ENV:-}" start_rain aport ${AFTER_FLAGS:-}
  local r n order
  for ((r = 1; r <= rounds; r++)); do
    order="before after"
    ((r % 2)) || order="after before"
    for n in $order; do
      local port=$aport
      [ "$n" = before ] && port=$bport
      saturate "$n" "$port" "$r" -admin-token "$token"
    done
    [ "${OPEN:-0}" = 1 ] || continue
    # Both at the same open-loop rate, LOAD x the round's lower saturated
    # goodput, as grab's "at R/s" runs.
    local eq
    eq=$(awk -v a="$(result_of "$tmp/before.sat.$r.out" goodput_rps)" \
      -v b="$(result_of "$tmp/after.sat.$r.out" goodput_rps)" -v s="$share" \
      'BEGIN { m = a < b ? a : b; printf "%d\n", m * s }')
    for n in $order; do
      local port=$aport
      [ "$n" = before ] && port=$bport
      load "$n" eq "$r" "$port" -pool "bench$r" -rate "$eq" -duration "$duration" -conns "$conns" \
        -user-prefix "e$r." -repeat "$repeat" -admin-token "$token"
    done
  done
  echo "== versus: $rounds round(s) of $duration, medians over rounds (errors: sums); before = $BEFORE${BEFORE_FLAGS:+ with $BEFORE_FLAGS}${BEFORE_ENV:+ and $BEFORE_ENV}${AFTER_FLAGS:+; after: the working tree with $AFTER_FLAGS}${AFTER_ENV:+; after with $AFTER_ENV}"
  print_row "versus: saturated" before sat
  print_row "versus: saturated" after sat
  figure "$(awk -v b="$(med before sat goodput_rps)" -v a="$(med after sat goodput_rps)" \
    -v bu="$(med before sat app_us)" -v au="$(med after sat app_us)" \
    -v br="$(med before sat redis_us)" -v ar="$(med after sat redis_us)" 'BEGIN {
    printf "versus: the working tree serves %.3fx the grabs/s of %s; rain CPU per answer %.3fx, with its Redis %.3fx\n", a / b, ENVIRON["BEFORE"], au / bu, (au + ar) / (bu + br) }')"
  if [ "${OPEN:-0}" = 1 ]; then
    local eqm
    eqm=$(med after eq offered_rps)
    print_row "$(printf 'versus: at %6.0f/s' "$eqm")" before eq
    print_row "$(printf 'versus: at %6.0f/s' "$eqm")" after eq
    figure "$(awk -v b50="$(med before eq p50_ms)" -v a50="$(med after eq p50_ms)" \
      -v b99="$(med before eq p99_ms)" -v a99="$(med after eq p99_ms)" 'BEGIN {
      printf "versus: open loop, the working tree / %s: p50 %.3fx, p99 %.3fx\n", ENVIRON["BEFORE"], a50 / b50, a99 / b99 }')"
  fi
  cleanup
}

# bench_pool: issue 5's overload test. rain with its worker pool on, then with
# --workers=off, each fresh on 4 shards: first its peak (saturated goodput with the
# pool on), then open-loop constant arrival rates of 2x and 4x that peak for
# POOL_DURATION (20s) each, every request on a connection of its own up to
# POOL_CONNS (3000), so the overload reaches rain instead of queueing in the
# driver. Figures: goodput, shed rate, p50/p99/p99.9 of accepted requests,
# errors. Note what the machine allows: the driver shares the 2 cores with
# rain and its shards, and its own ceiling (section driver) is about 3x rain's
# rate, so at 4x it also drops arrivals it cannot send: those are counted.
# Beside them, the floor: the same two floods against a server that answers
# a fixed grant at once (rainload fixed -server fasthttp, rain's HTTP server
# with nothing behind it): the latency the machine alone gives a request of
# this flood, which no admission can beat.
bench_pool() {
  need_tools redis-server curl
  local section=pool rate conns duration warmup inflight rounds repeat packets total share tmp token
  bench_settings
  build_tools
  local pd=${POOL_DURATION:-20s} pc=${POOL_CONNS:-3000} port peak m mode
  start_rain port
  saturate peak "$port" 1 -admin-token "$token"
  peak=$(awk -v g="$(result_of "$tmp/peak.sat.1.out" goodput_rps)" 'BEGIN { printf "%d\n", g }')
  cleanup
  for mode in on off; do
    start_rain port --workers "$mode"
    warm "pool-$mode" "$port" -pool over -admin-token "$token" -preload "$((peak * 200)):$((peak * 20000))" \
      -rate "$((peak / 2))" -conns 64 -user-prefix w -repeat "$repeat"
    for m in 2 4; do
      load "pool-$mode" "x$m" 1 "$port" -pool over -rate "$((peak * m))" -duration "$pd" \
        -max-inflight "$pc" -conns "$pc" -user-prefix "x$m." -repeat "$repeat" -admin-token "$token" -scrape
    done
    cleanup
  done
  start_fixed port fasthttp
  for m in 2 4; do
    load pool-floor "x$m" 1 "$port" -pool over -rate "$((peak * m))" -duration "$pd" \
      -max-inflight "$pc" -conns "$pc" -user-prefix "x$m." -repeat "$repeat"
  done
  cleanup
  figure "pool: peak (pool on, saturated): $peak grabs/s; then ${pd} at 2x and 4x, up to $pc connections"
  for m in 2 4; do
    print_row "pool: ${m}x on   " pool-on "x$m"
    print_row "pool: ${m}x off  " pool-off "x$m"
    print_row "pool: ${m}x floor" pool-floor "x$m"
  done
  for m in 2 4; do
    figure "$(awk -v m="$m" -v onc="$(med pool-on "x$m" batch_claims)" -v onms="$(med pool-on "x$m" batch_ms)" \
      -v offc="$(med pool-off "x$m" batch_claims)" -v offms="$(med pool-off "x$m" batch_ms)" 'BEGIN {
        printf "pool: at %dx, batches to the shards: pool on %.1f claims each, round trip %.2f ms; pool off %.1f claims, %.2f ms\n",
          m, onc, onms, offc, offms }')"
  done
  for m in 2 4; do
    figure "$(awk -v peak="$peak" -v m="$m" -v g="$(med pool-on "x$m" goodput_rps)" -v p99="$(med pool-on "x$m" p99_ms)" \
      -v shed="$(med pool-on "x$m" shed_p99_ms)" -v err="$(total pool-on "x$m" errors)" -v floor="$(med pool-floor "x$m" p99_ms)" 'BEGIN {
        printf "pool: at %dx with the pool on: goodput %.0f%% of the peak (target >= 90%%), accepted p99 %.1f ms (target <= 50 ms; a fixed answer under the same flood: %.1f ms), shed p99 %.1f ms (target <= 5 ms), errors %d (target 0)\n",
          m, 100 * g / peak, p99, floor, shed, err }')"
  done
}

# batch_totals PORT: "batches claims seconds" of the rain on PORT so far,
# summed over its shards: its batches of claims, the claims they held and
# their round trips (rain_shard_batch_claims, rain_shard_batch_duration_seconds).
batch_totals() {
  { curl -fsS --max-time 5 "http://127.0.0.1:$1/metrics" 2>/dev/null || true; } | awk '
    $1 ~ /^rain_shard_batch_claims_count\{/ { n += $2 }
    $1 ~ /^rain_shard_batch_claims_sum\{/ { c += $2 }
    $1 ~ /^rain_shard_batch_duration_seconds_sum\{/ { s += $2 }
    END { printf "%d %d %.6f\n", n, c, s }'
}

# add_batches OUT BEFORE AFTER: appends to the result line of rainload's
# output OUT the batches between two batch_totals: batch_claims (claims per
# batch, mean) and batch_ms (a batch's round trip, mean).
add_batches() {
  awk -v b="$2" -v a="$3" '
    BEGIN { split(b, x, " "); split(a, y, " "); n = y[1] - x[1]
      extra = sprintf(" batch_claims=%.1f batch_ms=%.2f", n ? (y[2] - x[2]) / n : 0, n ? 1000 * (y[3] - x[3]) / n : 0) }
    $1 == "result" { $0 = $0 extra }
    { print }' "$1" >"$1.tmp" && mv "$1.tmp" "$1"
}

# bench_memory: what a pool leaves on its shards, moment by moment, to its
# close. Two fresh shards on appendfsync always; rain serve on them; a pool
# of MEM_PACKETS (20000) packets whose window ends MEM_WINDOW (40) seconds
# after its preload; MEM_USERS (10000) users grab once each; rain settle
# --ledger confirms them all; the window ends; the pool closes. At each
# moment: used_memory summed over the shards, the keys' own memory (MEMORY
# USAGE of every key, summed) and the number of keys.
bench_memory() {
  need_tools redis-server redis-cli curl
  local section=memory rate conns duration warmup inflight rounds repeat packets total share tmp token
  bench_settings
  build_tools
  local packets=${MEM_PACKETS:-20000} users=${MEM_USERS:-10000} window=${MEM_WINDOW:-40}
  local p1 p2 rp sport shards pid ends i n
  start_redis p1 "$tmp/m1" always
  start_redis p2 "$tmp/m2" always
  shards="s1=1@127.0.0.1:$p1,s2=1@127.0.0.1:$p2"
  free_port rp
  "$bin/rain" serve --listen "127.0.0.1:$rp" --redis "$shards" --admin-token "$token" --user-auth none >"$tmp/memory-serve.log" 2>&1 &
  pid=$!
  started+=("$pid")
  wait_port "$pid" "$rp" rain "$tmp/memory-serve.log"
  moment() {
    local port used=0 keys=0 bytes=0 k
    for port in "$p1" "$p2"; do
      used=$((used + $(redis-cli -p "$port" info memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }')))
      keys=$((keys + $(redis-cli -p "$port" dbsize)))
      for k in $(redis-cli -p "$port" --scan); do bytes=$((bytes + $(redis-cli -p "$port" memory usage "$k"))); done
    done
    figure "$(awk -v m="$1" -v u="$used" -v b="$bytes" -v k="$keys" 'BEGIN {
      printf "memory: %-28s used_memory %6.2f MB   the keys %9.1f KB   %3d keys\n", m, u / 1e6, b / 1e3, k }')"
  }
  moment "empty (rain serve started)"
  ends=$(($(date +%s) + window))
  curl -fsS -o /dev/null -H "Authorization: Bearer $token" "http://127.0.0.1:$rp/admin/pools" -d \
    "{\"pool_id\":\"mem\",\"total_cents\":$((packets * 100)),\"count\":$packets,\"ends_at\":\"$(date -u -d "@$ends" +%Y-%m-%dT%H:%M:%SZ)\"}"
  moment "preloaded"
  "$bin/rainload" -url "http://127.0.0.1:$rp" -pool mem -rate $((users / 5)) -duration 5s -repeat 0 -users "$users" \
    -progress 0 >"$tmp/memory-load.out" 2>&1
  moment "after the grabs"
  free_port sport
  "$bin/rain" settle --redis "$shards" --ledger "$tmp/memory-ledger.jsonl" --listen "127.0.0.1:$sport" --consumer bench \
    >"$tmp/memory-settle.log" 2>&1 &
  started+=($!)
  for ((i = 0; i < 3000; i++)); do
    n=$(metric_of "http://127.0.0.1:$sport/metrics" rain_settle_delivered_total)
    [ "$n" -ge "$users" ] && break
    sleep 0.1
  done
  sleep 1 # the last batch acknowledged and trimmed
  moment "every grant settled"
  while [ "$(date +%s)" -le "$ends" ]; do sleep 1; done
  moment "window ended, nothing held"
  curl -fsS -o /dev/null -X POST -H "Authorization: Bearer $token" "http://127.0.0.1:$rp/admin/pools/mem/close"
  moment "closed"
  cleanup
}

# bench_soldout: issue 7's flood after a sell-out. rain on 4 shards with a pool
# sold out, saturated with grabs of new users (every answer sold_out, from the
# local memory of empty sub-pools and the holders' filter), beside the baseline
# started with -fixed, a net/http handler that only decodes and validates the
# request and answers a fixed sold_out JSON: the ceiling of answering locally.
# Same saturated load as grab (RATE/s offered, INFLIGHT over CONNS), in
# alternating rounds; answers/s are medians. Target: rain >= 0.9x the ceiling.
bench_soldout() {
  need_tools redis-server curl
  local section=soldout rate conns duration warmup inflight rounds repeat packets total share tmp token
  bench_settings
  build_tools
  local rport fp br r n order
  start_rain rport
  # -fixed answers without Redis, but the baseline pings its Redis at start.
  start_redis br "$tmp/fixed-redis"
  free_port fp
  "$bin/baseline" -fixed -listen "127.0.0.1:$fp" -redis "127.0.0.1:$br" -admin-token "$token" \
    >"$tmp/fixed.log" 2>&1 &
  started+=($!)
  app_of[$fp]=$! redis_of[$fp]=$redis_pid
  wait_port $! "$fp" "baseline -fixed" "$tmp/fixed.log"
  # Sell the pool out: 1,000 packets, then a second of grabs.
  warm rain "$rport" -pool gone -admin-token "$token" -preload "1000:100000" \
    -rate 20000 -conns 64 -user-prefix sell -repeat 0
  for ((r = 1; r <= rounds; r++)); do
    order="rain fixed"
    ((r % 2)) || order="fixed rain"
    for n in $order; do
      local port=$rport
      [ "$n" = fixed ] && port=$fp
      load "$n" sat "$r" "$port" -pool gone -rate "$rate" -duration "$duration" \
        -max-inflight "$inflight" -conns "$conns" -user-prefix "f$r." -repeat 0
    done
  done
  echo "== soldout: $rounds round(s) of $duration, $rate/s offered, -max-inflight $inflight -conns $conns"
  print_row "soldout:" rain sat
  print_row "soldout:" fixed sat
  figure "$(awk -v r="$(med rain sat goodput_rps)" -v f="$(med fixed sat goodput_rps)" 'BEGIN {
    printf "soldout: rain answers a sold-out pool at %.2fx the fixed-answer handler (target >= 0.90x)\n", r / f }')"
  cleanup
}

# bench_driver: issue 4 asks that the driver sustain at least twice the rate rain
# reaches on this machine, against a fixed-answer server. Both are measured the
# same way, saturated (DRIVER_RATE/s and RATE/s offered, INFLIGHT in flight over
# CONNS connections), in alternating rounds: the ceiling is what `rainload fixed`
# answered per second (it shares the cores with the driver, as rain does; it is a
# minimal HTTP/1.1 server so that its share stays small), rain's rate its
# goodput. The verdict line says whether the ratio is at least 2.
bench_driver() {
  need_tools redis-server curl
  local section=driver rate conns duration warmup inflight rounds repeat packets total share tmp token
  bench_settings
  local drate=${DRIVER_RATE:-200000}
  build_tools
  local rport fport
  start_rain rport
  start_fixed fport

  local r n order
  for ((r = 1; r <= rounds; r++)); do
    order="fixed rain"
    ((r % 2)) || order="rain fixed"
    for n in $order; do
      if [ "$n" = rain ]; then
        saturate rain "$rport" "$r" -admin-token "$token" -scrape
      else
        warm fixed "$fport" -pool ceiling -rate "$drate" -max-inflight "$inflight" -conns "$conns"
        load fixed sat "$r" "$fport" -pool ceiling -rate "$drate" -duration "$duration" \
          -max-inflight "$inflight" -conns "$conns" -repeat "$repeat"
      fi
    done
  done

  echo "== driver: $rounds round(s) of $duration, -max-inflight $inflight -conns $conns, medians over rounds"
  local ceiling rain_rate fdrop
  ceiling=$(med fixed sat achieved_rps)
  rain_rate=$(med rain sat goodput_rps)
  fdrop=$(total fixed sat dropped)
  figure "$(awk -v c="$ceiling" -v o="$drate" -v d="$fdrop" 'BEGIN {
    printf "driver: ceiling %7.0f req/s against rainload fixed (%s%.0f/s offered)\n", c, (d > 0 ? "" : "not reached: all of "), o }')"
  print_row "driver:" rain sat
  figure "$(awk -v c="$ceiling" -v r="$rain_rate" 'BEGIN {
    x = c / r
    verdict = x >= 2 ? "the driver sustains at least 2x the rate rain reaches here (issue 4: >= 2x)" : \
      "the driver CANNOT sustain 2x the rate rain reaches on this machine (issue 4 asks >= 2x)"
    printf "driver: ceiling/rain %.2fx: %s\n", x, verdict }')"
  cleanup
}

# bench_budget: issue 30's budget of one grab: where its microseconds go, in
# rain's process and in its Redis, with rain on 1 shard and on 4 shards, each
# at 64 and 256 connections, beside what they are measured against, all in one
# run. Targets, each started once: rain on 1 shard and rain on 4 shards (both
# with --debug-listen), the minimal design (loadtest/baseline on one Redis
# with appendfsync BASELINE_FSYNC, always unless set: the durability rain
# runs at), and the floors: `rainload fixed -server net/http` and `-server
# fasthttp`, each reading the body and writing the same fixed grant. Each
# round runs every target saturated (as saturate does: RATE/s offered,
# DRIVER_RATE/s to the floors, a fresh pool of PACKETS, here 500,000 unless
# set, per run) at each of BUDGET_CONNS ("64 256") connections, the targets
# in turn, odd rounds forward and even rounds backward; figures are medians
# over ROUNDS. The Redis servers run without automatic AOF rewrites (the
# pools of every run pile up in them; a rewrite's fork is no part of a
# grab). Around each measured run:
#
#   CPU       process and Redis µs per answer from /proc (as load does).
#   switches  the context switches of the target's process per answer, over
#             all its threads (voluntary + nonvoluntary, /proc/PID/task/*/status):
#             its wake-ups.
#   allocs    for rain, its heap allocations per answer: /debug/pprof/allocs
#             before and after, the difference in allocated objects (see
#             alloc_objects).
#   profile   for rain, a CPU profile of the run (/debug/pprof/profile on its
#             --debug-listen, the run's length less a second). The rounds'
#             profiles of a configuration are merged, and each sample counts
#             in the first row of budget_categories whose pattern a frame of
#             its stack matches: µs per grab = share × the process's µs.
#   Redis     for rain and the minimal design: CONFIG RESETSTAT before, INFO
#             commandstats after (EVALSHA calls and usec; usec is wall time
#             inside the scripts, preemptions on this shared machine
#             included), and with perf, a profile of the Redis processes over
#             the run (perf record -F PERF_HZ (499) with DWARF stacks),
#             classified by redis_categories: the scripts, the AOF (buffer,
#             write, fsync), reading, writing, the event loop and the rest;
#             µs per grab = share × Redis's µs.
#   batches   for rain, rain_shard_batch_claims from /metrics before and after:
#             batches, claims, claims per batch (mean; median and p90
#             interpolated within its buckets 1, 2, 4, ... 1024), so Redis's
#             µs per batch and per claim.
#
# After the rounds, for each rain at each connection count: `strace -c -f`
# attached to its process for STRACE_WINDOW (2) seconds of a saturated run,
# futex and all syscalls counted per grab answered meanwhile (strace stops
# the process at every syscall, so it serves a fraction of its rate then:
# counts, never times); then `go test -run x -bench ClaimMany -count
# BENCH_COUNT (3) ./internal/lua`: Redis's CPU per claim of the claim path
# alone at batches of 1 to 128, and of a pipelined batch of the minimal
# design's script alone; then four copies of its batches of 16 at once,
# FOUR_BENCHTIME (4s) each, each on a Redis of its own (the floor of four
# shards' Redis on these cores, see budget_four_at_once); then `go test
# -run x -bench RoundTrip -count BENCH_COUNT ./internal/shard`: the CPU one
# round trip to a shard costs
# rain's process, through go-redis and on a bare connection (the kernel's
# floor). Last, the figures and the table. PROFILES=DIR keeps
# there the merged profiles of rain and the rain binary, for go tool pprof,
# and the Redis samples as classify reads them (NAME.redis-stacks.txt).
# Needs perf for the split of Redis's CPU and strace for the futex counts
# (Debian/Ubuntu: apt-get install -y linux-perf strace); without them those
# rows are left out.
bench_budget() {
  need_tools redis-server redis-cli curl
  local section=budget rate conns duration warmup inflight rounds repeat packets total share tmp token
  bench_settings
  # A run grants well under 500,000 here; a smaller pool preloads faster.
  packets=${PACKETS:-500000} total=${TOTAL_CENTS:-$((${PACKETS:-500000} * 100))}
  local BASELINE_FSYNC=${BASELINE_FSYNC:-always} drate=${DRIVER_RATE:-200000} perf_hz=${PERF_HZ:-499}
  local redis_args=(--auto-aof-rewrite-percentage 0)
  local conns_list=${BUDGET_CONNS:-64 256} window=${STRACE_WINDOW:-2} profile_s
  profile_s=$(awk -v d="$duration" 'BEGIN { s = d ~ /ms$/ ? d / 1000 : d + 0; s = int(s) - 1; print s < 1 ? 1 : s }')
  build_tools
  have_perf || true
  local r1 r4 bport fnet ffast d1 d4
  free_port d1
  rain_shards=1 start_rain r1 --debug-listen "127.0.0.1:$d1"
  free_port d4
  rain_shards=4 start_rain r4 --debug-listen "127.0.0.1:$d4"
  debug_of[$r1]=$d1 debug_of[$r4]=$d4
  start_baseline bport
  start_fixed fnet net/http
  start_fixed ffast fasthttp
  local -A port_of=([rain1]=$r1 [rain4]=$r4 [minimal]=$bport [nethttp]=$fnet [fasthttp]=$ffast)
  local targets="rain1 rain4 minimal nethttp fasthttp" r c n order
  for ((r = 1; r <= rounds; r++)); do
    order=$targets
    ((r % 2)) || order=$(tr ' ' '\n' <<<"$targets" | tac | tr '\n' ' ')
    for c in $conns_list; do
      for n in $order; do
        conns=$c inflight=$c budget_run "$n-$c" "${port_of[$n]}" "${c}r$r"
      done
    done
  done
  for c in $conns_list; do
    for n in rain1 rain4; do
      conns=$c inflight=$c budget_strace "$n-$c" "${port_of[$n]}" "${c}t"
    done
  done
  echo "== budget: go test -run x -bench ClaimMany -count ${BENCH_COUNT:-3} ./internal/lua"
  go test -run x -bench ClaimMany -count "${BENCH_COUNT:-3}" ./internal/lua | grep '^Benchmark' >"$tmp/claimmany.out"
  cat "$tmp/claimmany.out"
  budget_four_at_once
  echo "== budget: go test -run x -bench RoundTrip -count ${BENCH_COUNT:-3} ./internal/shard"
  go test -run x -bench RoundTrip -count "${BENCH_COUNT:-3}" ./internal/shard | grep '^Benchmark' >"$tmp/roundtrip.out"
  cat "$tmp/roundtrip.out"
  budget_report
  cleanup
}

# debug_of[PORT]: the --debug-listen port of the rain on PORT (budget).
declare -A debug_of

# ctx_switches PID: the voluntary and nonvoluntary context switches of all of
# PID's threads so far.
ctx_switches() {
  cat /proc/"$1"/task/*/status 2>/dev/null |
    awk '$1 == "voluntary_ctxt_switches:" || $1 == "nonvoluntary_ctxt_switches:" { s += $2 } END { print s + 0 }'
}

# slowest_fsync PORT: the longest AOF fsync (appendfsync always) of the Redis
# processes of the target on PORT since the last call, in ms (0: none took 10 ms
# or more), from their latency monitors, which it resets. One slow fsync holds
# every write of its shard for its length: it is often what a p99 or p99.9 of a
# run measures, and a disk's stall shows on every shard at once.
slowest_fsync() {
  local p max=0 v
  command -v redis-cli >/dev/null || { echo 0; return 0; }
  for p in $(redis_ports "$1"); do
    # LATENCY LATEST: event, when, the latest ms, the most ms since the reset.
    v=$(redis-cli -p "$p" latency latest 2>/dev/null | awk '$0 == "aof-fsync-always" { getline; getline; getline; print; exit }')
    redis-cli -p "$p" latency reset >/dev/null 2>&1 || true
    [ -n "$v" ] && [ "$v" -gt "$max" ] && max=$v
  done
  echo "$max"
}

# redis_ports PORT: the ports of the Redis processes of the target on PORT.
redis_ports() {
  if [ -n "${shards_of[$1]:-}" ]; then
    tr ',' '\n' <<<"${shards_of[$1]}" | sed 's/.*://'
  elif [ -n "${redis_ports_of[$1]:-}" ]; then
    tr ' ' '\n' <<<"${redis_ports_of[$1]}"
  fi
}

# evalsha_stats PORT...: "calls usec" of EVALSHA summed over the redis-servers
# on the PORTs, from INFO commandstats.
evalsha_stats() {
  local p
  for p in "$@"; do redis-cli -p "$p" info commandstats; done | tr -d '\r' |
    awk -F'[:,=]' '$1 == "cmdstat_evalsha" { c += $3; u += $5 } END { printf "%d %d\n", c, u }'
}

# batch_hist PORT: rain_shard_batch_claims of the rain on PORT, summed over
# its shards: a line "LE COUNT" per bucket, then "sum S" and "count N".
batch_hist() {
  curl -fsS --max-time 5 "http://127.0.0.1:$1/metrics" | awk '
    $1 ~ /^rain_shard_batch_claims_bucket\{/ { match($1, /le="[^"]*"/); b[substr($1, RSTART + 4, RLENGTH - 5)] += $2 }
    $1 ~ /^rain_shard_batch_claims_sum\{/ { s += $2 }
    $1 ~ /^rain_shard_batch_claims_count\{/ { n += $2 }
    END { for (le in b) print le, b[le]; print "sum", s; print "count", n }'
}

# batch_stats BEFORE AFTER: "batches claims mean p50 p90 p50_le p90_le" of the
# batches between two batch_hist snapshots: a quantile interpolated linearly
# within its bucket, as Prometheus's histogram_quantile does (a batch of 1 is
# 1), and the upper bound of its bucket.
batch_stats() {
  awk 'NR == FNR { a[$1] = $2; next } { d[$1] = $2 - a[$1] }
    function ub(p, r, i) { # the upper bound of the bucket of quantile p
      r = p * d["count"]
      for (i = 1; i <= k; i++) if (d[les[i]] >= r) return les[i]
      return les[k]
    }
    function q(p, r, i, lo, prev) {
      r = p * d["count"]; lo = 0; prev = 0
      for (i = 1; i <= k; i++) {
        if (d[les[i]] >= r) return i == 1 ? les[1] : lo + (les[i] - lo) * (r - prev) / (d[les[i]] - prev)
        lo = les[i]; prev = d[les[i]]
      }
      return les[k]
    }
    END {
      k = 0
      for (le in d) if (le != "sum" && le != "count" && le != "+Inf") les[++k] = le + 0
      for (i = 2; i <= k; i++) for (j = i; j > 1 && les[j - 1] > les[j]; j--) { t = les[j]; les[j] = les[j - 1]; les[j - 1] = t }
      n = d["count"]
      printf "%d %d %.2f %.2f %.2f %d %d\n", n, d["sum"], n ? d["sum"] / n : 0, n ? q(0.5) : 0, n ? q(0.9) : 0, n ? ub(0.5) : 0, n ? ub(0.9) : 0
    }' "$1" "$2"
}

# budget_run NAME PORT ROUND: as saturate (a warm-up on a fresh pool, then one
# saturated run of kind "sat", RATE/s offered, or DRIVER_RATE/s to a fixed
# server), measuring around it what bench_budget says. Appended to the run's
# result line: csw (context switches per answer); with Redis, lua_us (EVALSHA
# usec per answer) and evalsha_usec (per call); for a rain, batches, claims,
# cpb (claims per batch, mean), cpb_p50, cpb_p90 (interpolated), cpb_p50_le,
# cpb_p90_le (their buckets' upper bounds), evalsha_per_batch,
# redis_batch_us and redis_claim_us (Redis CPU per batch, per claim). The
# rain's profile goes to $tmp/NAME.sat.ROUND.pprof, the classified perf
# samples of its Redis to .rshares.
budget_run() {
  local name=$1 port=$2 round=$3
  local pool=bench$round base="$tmp/$name.sat.$round" dbg=${debug_of[$port]:-} app=${app_of[$port]}
  local rpids=${redis_of[$port]:-} prep=(-admin-token "$token" -preload "$packets:$total") offer=$rate
  [ -n "$rpids" ] || prep=() offer=$drate # a fixed server: no pool, no Redis
  warm "$name" "$port" -pool "$pool" "${prep[@]}" -rate "$offer" -max-inflight "$inflight" -conns "$conns" \
    -user-prefix "w$round." -repeat "$repeat"
  local rports=() p c0 c1 prof="" perfp="" extra n
  if [ -n "$rpids" ]; then
    mapfile -t rports < <(redis_ports "$port")
    for p in "${rports[@]}"; do redis-cli -p "$p" config resetstat >/dev/null; done
    if [ "${perf_ok:-}" = yes ]; then
      perf record -q -F "$perf_hz" --call-graph dwarf,16384 -o "$base.perf" -p "${rpids// /,}" \
        -- sleep "$profile_s" >"$base.perf.log" 2>&1 &
      perfp=$!
    fi
  fi
  if [ -n "$dbg" ]; then
    batch_hist "$port" >"$base.h0"
    curl -fsS -H "Authorization: Bearer $token" -o "$base.pprof" \
      "http://127.0.0.1:$dbg/debug/pprof/profile?seconds=$profile_s" &
    prof=$!
  fi
  [ -z "$dbg" ] || curl -fsS -H "Authorization: Bearer $token" -o "$base.allocs0" "http://127.0.0.1:$dbg/debug/pprof/allocs"
  c0=$(ctx_switches "$app")
  load "$name" sat "$round" "$port" -pool "$pool" -rate "$offer" -duration "$duration" \
    -max-inflight "$inflight" -conns "$conns" -user-prefix "s$round." -repeat "$repeat"
  c1=$(ctx_switches "$app")
  [ -z "$dbg" ] || curl -fsS -H "Authorization: Bearer $token" -o "$base.allocs1" "http://127.0.0.1:$dbg/debug/pprof/allocs"
  [ "$(result_of "$base.out" sold_out)" = 0 ] ||
    echo "$section: warning: $name sold out during round $round: raise PACKETS or shorten DURATION" >&2
  n=$(result_of "$base.out" answered)
  extra=$(awk -v c=$((c1 - c0)) -v n="$n" 'BEGIN { printf "csw=%.3f", n ? c / n : 0 }')
  if [ -n "$dbg" ]; then
    extra+=$(awk -v a="$(alloc_objects "$base.allocs0" "$base.allocs1")" -v n="$n" 'BEGIN { printf " allocs=%.1f", n ? a / n : 0 }')
  fi
  local calls=0 usec=0
  if [ -n "$rpids" ]; then
    read -r calls usec < <(evalsha_stats "${rports[@]}")
    extra+=$(awk -v c="$calls" -v u="$usec" -v n="$n" 'BEGIN { printf " lua_us=%.2f evalsha_usec=%.2f", n ? u / n : 0, c ? u / c : 0 }')
    if [ -n "$perfp" ]; then
      wait "$perfp" || echo "$section: $name: perf record failed in round $round: $(cat "$base.perf.log")" >&2
      perf_stacks "$base.perf" >"$base.rstacks"
      classify "${redis_categories[@]}" <"$base.rstacks" >"$base.rshares"
      if [ -n "${PROFILES:-}" ]; then
        mkdir -p "$PROFILES"
        cat "$base.rstacks" >>"$PROFILES/$name.redis-stacks.txt"
      fi
      rm -f "$base.perf" "$base.rstacks"
    fi
  fi
  if [ -n "$dbg" ]; then
    wait "$prof" || echo "$section: $name: no CPU profile of round $round" >&2
    batch_hist "$port" >"$base.h1"
    local batches claims mean p50 p90 p50le p90le
    read -r batches claims mean p50 p90 p50le p90le < <(batch_stats "$base.h0" "$base.h1")
    extra+=$(awk -v b="$batches" -v cl="$claims" -v m="$mean" -v p50="$p50" -v p90="$p90" -v calls="$calls" \
      -v l50="$p50le" -v l90="$p90le" -v n="$n" -v rus="$(result_of "$base.out" redis_us)" 'BEGIN {
        printf " batches=%d claims=%d cpb=%.2f cpb_p50=%.2f cpb_p90=%.2f cpb_p50_le=%d cpb_p90_le=%d evalsha_per_batch=%.2f redis_batch_us=%.1f redis_claim_us=%.2f",
          b, cl, m, p50, p90, l50, l90, b ? calls / b : 0, b ? rus * n / b : 0, cl ? rus * n / cl : 0 }')
  fi
  awk -v x="$extra" '$1 == "result" { $0 = $0 " " x } { print }' "$base.out" >"$base.out.tmp" && mv "$base.out.tmp" "$base.out"
}

# budget_strace NAME PORT ROUND: a saturated run on a fresh pool with strace
# -c -f attached to the rain's process for $window seconds in its middle;
# futex calls and all syscalls per grab answered while it was attached, into
# $tmp/NAME.strace.fig ("FUTEX SYSCALLS GRABS", then "NAME PER-GRAB" of each
# syscall made at least once per 100 grabs, in strace's order: by time).
budget_strace() {
  local name=$1 port=$2 round=$3 app=${app_of[$2]} g0 g1 loader
  command -v strace >/dev/null 2>&1 || {
    echo "$section: strace not on PATH (Debian/Ubuntu: apt-get install -y strace): no futex counts" >&2
    return 0
  }
  warm "$name" "$port" -pool "bench$round" -admin-token "$token" -preload "$packets:$total" -rate "$rate" \
    -max-inflight "$inflight" -conns "$conns" -user-prefix "w$round." -repeat "$repeat"
  echo "== $section: $name under strace -c -f for ${window}s of a saturated run"
  "$bin/rainload" -url "http://127.0.0.1:$port" -progress 0 -pool "bench$round" -rate "$rate" \
    -duration "$((window + 3))s" -max-inflight "$inflight" -conns "$conns" -user-prefix "s$round." \
    -repeat "$repeat" >"$tmp/$name.strace.load" 2>&1 &
  loader=$!
  sleep 1
  g0=$(grabs_total "$port")
  timeout -s INT "$window" strace -c -f -p "$app" -o "$tmp/$name.strace" >/dev/null 2>&1 || true
  g1=$(grabs_total "$port")
  wait "$loader" || true
  awk -v g=$((g1 - g0)) '
    $NF == "futex" { f = $4 }
    $NF ~ /^[a-z_0-9]+$/ && $NF != "total" && $NF != "syscall" && $4 ~ /^[0-9]+$/ {
      s += $4; if ($4 / (g ? g : 1) >= 0.01) top = top sprintf(" %s %.2f", $NF, $4 / (g ? g : 1)) }
    END { printf "%.3f %.3f %d%s\n", g ? f / g : 0, g ? s / g : 0, g, top }' "$tmp/$name.strace" >"$tmp/$name.strace.fig"
}

# grabs_total PORT: the grabs the rain on PORT has answered, all statuses.
grabs_total() {
  curl -fsS --max-time 5 "http://127.0.0.1:$1/metrics" | awk '$1 ~ /^rain_grabs_total\{/ { s += $2 } END { printf "%d\n", s }'
}

# budget_label KEY RULE...: the label of KEY among the RULEs ("key ;; label ;; ...").
budget_label() {
  local k=$1 line
  shift
  for line in "$@"; do
    if [ "${line%% ;; *}" = "$k" ]; then
      line=${line#* ;; }
      echo "${line%% ;; *}"
      return
    fi
  done
  echo "$k"
}

# budget_cell CFG KEY [FORMAT]: the median of KEY over CFG's runs.
budget_cell() { med "$1" sat "$2" | awk -v f="${3:-%.1f}" '{ printf f "\n", $1 }'; }

# budget_share SHARES US: "µs (share%)" for each line "key seconds" of
# classify's output SHARES, as "key cell" lines (US: the µs the shares split).
budget_share() {
  awk -v a="$2" '$1 == "total" { t = $2 } { v[$1] = $2 }
    END { for (k in v) if (k != "total") printf "%s %.1f (%.0f%%)\n", k, t ? a * v[k] / t : 0, t ? 100 * v[k] / t : 0 }' "$1"
}

# budget_row LABEL VALUE...: one line of the table.
budget_row() {
  local l=$1 v line
  shift
  line=$(printf '%-46s' "$l")
  for v in "$@"; do line+=$(printf ' %16s' "$v"); done
  figure "budget: $line"
}

# budget_report: the figures of each configuration, then the table of the
# budget (µs per grab answered, medians over the rounds; a category's µs are
# its share of the merged profiles × the median µs) and the floors.
budget_report() {
  local n c cfg label k v
  echo "== budget: $rounds round(s) of $duration per target and connection count, medians over rounds;" \
    "rain and the minimal design saturated at $rate/s offered, the fixed servers at $drate/s; REPEAT=$repeat;" \
    "rain's shards on appendfsync $rain_fsync, the minimal design's Redis on $BASELINE_FSYNC"
  local cols=() heads=()
  for n in rain1 rain4; do
    for c in $conns_list; do
      cols+=("$n-$c")
      heads+=("$([ $n = rain1 ] && echo "1 shard" || echo "4 shards")/$c")
    done
  done
  # Shares: the rounds' profiles merged, the Redis samples added up.
  local -A cellv
  for cfg in "${cols[@]}" $(for c in $conns_list; do echo "minimal-$c"; done); do
    if [ "${cfg%%-*}" != minimal ]; then
      if [ -n "${PROFILES:-}" ]; then
        mkdir -p "$PROFILES"
        cp "$bin/rain" "$PROFILES/rain"
        go tool pprof -proto "$bin/rain" "$tmp/$cfg".sat.*.pprof >"$PROFILES/$cfg.pprof" 2>/dev/null || true
      fi
      pprof_stacks "$bin/rain" "$tmp/$cfg".sat.*.pprof | classify "${budget_categories[@]}" >"$tmp/$cfg.shares"
      while read -r k v; do cellv[$cfg.p.$k]=$v; done < <(budget_share "$tmp/$cfg.shares" "$(med "$cfg" sat app_us)")
    fi
    sum_shares "$tmp/$cfg".sat.*.rshares >"$tmp/$cfg.rshares"
    [ -s "$tmp/$cfg.rshares" ] || continue
    while read -r k v; do cellv[$cfg.r.$k]=$v; done < <(budget_share "$tmp/$cfg.rshares" "$(med "$cfg" sat redis_us)")
  done

  local pkeys=(read http handler write admission handoffs goredis pipeline grab gc other)
  local rkeys=(scripts aof rread rwrite other)
  for c in $conns_list; do
    for n in rain1 rain4; do
      cfg="$n-$c" label="rain on $([ $n = rain1 ] && echo "1 shard" || echo "4 shards"), $c conns"
      figure "$(awk -v l="$label" -v g="$(med "$cfg" sat goodput_rps)" -v a="$(med "$cfg" sat app_us)" \
        -v r="$(med "$cfg" sat redis_us)" -v mg="$(med "minimal-$c" sat goodput_rps)" \
        -v ma="$(med "minimal-$c" sat app_us)" -v mr="$(med "minimal-$c" sat redis_us)" 'BEGIN {
        printf "budget: %s: %.0f grabs/s, CPU per grab %.1f + %.1f = %.1f us (process + Redis); the minimal design %.0f grabs/s, %.1f + %.1f = %.1f us: rain/minimal CPU per grab %.2fx, grabs/s %.2fx\n",
          l, g, a, r, a + r, mg, ma, mr, ma + mr, (a + r) / (ma + mr), g / mg }')"
      local line="budget: $label: process (profile, $(awk '$1 == "total" { printf "%.1f", $2 }' "$tmp/$cfg.shares") s of samples):"
      for k in "${pkeys[@]}"; do line+=" $k ${cellv[$cfg.p.$k]:-0.0 (0%)},"; done
      figure "${line%,} us per grab"
      if [ -s "$tmp/$cfg.rshares" ]; then
        line="budget: $label: Redis (perf, $(awk '$1 == "total" { printf "%d", $2 }' "$tmp/$cfg.rshares") samples):"
        for k in "${rkeys[@]}"; do line+=" $k ${cellv[$cfg.r.$k]:-0.0 (0%)},"; done
        figure "${line%,} us per grab"
      fi
      figure "$(awk -v l="$label" -v cpb="$(med "$cfg" sat cpb)" -v p50="$(med "$cfg" sat cpb_p50)" \
        -v p90="$(med "$cfg" sat cpb_p90)" -v e="$(med "$cfg" sat evalsha_per_batch)" \
        -v l50="$(med "$cfg" sat cpb_p50_le)" -v l90="$(med "$cfg" sat cpb_p90_le)" \
        -v rb="$(med "$cfg" sat redis_batch_us)" -v rc="$(med "$cfg" sat redis_claim_us)" \
        -v eu="$(med "$cfg" sat evalsha_usec)" -v sc="${cellv[$cfg.r.scripts]:-}" -v r="$(med "$cfg" sat redis_us)" 'BEGIN {
        split(sc, s, " "); f = r > 0 ? s[1] / r : 0
        printf "budget: %s: claims per batch %.1f mean, median %.1f (bucket <= %d), p90 %.1f (bucket <= %d); %.2f EVALSHA per batch (INFO: %.0f us each, wall time); Redis CPU per batch %.0f us (the scripts %.0f), per claim %.1f us (the scripts %.1f)\n",
          l, cpb, p50, l50, p90, l90, e, eu, rb, rb * f, rc, rc * f }')"
      local strace_fig="" f s g each
      if [ -s "$tmp/$cfg.strace.fig" ]; then
        read -r f s g each <"$tmp/$cfg.strace.fig"
        strace_fig=$(printf '; under strace -c -f: %.2f futex calls, %.1f syscalls per grab (%d grabs: %s)' "$f" "$s" "$g" "$each")
      fi
      figure "$(awk -v l="$label" -v cs="$(med "$cfg" sat csw)" -v mcs="$(med "minimal-$c" sat csw)" -v st="$strace_fig" 'BEGIN {
        printf "budget: %s: %.2f context switches per grab (the minimal design %.2f)%s\n", l, cs, mcs, st }')"
    done
    if [ -s "$tmp/minimal-$c.rshares" ]; then
      line="budget: the minimal design, $c conns: Redis (perf, $(awk '$1 == "total" { printf "%d", $2 }' "$tmp/minimal-$c.rshares") samples):"
      for k in "${rkeys[@]}"; do line+=" $k ${cellv[minimal-$c.r.$k]:-0.0 (0%)},"; done
      figure "${line%,} us per grab; EVALSHA $(budget_cell "minimal-$c" evalsha_usec) us each (INFO, wall time)"
    fi
    for n in nethttp fasthttp; do
      figure "$(awk -v n="$([ $n = nethttp ] && echo net/http || echo fasthttp)" -v c="$c" \
        -v g="$(med "$n-$c" sat goodput_rps)" -v a="$(med "$n-$c" sat app_us)" -v cs="$(med "$n-$c" sat csw)" 'BEGIN {
        printf "budget: floor: a fixed grant on %s, %s conns: %.0f requests/s, %.1f us CPU per request, %.2f context switches per request\n", n, c, g, a, cs }')"
    done
  done

  echo "== budget: the budget of one grab: CPU us per grab answered (share of rain's profile, of its Redis's perf samples)"
  budget_row "" "${heads[@]}"
  local out
  for k in "${pkeys[@]}"; do
    out=()
    for cfg in "${cols[@]}"; do out+=("${cellv[$cfg.p.$k]:-0.0 (0%)}"); done
    budget_row "$(budget_label "$k" "${budget_categories[@]}" 'other ;; other (runtime, unmatched) ;; ;; ')" "${out[@]}"
  done
  out=(); for cfg in "${cols[@]}"; do out+=("$(budget_cell "$cfg" app_us)"); done
  budget_row "process, total" "${out[@]}"
  if [ -s "$tmp/${cols[0]}.rshares" ]; then
    for k in "${rkeys[@]}"; do
      out=()
      for cfg in "${cols[@]}"; do out+=("${cellv[$cfg.r.$k]:-0.0 (0%)}"); done
      budget_row "Redis: $(budget_label "$k" "${redis_categories[@]}" 'other ;; event loop, cron, the rest ;; ;; ')" "${out[@]}"
    done
  fi
  out=(); for cfg in "${cols[@]}"; do out+=("$(budget_cell "$cfg" redis_us)"); done
  budget_row "Redis, total" "${out[@]}"
  out=(); for cfg in "${cols[@]}"; do
    out+=("$(awk -v a="$(med "$cfg" sat app_us)" -v r="$(med "$cfg" sat redis_us)" 'BEGIN { printf "%.1f\n", a + r }')")
  done
  budget_row "process + Redis" "${out[@]}"
  out=(); for cfg in "${cols[@]}"; do
    out+=("$(awk -v a="$(med "minimal-${cfg#*-}" sat app_us)" -v r="$(med "minimal-${cfg#*-}" sat redis_us)" 'BEGIN { printf "%.1f + %.1f\n", a, r }')")
  done
  budget_row "the minimal design: process + Redis" "${out[@]}"
  out=(); for cfg in "${cols[@]}"; do
    out+=("$(awk -v a="$(med "$cfg" sat app_us)" -v r="$(med "$cfg" sat redis_us)" \
      -v ma="$(med "minimal-${cfg#*-}" sat app_us)" -v mr="$(med "minimal-${cfg#*-}" sat redis_us)" 'BEGIN { printf "%.2fx\n", (a + r) / (ma + mr) }')")
  done
  budget_row "rain / minimal, CPU per grab" "${out[@]}"
  out=(); for cfg in "${cols[@]}"; do
    out+=("$(awk -v g="$(med "$cfg" sat goodput_rps)" -v m="$(med "minimal-${cfg#*-}" sat goodput_rps)" 'BEGIN { printf "%.0f / %.0f\n", g, m }')")
  done
  budget_row "grabs/s, rain / minimal" "${out[@]}"
  out=(); for cfg in "${cols[@]}"; do
    out+=("$(awk -v m="$(med "$cfg" sat cpb)" -v p="$(med "$cfg" sat cpb_p50_le)" -v q="$(med "$cfg" sat cpb_p90_le)" 'BEGIN { printf "%.1f, <=%d, <=%d\n", m, p, q }')")
  done
  budget_row "claims per batch: mean, median, p90" "${out[@]}"
  out=(); for cfg in "${cols[@]}"; do out+=("$(budget_cell "$cfg" redis_batch_us %.0f)"); done
  budget_row "Redis CPU per batch, us" "${out[@]}"
  out=(); for cfg in "${cols[@]}"; do out+=("$(budget_cell "$cfg" redis_claim_us)"); done
  budget_row "Redis CPU per claim, us" "${out[@]}"
  out=(); for cfg in "${cols[@]}"; do out+=("$(budget_cell "$cfg" evalsha_usec %.0f)"); done
  budget_row "EVALSHA usec per call (INFO: wall time)" "${out[@]}"
  out=(); for cfg in "${cols[@]}"; do
    out+=("$(awk -v a="$(med "$cfg" sat csw)" -v m="$(med "minimal-${cfg#*-}" sat csw)" 'BEGIN { printf "%.2f (%.2f)\n", a, m }')")
  done
  budget_row "context switches per grab (the minimal's)" "${out[@]}"
  out=(); for cfg in "${cols[@]}"; do out+=("$(budget_cell "$cfg" allocs)"); done
  budget_row "heap allocations per grab, rain's process" "${out[@]}"
  out=(); for cfg in "${cols[@]}"; do
    if [ -s "$tmp/$cfg.strace.fig" ]; then out+=("$(awk '{ printf "%.2f / %.1f\n", $1, $2 }' "$tmp/$cfg.strace.fig")"); else out+=(-); fi
  done
  budget_row "under strace: futex / syscalls per grab" "${out[@]}"
  echo "== budget: the floors, same run: CPU us per request and requests/s, at $(echo $conns_list | tr ' ' '/') conns"
  for n in nethttp fasthttp; do
    out=()
    for c in $conns_list; do
      out+=("$(awk -v a="$(med "$n-$c" sat app_us)" -v g="$(med "$n-$c" sat goodput_rps)" 'BEGIN { printf "%.1f us %.0f/s\n", a, g }')")
    done
    budget_row "a fixed grant on $([ $n = nethttp ] && echo net/http || echo fasthttp)" "${out[@]}"
  done
  echo "== budget: the floors of Redis: the claim path alone (BenchmarkClaimMany), one batch per round trip and fsync"
  budget_claims "$tmp/claimmany.out"
  budget_four_report "$tmp/claimmany4.out" "$tmp/claimmany.out" "$(med rain4-64 sat app_us)" \
    "$(awk -v a="$(med minimal-64 sat app_us)" -v r="$(med minimal-64 sat redis_us)" 'BEGIN { print a + r }')"
  echo "== budget: the floor of a round trip to a shard in rain's process (BenchmarkRoundTrip): CPU us per round trip, medians"
  budget_roundtrip "$tmp/roundtrip.out"
}

# budget_four_at_once: the floor of four shards' Redis on this machine, for
# rain on 4 shards: four copies of the claim path alone at batches of 16 (the
# most a shard has in flight at 64 connections over 4 shards) run at once,
# each with its own always redis-server, so that four Redis processes take
# turns on the cores as rain's four shards do (nothing else runs meanwhile).
# Their lines go to $tmp/claimmany4.out for budget_report.
budget_four_at_once() {
  echo "== budget: four at once: go test -run x -bench 'ClaimMany/batch=16\$' -benchtime ${FOUR_BENCHTIME:-4s} ./internal/lua, four copies"
  go test -c -o "$tmp/lua.test" ./internal/lua
  local i pids=()
  for i in 1 2 3 4; do
    (cd internal/lua && "$tmp/lua.test" -test.run x -test.bench 'ClaimMany/batch=16$' \
      -test.benchtime "${FOUR_BENCHTIME:-4s}" | grep '^Benchmark' >"$tmp/claimmany4.$i") &
    pids+=($!)
  done
  wait "${pids[@]}"
  cat "$tmp"/claimmany4.[1-4] >"$tmp/claimmany4.out"
  cat "$tmp/claimmany4.out"
}

# budget_four_report FILE ALONE APP_US MIN_US: the median over FILE's four
# copies (budget_four_at_once) of Redis's CPU per claim and per batch, beside
# the same batch alone (ALONE, BenchmarkClaimMany's lines), and what rain on
# 4 shards at 64 connections would cost per grab with the process it was
# measured at (APP_US) and its Redis at that floor, against the minimal
# design's CPU per grab (MIN_US).
budget_four_report() {
  [ -s "$1" ] || return 0
  awk -v app="$3" -v min="$4" '
    FILENAME == ARGV[1] { if ($1 ~ /^BenchmarkClaimMany\/batch=16(-[0-9]+)?$/) for (i = 3; i < NF; i += 2) if ($(i + 1) == "redis-us/claim") alone = alone " " $i; next }
    { for (i = 3; i < NF; i += 2) { if ($(i + 1) == "redis-us/claim") c = c " " $i; if ($(i + 1) == "redis-us/batch") b = b " " $i } }
'"$awk_median"'
    END {
      pc = median(c)
      printf "budget: floor of four shards'"'"' Redis: the claim path alone at batches of 16, four at once: Redis %.1f us per claim, %.0f per batch (alone: %.1f per claim)\n",
        pc, median(b), median(alone)
      if (app > 0 && min > 0)
        printf "budget: rain on 4 shards, 64 conns, its process as measured and its Redis at that floor: %.1f + %.1f = %.1f us per grab, %.2fx the minimal design (target <= 0.7x)\n",
          app, pc, app + pc, (app + pc) / min
    }' "$2" "$1" | while IFS= read -r line; do figure "$line"; done
}

# budget_roundtrip FILE: the client's CPU per round trip of the RoundTrip
# benchmark's lines in FILE (go-redis, and a bare connection), medians over
# its -count runs.
budget_roundtrip() {
  [ -s "$1" ] || return 0
  awk '{
      name = $1; sub(/-[0-9]+$/, "", name); sub(/^BenchmarkRoundTrip\//, "", name)
      for (i = 3; i < NF; i += 2) if ($(i + 1) == "client-us/op") runs[name] = runs[name] " " $i
    }
'"$awk_median"'
    END {
      printf "budget: a round trip of one batch, this process: go-redis %.1f us, a bare connection %.1f us (the kernel: send, receive, wake-ups)\n",
        median(runs["go-redis"]), median(runs["conn"])
    }' "$1" | while IFS= read -r line; do figure "$line"; done
}

# awk_median: an awk function, median(s), of the numbers in string s
# (separated by spaces).
awk_median='function median(s, a, n, i, j, t) {
      n = split(s, a, " ")
      for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }'

# budget_claims FILE: the figures of the ClaimMany benchmark's lines in FILE,
# medians over its -count runs, and issue 30's target beside them.
budget_claims() {
  [ -s "$1" ] || return 0
  awk '{
      name = $1; sub(/-[0-9]+$/, "", name); sub(/^BenchmarkClaimMany\//, "", name)
      if (!(name in seen)) { seen[name] = 1; names[++k] = name }
      for (i = 3; i < NF; i += 2) runs[name, $(i + 1)] = runs[name, $(i + 1)] " " $i
    }
'"$awk_median"'
    END {
      for (i = 1; i <= k; i++) {
        n = names[i]
        printf "budget: claim path alone, %-18s Redis %6.1f us per claim (EVALSHA %5.1f), %7.1f us per batch; %7.0f grants/s per Redis core; %6.0f claims/s\n",
          n ":", median(runs[n, "redis-us/claim"]), median(runs[n, "lua-us/claim"]), median(runs[n, "redis-us/batch"]),
          median(runs[n, "grants/s/core"]), median(runs[n, "claims/s"])
      }
      g = median(runs["batch=128", "grants/s/core"])
      printf "budget: claim path alone at full batches (128 claims): %.0f grants/s per shard core (target >= 80,000: %s)\n", g, (g >= 80000 ? "met" : "not met")
    }' "$1" | while IFS= read -r line; do figure "$line"; done
}

# budget_categories: the rows of the budget, in the order a sample is
# classified, "key ;; label ;; pattern ;; also": a sample of rain's CPU profile
# counts in the first row whose pattern a frame of its stack matches (and
# also "also", when given). A stack is its frames' function names, one per
# line, so "\n" ends a name; what no row matches is "other". In words:
#
#   GC                  the collector's own work: background marking, assists,
#                       sweeping (allocation counts where it is made)
#   hand-offs and       a goroutine parked or readied, the scheduler looking
#   wake-ups            for work, netpoll, futex sleeps and wake-ups, channel
#                       sends and receives, contended locks, new goroutines:
#                       whoever caused them (handler -> worker -> lane -> back,
#                       and net/http's own)
#   the pipeline's      go-redis's reads and writes on the shard's connection,
#   syscalls            down to the syscall
#   go-redis encode/    the rest of go-redis (commands, RESP, the pool of
#   decode              connections), and internal/lua's arguments and replies
#   HTTP write          the answer's header and body through the HTTP server
#                       (net/http, or the API listener's fasthttp), down to the
#                       write syscall
#   HTTP read and parse the request's read syscall, its parse, the body's read
#   grab logic          internal/grab (the grab, the lane), serials, catalogue
#   admission           internal/pool and ants
#   route + handler     internal/api (decode, validate, answer), the metrics,
#                       the access log, rain's connection hooks (cmd/rain)
#   the HTTP server,    what else the server does per request (connection state,
#   the rest            contexts, deadlines; net/http's adaptor for the routes
#                       other than POST /grab)
budget_categories=(
  'gc ;; GC ;; runtime\.(gcBgMarkWorker|gcAssistAlloc|bgsweep|bgscavenge|gcStart|gcMarkDone|gcMarkTermination|markroot|gcDrain|sweepone|forEachP)\n ;; '
  'handoffs ;; hand-offs and wake-ups ;; runtime\.(mcall|park_m|schedule|findRunnable|goready|ready|wakep|startm|stopm|notewakeup|notesleep|futexsleep|futexwakeup|gopark|goparkunlock|netpoll|netpollblock|injectglist|stealWork|handoffp|chansend|chanrecv|selectgo|semacquire1|semrelease1|notifyListWait|notifyListNotifyOne|notifyListNotifyAll|gosched_m|goschedIfBusy|newproc|goexit0|usleep|osyield)\n|sync\.\(\*Cond\)|sync\.\(\*Mutex\)\.(lockSlow|unlockSlow)\n ;; '
  'pipeline ;; the pipeline'"'"'s syscalls ;; github\.com/redis/go-redis ;; (^|\n)(syscall|internal/poll)\.'
  'goredis ;; go-redis encode/decode ;; github\.com/redis/go-redis|rain/internal/lua\. ;; '
  'write ;; HTTP write ;; net/http\.\(\*response\)\.(finishRequest|Write|WriteHeader|write|WriteString)\n|net/http\.\(\*chunkWriter\)|net/http\.checkConnErrorWriter|net/http\.\(\*conn\)\.finalFlush|github\.com/valyala/fasthttp\.(writeResponse|\(\*Response\)\.Write|\(\*ResponseHeader\))|bufio\.\(\*Writer\)\.Flush\ngithub\.com/valyala/fasthttp\.|rain/internal/api\.\(\*clientConn\)\.Write\n ;; '
  'read ;; HTTP read and parse ;; net/http\.(\(\*conn\)\.readRequest|readRequest|\(\*connReader\)|\(\*body\)|\(\*maxBytesReader\)|\(\*expectContinueReader\)|readTransfer|\(\*transferReader\))|net/textproto\.|github\.com/valyala/fasthttp\.(\(\*RequestHeader\)\.(Read|readLoop|tryRead|parse)|\(\*Request\)\.(readBodyStream|ContinueReadBodyStream|readLimitBody|ContinueReadBody|ReadBody)|readBodyWithStreaming|appendBodyFixedSize|\(\*requestStream\))|bufio\.\(\*Reader\)\.Peek\ngithub\.com/valyala/fasthttp\.|rain/internal/api\.\(\*clientConn\)\.Read\n ;; '
  'grab ;; grab logic ;; rain/internal/(grab|idgen|catalog|soldout|known|shard|events)\. ;; '
  'admission ;; admission (worker pool) ;; rain/internal/pool\.|github\.com/panjf2000/ants ;; '
  'handler ;; route + handler ;; rain/internal/(api|metrics|auth|limit|dash)\.|github\.com/prometheus|(^|\n)main\.|encoding/json|log/slog ;; '
  'http ;; the HTTP server, the rest ;; net/http\.|github\.com/valyala/fasthttp ;; '
)

# redis_categories: the rows of a Redis shard's CPU, classified as
# budget_categories are, from perf samples of the redis-server processes
# (its functions are named in its dynamic symbols; the stacks are unwound
# from DWARF, and where that stops in libc, as it does below writev, the
# kernel's frames say what the syscall was on: a socket, or the AOF's
# file); what no row matches is the event loop, cron and the rest.
redis_categories=(
  'scripts ;; the scripts (Lua, the commands they run) ;; (^|\n)(evalGenericCommand|evalShaCommand|evalCommand|luaCallFunction|scriptCall|lua_pcall)\n ;; '
  'aof ;; the AOF: its buffer, write and fsync ;; (^|\n)(flushAppendOnlyFile|feedAppendOnlyFile|catAppendOnlyGenericCommand|propagatePendingCommands|propagateNow|aof_background_fsync|redis_fsync|fdatasync|fsync|ext4_file_write_iter|ext4_sync_file|vfs_fsync_range|__x64_sys_fdatasync|__x64_sys_fsync)\n ;; '
  'rread ;; reading and parsing requests ;; (^|\n)(readQueryFromClient|processInputBuffer|processMultibulkBuffer|processInlineBuffer|processCommand|connSocketRead|sock_read_iter|tcp_recvmsg)\n ;; '
  'rwrite ;; writing replies ;; (^|\n)(writeToClient|_writeToClient|_writevToClient|handleClientsWithPendingWrites|handleClientsWithPendingWritesUsingThreads|sendReplyToClient|connSocketWrite|connSocketWritev|sock_write_iter|tcp_sendmsg|do_writev|__GI___writev|writev)\n ;; '
)

# classify RULE...: reads samples, each a paragraph (its weight, then its
# frames' function names, one a line, the leaf first), and prints "key
# weight" summed for each RULE ("key ;; label ;; pattern ;; also", first match
# wins: see budget_categories), for "other", and "total".
classify() {
  STACK_RULES="$(printf '%s\n' "$@")" awk '
    BEGIN {
      RS = ""
      nr = split(ENVIRON["STACK_RULES"], lines, "\n")
      for (i = 1; i <= nr; i++) {
        split(lines[i], f, / ;; /)
        key[i] = f[1]; pat[i] = f[3]; also[i] = f[4]
        gsub(/\\n/, "\n", pat[i]); gsub(/\\n/, "\n", also[i])
      }
    }
    {
      w = $1 + 0; st = substr($0, index($0, "\n") + 1) "\n"; c = "other"
      for (i = 1; i <= nr; i++) if (st ~ pat[i] && (also[i] == "" || st ~ also[i])) { c = key[i]; break }
      sum[c] += w; tot += w
    }
    END { for (c in sum) printf "%s %.3f\n", c, sum[c]; printf "total %.3f\n", tot }'
}

# alloc_objects BEFORE AFTER: the heap allocations the process made between
# two /debug/pprof/allocs profiles (the runtime samples one allocation per
# 512 KB allocated and pprof scales the samples up: an estimate, good to a
# few percent over a run of a second or more).
alloc_objects() {
  go tool pprof -sample_index=alloc_objects -base "$1" -top "$2" 2>/dev/null | awk '
    /^Showing nodes accounting for/ { for (i = 1; i <= NF; i++) if ($i == "total") n = $(i - 1) }
    END { print n + 0 }'
}

# pprof_stacks BIN PROFILE...: the samples of the Go CPU profiles, merged, as
# classify reads them (weights in seconds).
pprof_stacks() {
  local bin=$1
  shift
  go tool pprof -traces "$bin" "$@" 2>/dev/null | awk '
    function val(s) {
      if (s ~ /ms$/) return substr(s, 1, length(s) - 2) / 1e3
      if (s ~ /us$/) return substr(s, 1, length(s) - 2) / 1e6
      if (s ~ /ns$/) return substr(s, 1, length(s) - 2) / 1e9
      if (s ~ /s$/) return substr(s, 1, length(s) - 1) + 0
      return s + 0
    }
    /^-----------\+/ { if (t) print ""; t = 0; next }
    !t && /^ +[0-9.]+(ms|s|us|ns) +[^ ]/ { t = 1; print val($1); print $2; next }
    t { print $1 }
    END { if (t) print "" }'
}

# perf_stacks FILE: the samples of a perf.data FILE as classify reads them
# (each weighs 1: perf samples at a fixed rate).
perf_stacks() {
  perf script -i "$1" -F ip,sym 2>/dev/null | awk 'BEGIN { RS = "" } {
    print 1; n = split($0, l, "\n"); for (i = 1; i <= n; i++) { split(l[i], f, " "); print f[2] } print "" }'
}

# sum_shares FILE...: classify's outputs added up.
sum_shares() { cat "$@" 2>/dev/null | awk '{ s[$1] += $2 } END { for (k in s) print k, s[k] }'; }

# have_perf: whether perf can sample a process here (root, or
# kernel.perf_event_paranoid low enough); says why not once.
have_perf() {
  if [ -z "${perf_ok:-}" ]; then
    perf_ok=no
    if command -v perf >/dev/null 2>&1 && perf record -q -o /dev/null -F 99 -- true >/dev/null 2>&1; then
      perf_ok=yes
    else
      echo "$section: perf cannot sample here (Debian/Ubuntu: apt-get install -y linux-perf; run as root or lower kernel.perf_event_paranoid): Redis's CPU is not split" >&2
    fi
  fi
  [ "$perf_ok" = yes ]
}

# write_report: the HTML page of every run's timeline, with the figures as notes.
write_report() {
  [ -n "$report_dir" ] || return 0
  if [ ${#report_runs[@]} -eq 0 ]; then
    echo "bench.sh: REPORT is set but no section ran a load (grab, driver): no report written" >&2
    return 0
  fi
  build_tools
  touch "$report_dir/notes.txt"
  "$bin/rainload" report -o "$REPORT" -title "rain bench, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores" \
    -notes "$report_dir/notes.txt" "${report_runs[@]}"
  echo "bench.sh: wrote $REPORT"
}

# The report's material lives until the script exits.
report_dir="" report_seq=0 report_runs=()
if [ -n "${REPORT:-}" ]; then
  report_dir=$(mktemp -d "${TMPDIR:-/tmp}/rain-bench-report.XXXXXX")
  kept+=("$report_dir")
fi

for s in "${sections[@]}"; do
  case "$s" in
    idgen) bench_idgen ;;
    preload) bench_preload ;;
    grab) bench_grab ;;
    driver) bench_driver ;;
    pool) bench_pool ;;
    soldout) bench_soldout ;;
    cluster) bench_cluster ;;
    durability) bench_durability ;;
    settle) bench_settle ;;
    memory) bench_memory ;;
    versus) bench_versus ;;
    budget) bench_budget ;;
    *) echo "bench.sh: unknown section $s (have: idgen preload grab cluster durability settle memory driver pool soldout budget versus)" >&2; exit 2 ;;
  esac
done
write_report
