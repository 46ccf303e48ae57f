package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestWorkersFlags: the worker pool's flags are --workers..., and their
// old names (--pool..., when --pool also meant a red-packet pool) still
// set the same values for a release, each use warned of; both names of
// one flag at one level is a usage error, and otherwise the command line
// wins over the environment, whichever names they use.
func TestWorkersFlags(t *testing.T) {
	type values struct {
		workers           string
		min, max, queue   int
		deprecated        []string // the names deprecations warns of
		errWant, errWant2 string   // a usage error naming both
	}
	defaults := values{workers: "on", min: 32, max: 1024, queue: 1024}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want values
	}{
		{"defaults", nil, nil, defaults},
		{"new flags", []string{"--workers", "off", "--workers-min", "5", "--workers-max", "9", "--workers-queue", "-1"}, nil,
			values{workers: "off", min: 5, max: 9, queue: -1}},
		{"new variables", nil, map[string]string{"RAIN_WORKERS": "off", "RAIN_WORKERS_MIN": "6", "RAIN_WORKERS_MAX": "60", "RAIN_WORKERS_QUEUE": "0"},
			values{workers: "off", min: 6, max: 60, queue: 0}},
		{"old flags", []string{"--pool", "off", "--pool-min", "5", "--pool-max", "9", "--pool-queue", "3"}, nil,
			values{workers: "off", min: 5, max: 9, queue: 3, deprecated: []string{"--pool", "--pool-max", "--pool-min", "--pool-queue"}}},
		{"old flags, = form", []string{"--pool=off", "--pool-min=4"}, nil,
			values{workers: "off", min: 4, max: 1024, queue: 1024, deprecated: []string{"--pool", "--pool-min"}}},
		{"old variables", nil, map[string]string{"RAIN_POOL": "off", "RAIN_POOL_MIN": "7", "RAIN_POOL_MAX": "70", "RAIN_POOL_QUEUE": "2"},
			values{workers: "off", min: 7, max: 70, queue: 2, deprecated: []string{"RAIN_POOL", "RAIN_POOL_MAX", "RAIN_POOL_MIN", "RAIN_POOL_QUEUE"}}},
		{"old and new names of different flags", []string{"--pool-min", "3", "--workers-max", "30"}, map[string]string{"RAIN_POOL_QUEUE": "8", "RAIN_WORKERS": "off"},
			values{workers: "off", min: 3, max: 30, queue: 8, deprecated: []string{"--pool-min", "RAIN_POOL_QUEUE"}}},
		{"old flag over new variable", []string{"--pool-min", "4"}, map[string]string{"RAIN_WORKERS_MIN": "8"},
			values{workers: "on", min: 4, max: 1024, queue: 1024, deprecated: []string{"--pool-min"}}},
		{"new flag over old variable", []string{"--workers-min", "4"}, map[string]string{"RAIN_POOL_MIN": "8"},
			values{workers: "on", min: 4, max: 1024, queue: 1024, deprecated: []string{"RAIN_POOL_MIN"}}},
		{"both flags", []string{"--pool-max", "9", "--workers-max", "10"}, nil,
			values{errWant: "--pool-max", errWant2: "--workers-max"}},
		{"both flags, the same value", []string{"--workers", "on", "--pool", "on"}, nil,
			values{errWant: "--pool ", errWant2: "--workers "}},
		{"both variables", nil, map[string]string{"RAIN_POOL_QUEUE": "1", "RAIN_WORKERS_QUEUE": "2"},
			values{errWant: "RAIN_POOL_QUEUE", errWant2: "RAIN_WORKERS_QUEUE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, c := serveFlags(&bytes.Buffer{})
			err := f.parse(tc.args, env(tc.env))
			if tc.want.errWant != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want.errWant) || !strings.Contains(err.Error(), tc.want.errWant2) || exitCode(err) != exitUsage {
					t.Fatalf("parse(%v, %v) = %v (exit %d), want a usage error naming %s and %s", tc.args, tc.env, err, exitCode(err), tc.want.errWant, tc.want.errWant2)
				}
				return
			}
			if err != nil {
				t.Fatalf("parse(%v, %v) = %v, want nil", tc.args, tc.env, err)
			}
			got := values{workers: c.Workers, min: c.WorkersMin, max: c.WorkersMax, queue: c.WorkersQueue}
			if w := tc.want; got.workers != w.workers || got.min != w.min || got.max != w.max || got.queue != w.queue {
				t.Errorf("workers %q, min %d, max %d, queue %d; want %q, %d, %d, %d", got.workers, got.min, got.max, got.queue, w.workers, w.min, w.max, w.queue)
			}
			ds := f.deprecations()
			var named []string
			for _, d := range ds {
				old, _, _ := strings.Cut(d, " ")
				named = append(named, old)
				newName := strings.ReplaceAll(strings.ReplaceAll(old, "pool", "workers"), "POOL", "WORKERS")
				if !strings.HasSuffix(d, "use "+newName) {
					t.Errorf("warning %q: want it to end with use %s", d, newName)
				}
			}
			slices.Sort(named)
			if !slices.Equal(named, tc.want.deprecated) {
				t.Errorf("deprecations() = %q, want one for each of %q", ds, tc.want.deprecated)
			}
		})
	}
}

