#!/usr/bin/env bash
# scripts/test.sh — the README's test command and all that CI runs.
#
# Installs what the tests need when it is missing (redis-server, PostgreSQL's
# server programs, node, npm, chromium and promtool from the system's
# packages; Redocly CLI, pinned, from npm's registry), then checks formatting
# and go.mod, vets, runs staticcheck, checks and unit-tests the alert rules,
# lints the HTTP contract (docs/openapi.json), and runs every test with the
# race detector against real redis-server and PostgreSQL processes that the
# tests start themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

# install PKG...: install packages from the system's package manager, as root
# or through sudo; fails with what to install by hand when it cannot.
install() {
  if command -v apt-get >/dev/null 2>&1; then
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
      if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
        echo "test.sh: not root and no sudo: install $* (apt-get install -y $*) and run again" >&2
        exit 1
      fi
    fi
    if [ -z "${apt_updated:-}" ]; then $sudo apt-get update -qq; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  elif command -v brew >/dev/null 2>&1; then
    local pkgs=("${@/#redis-server/redis}")   # Homebrew's names
    brew install "${pkgs[@]/#nodejs/node}"
  else
    echo "test.sh: cannot install $* here: install it yourself and run again" >&2
    exit 1
  fi
}

# need CMD PKG: make sure CMD is on PATH, installing PKG when it is missing.
need() {
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "test.sh: $1 is missing; installing $2 from the system's packages" >&2
  install "$2"
  command -v "$1" >/dev/null 2>&1 || {
    echo "test.sh: $1 still not on PATH after installing $2; install it by hand and run again" >&2
    exit 1
  }
}

need redis-server redis-server   # every test runs against real redis-server processes
need node nodejs                 # the k6 scripts are syntax-checked with node --check
need npx npm                     # Redocly CLI runs through npx (Debian ships npx in npm)
need chromium chromium           # the dashboard is tested in headless Chromium (chromedp)
need promtool prometheus         # the alert rules are checked and unit-tested (promtool)
# Settlement and closes are tested against real PostgreSQL servers that the
# tests start (initdb + pg_ctl, internal/pgtest). Debian keeps those programs
# off PATH, under /usr/lib/postgresql/<version>/bin.
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "test.sh: PostgreSQL's initdb is missing; installing postgresql from the system's packages" >&2
  install postgresql
  if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "test.sh: initdb still not found after installing postgresql; install it by hand and run again" >&2
    exit 1
  fi
fi
# The HTTP contract is linted with the linter its users run, Redocly CLI,
# pinned (a release may bring new rules), fetched once into npm's cache.
redocly_version=2.77.0
redocly() { npx --yes "@redocly/cli@$redocly_version" "$@"; }
if ! out=$(redocly --version 2>&1); then
  echo "test.sh: cannot run @redocly/cli@$redocly_version through npx: it is fetched from npm's registry (is it reachable?) and needs Node.js 20.19 or later (here: $(node --version)). npx said:" >&2
  echo "$out" | tail -5 >&2
  exit 1
fi
# The Debian package starts a system redis on 6379 where systemd runs; the tests
# never use it (each test starts its own servers on free ports).

echo "== gofmt"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi

echo "== go mod tidy -diff"
go mod tidy -diff

echo "== go vet"
go vet ./...

echo "== staticcheck (pinned in go.mod as a tool)"
go tool staticcheck ./...

echo "== promtool: the alert rules and their unit tests"
promtool check rules deploy/prometheus/alerts.yml
promtool test rules deploy/prometheus/alerts_test.yml

echo "== redocly lint: the HTTP contract (redocly.yaml; its exceptions, with reasons, in .redocly.lint-ignore.yaml)"
redocly lint

echo "== go test -race"
# Test artifacts (the dashboard's screenshot) land in artifacts/.
export RAIN_ARTIFACTS="${RAIN_ARTIFACTS:-$PWD/artifacts}"
go test -race -count=1 -timeout 12m "$@" ./...
