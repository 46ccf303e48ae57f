#!/usr/bin/env bash
# scripts/soak.sh — a season for DURATION (default 10m) on the compose
# topology as processes on loopback: three redis-server shards on
# appendfsync always, PostgreSQL, two rain serve and one rain settle; pools
# opening, ending and closing back to back (twelve a round, windows
# overlapping), one process killed (-9) and restarted each round (a serve,
# settle, a shard, PostgreSQL in turn). Every 30 s a line gives the grabs
# answered per second, their p99, and the memory of each process (resident
# for rain and PostgreSQL, used_memory for the shards): flat is the target.
# At the end the test checks every pool's account, PostgreSQL against what
# the users were told, and the keys left on the shards
# (internal/season, TestSeasonDeployed; scripts/test.sh runs one round).
#
#   DURATION=30m scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${DURATION:-10m}
echo "soak: $duration (a line every 30 s; the checks at the end)"
RAIN_SOAK="$duration" exec go test -count=1 -run '^TestSeasonDeployed$' -timeout 0 -v ./internal/season
