#!/usr/bin/env bash
# scripts/chaos.sh — rain under shard faults, with the figures of
# docs/benchmarks.md#faults.
#
# Runs, against real redis-server processes on 127.0.0.1 (scripts/test.sh
# installs redis-server), without the race detector and with full windows:
#   TestOneBadShard       four shards, two instances at 1,500 grabs/s; one shard
#                         killed (-9) and restarted, frozen (SIGSTOP) and
#                         thawed, answering past the budget (a proxy holds
#                         its replies), busy with a slow script, audited in
#                         pages
#   TestSentinelFailover  a Sentinel-managed shard loses its primary mid-flood
#   TestChaosLostReplies  four shards behind proxies that lose replies
# and prints, per fault: healthy users' p99, the bad shard's 503s, /readyz,
# recovery, and the money checks. CI runs the same tests short (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
RAIN_CHAOS=full go test -count=1 -v -timeout 10m \
  -run 'TestOneBadShard|TestSentinelFailover|TestChaosLostReplies' ./internal/chaos |
  grep -E '^(=== RUN|--- |    ---|ok|FAIL)|_test.go:[0-9]+:'