// TestHelpListsNewWorkersFlags: rain serve -h lists the --workers flags,
// and the old names only on the one line that says what replaced them.
func TestHelpListsNewWorkersFlags(t *testing.T) {
	var out bytes.Buffer
	f, _ := serveFlags(&out)
	if err := f.parse([]string{"-h"}, env(nil)); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("parse(-h) = %v, want flag.ErrHelp", err)
	}
	help := out.String()
	for _, name := range []string{"workers", "workers-min", "workers-max", "workers-queue"} {
		if !regexp.MustCompile(`(?m)^\s+-` + name + ` `).MatchString(help) {
			t.Errorf("help does not list -%s:\n%s", name, help)
		}
	}
	if m := regexp.MustCompile(`(?m)^\s+-pool\S*`).FindAllString(help, -1); m != nil {
		t.Errorf("help lists the old names %q as flags", m)
	}
	line := regexp.MustCompile(`(?m)^Old names.*$`).FindString(help)
	for _, want := range []string{"-pool (now -workers,", "-pool-min (now -workers-min, RAIN_POOL_MIN now RAIN_WORKERS_MIN)", "-pool-queue (now -workers-queue"} {
		if !strings.Contains(line, want) {
			t.Errorf("help's line of old names %q lacks %q", line, want)
		}
	}
	// Every flag but the 4 old names is listed.
	n := len(regexp.MustCompile(`(?m)^\s+-[a-z]`).FindAllString(help, -1))
	all := 0
	f.VisitAll(func(*flag.Flag) { all++ })
	if n != all-4 {
		t.Errorf("help lists %d flags, want %d (all %d less the 4 old names)", n, all-4, all)
	}
}

// TestServeWarnsOfOldWorkersNames: rain serve given the old names runs
// with their values (the worker pool's capacity is what --pool-min and
// --pool-max pinned) and says once, at start, what to use instead.
func TestServeWarnsOfOldWorkersNames(t *testing.T) {
	addr, logs := startServe(t, []string{"--admin-token", "m", "--pool-min", "7", "--pool-max", "7"}, map[string]string{"RAIN_POOL_QUEUE": "5"})
	fam := scrapeFamilies(t, "http://"+addr+"/metrics")
	capacity := fam["rain_pool_capacity"]
	if capacity == nil || len(capacity.GetMetric()) != 1 || capacity.GetMetric()[0].GetGauge().GetValue() != 7 {
		t.Errorf("rain_pool_capacity = %v, want 7 (--pool-min 7 --pool-max 7)", capacity)
	}
	for _, want := range []string{
		`--pool-min is deprecated and goes in the next release: use --workers-min`,
		`--pool-max is deprecated and goes in the next release: use --workers-max`,
		`RAIN_POOL_QUEUE is deprecated and goes in the next release: use RAIN_WORKERS_QUEUE`,
	} {
		if n := strings.Count(logs.String(), want); n != 1 {
			t.Errorf("the log says %q %d times, want once:\n%s", want, n, logs)
		}
	}
}

// TestServeQuietWithNewWorkersNames: the new names warn of nothing.
func TestServeQuietWithNewWorkersNames(t *testing.T) {
	_, logs := startServe(t, []string{"--workers-min", "7"}, map[string]string{"RAIN_WORKERS_QUEUE": "5"})
	if strings.Contains(logs.String(), "deprecated") {
		t.Errorf("rain serve with --workers-min and RAIN_WORKERS_QUEUE logs a deprecation:\n%s", logs)
	}
}

// TestOldWorkersNamesAtStart: a value refused under an old name is
// refused as under the new one, both names said.
func TestOldWorkersNamesAtStart(t *testing.T) {
	var logs bytes.Buffer
	err := run(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", "--pool-min", "50", "--pool-max", "10"}, env(nil), &bytes.Buffer{}, &logs)
	if err == nil || !strings.Contains(err.Error(), "--workers-min 50 and --workers-max 10") || exitCode(err) != exitUsage {
		t.Errorf("serve --pool-min 50 --pool-max 10 = %v, want a usage error on --workers-min 50 and --workers-max 10", err)
	}
	if !strings.Contains(logs.String(), "--pool-min is deprecated and goes in the next release: use --workers-min") {
		t.Errorf("the log does not name the new flag:\n%s", logs.String())
	}
}
