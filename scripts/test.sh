#!/usr/bin/env bash
# scripts/test.sh — the README's test command and all that CI runs.
#
# Installs what the tests need when it is missing (redis-server from the system's
# packages), then checks formatting, vets, and runs every test with the race
# detector against real redis-server processes that the tests start themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

need_redis() {
  command -v redis-server >/dev/null 2>&1 && return 0
  echo "test.sh: redis-server is missing; installing it from the system's packages" >&2
  if command -v apt-get >/dev/null 2>&1; then
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
      if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
        echo "test.sh: not root and no sudo: install redis-server (apt-get install -y redis-server) and run again" >&2
        exit 1
      fi
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
  elif command -v brew >/dev/null 2>&1; then
    brew install redis
  else
    echo "test.sh: cannot install redis-server here: install Redis 7 (redis-server on PATH) and run again" >&2
    exit 1
  fi
  command -v redis-server >/dev/null 2>&1 || {
    echo "test.sh: redis-server still not on PATH after installing; install it by hand and run again" >&2
    exit 1
  }
}

need_redis
# The Debian package starts a system redis on 6379 where systemd runs; the tests
# never use it (each test starts its own servers on free ports).

echo "== gofmt"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi

echo "== go vet"
go vet ./...

echo "== go test -race"
go test -race -count=1 -timeout 12m "$@" ./...
