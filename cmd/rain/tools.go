package main

// This file is the operator tools: `rain preload`, `rain audit`, `rain
// end` and `rain close`.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"rain"
	"rain/internal/catalog"
	"rain/internal/postgres"
	"rain/internal/shard"
)

// toolConfig is what every operator tool takes.
type toolConfig struct {
	Redis       string
	SerialShard string
	RedisCA     string
}

// toolFlags are the flags shared by the operator tools.
func toolFlags(name string, stderr io.Writer) (*flags, *toolConfig) {
	f := newFlags(name, stderr)
	c := &toolConfig{}
	f.StringVar(&c.Redis, "redis", "", "shards as name=weight@host:port, comma-separated (required)")
	f.StringVar(&c.SerialShard, "serial-shard", "", "the serial shard of rain serve, which arbitrates pool records (default: the first in --redis)")
	redisCAFlag(f, &c.RedisCA)
	f.bindEnv("redis", "RAIN_REDIS")
	f.bindEnv("serial-shard", "RAIN_SERIAL_SHARD")
	return f, c
}

// openTool opens the shards of --redis and the pool catalogue on them (the
// tools grant nothing: no claim lanes, no serials); --serial-shard is the
// pool records' arbiter ("" = the first).
func openTool(tc *toolConfig, books catalog.Books) (*shard.Set, *catalog.Catalog, error) {
	redis, serialShard := tc.Redis, tc.SerialShard
	if redis == "" {
		return nil, nil, usagef("--redis (RAIN_REDIS) is required")
	}
	specs, err := shard.ParseSpecs(redis)
	if err != nil {
		return nil, nil, asUsage(err)
	}
	tlsCfg, err := redisTLS(tc.RedisCA)
	if err != nil {
		return nil, nil, asUsage(err)
	}
	set, err := shard.Open(specs, 0, shard.Options{TLS: tlsCfg, Serial: serialShard})
	if errors.Is(err, shard.ErrUnknownSerial) {
		return nil, nil, serialShardUsage(serialShard)
	}
	if err != nil {
		return nil, nil, err
	}
	return set, catalog.New(set, catalog.Config{Books: books}), nil
}

// serialShardUsage refuses a --serial-shard that names none of the shards
// (shard.ErrUnknownSerial).
func serialShardUsage(name string) error {
	return usagef("--serial-shard %q is not one of the shards", name)
}

func preload(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f, tc := toolFlags("preload", stderr)
	var spec rain.Spec
	var startsAt, endsAt string
	f.StringVar(&spec.PoolID, "pool", "", "pool id (required)")
	f.Int64Var(&spec.TotalCents, "total-cents", 0, "total of the pool in cents (required)")
	f.Int64Var(&spec.Count, "count", 0, "number of packets (required)")
	f.Int64Var(&spec.MinCents, "min-cents", 0, "smallest packet in cents (0 = 1)")
	f.Int64Var(&spec.MaxCents, "max-cents", 0, "largest packet in cents (0 = no maximum)")
	f.IntVar(&spec.SubPools, "sub-pools", 0, "number of sub-pools (0 = chosen by rain)")
	f.StringVar(&startsAt, "starts-at", "", "RFC 3339 start time (empty = open at once)")
	f.StringVar(&endsAt, "ends-at", "", "RFC 3339 end time (empty = no end)")
	f.Int64Var(&spec.HoldSeconds, "hold-seconds", 0, "how long a grant waits for confirmation (0 = 600)")
	if err := f.parse(args, getenv); err != nil {
		return err
	}
	f.warnSecretArgs(stderr)
	for _, t := range []struct {
		flag string
		in   string
		out  **time.Time
	}{{"--starts-at", startsAt, &spec.StartsAt}, {"--ends-at", endsAt, &spec.EndsAt}} {
		if t.in == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339, t.in)
		if err != nil {
			return usagef("%s: %w", t.flag, err)
		}
		*t.out = &v
	}
	set, cat, err := openTool(tc, nil)
	if err != nil {
		return err
	}
	defer set.Close()
	progress, finish := preloadProgress(stderr, spec.PoolID, spec.Count)
	st, created, err := cat.PreloadProgress(ctx, spec, progress)
	finish()
	if err != nil {
		return err
	}
	if !created {
		fmt.Fprintf(stderr, "pool %s was already loaded with this spec\n", spec.PoolID)
	}
	return printJSON(stdout, st)
}

func audit(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f, tc := toolFlags("audit", stderr)
	pool := f.String("pool", "", "pool id (required)")
	if err := f.parse(args, getenv); err != nil {
		return err
	}
	f.warnSecretArgs(stderr)
	if err := rain.CheckID("--pool", *pool); err != nil {
		return asUsage(err)
	}
	set, cat, err := openTool(tc, nil)
	if err != nil {
		return err
	}
	defer set.Close()
	rep, err := cat.Audit(ctx, *pool)
	if err != nil {
		return err
	}
	if err := printJSON(stdout, rep); err != nil {
		return err
	}
	if !rep.OK {
		problems := make([]string, len(rep.Problems))
		for i, p := range rep.Problems {
			problems[i] = p.String()
		}
		return fmt.Errorf("audit of %s found %d problems: %s", *pool, len(rep.Problems), strings.Join(problems, "; "))
	}
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// life is `rain end` and `rain close`: end a pool now, or close one whose
// life is over (see catalog.Close), and print its status or account.
func life(ctx context.Context, cmd string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f, tc := toolFlags(cmd, stderr)
	pool := f.String("pool", "", "pool id (required)")
	var pg string
	if cmd == "close" {
		f.StringVar(&pg, "postgres", "", "the PostgreSQL database settlement delivers into: the close reconciles the pool with it and records the account there (as rain serve --postgres does)")
		f.bindEnv("postgres", "RAIN_POSTGRES")
	}
	if err := f.parse(args, getenv); err != nil {
		return err
	}
	f.warnSecretArgs(stderr)
	if err := rain.CheckID("--pool", *pool); err != nil {
		return asUsage(err)
	}
	var books catalog.Books
	if pg != "" {
		if err := checkPostgresTLS(pg, func(w string) { fmt.Fprintln(stderr, "rain: warning:", w) }); err != nil {
			return err
		}
		db, err := postgres.Open(ctx, pg)
		if err != nil {
			return fmt.Errorf("--postgres: %w", err)
		}
		defer db.Close()
		books = db
	}
	set, cat, err := openTool(tc, books)
	if err != nil {
		return err
	}
	defer set.Close()
	if cmd == "end" {
		st, err := cat.End(ctx, *pool)
		if err != nil {
			return err
		}
		return printJSON(stdout, st)
	}
	a, err := cat.Close(ctx, *pool)
	if err != nil {
		return err
	}
	return printJSON(stdout, a)
}
