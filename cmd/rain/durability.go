package main

// This file checks that the shards keep what rain acknowledges.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"rain/internal/shard"
)

// durabilityFlag binds --durability [RAIN_DURABILITY].
func durabilityFlag(f *flags, v *string) {
	f.StringVar(v, "durability", "strict", `"strict" refuses to start on shards that can lose an acknowledged grant on a host crash (AOF off, or appendfsync other than always); "relaxed" starts anyway, with a warning`)
	f.bindEnv("durability", "RAIN_DURABILITY")
}

// checkDurability reads every shard's persistence settings. Under strict it
// refuses shards that could lose an acknowledged grant; under relaxed it
// warns and reports relaxed = true when some shard is not durable. A shard
// whose settings cannot be read (CONFIG not allowed) is warned about, never
// refused.
func checkDurability(ctx context.Context, set *shard.Set, mode string, log *slog.Logger) (relaxed bool, err error) {
	if mode != "strict" && mode != "relaxed" {
		return false, usagef("--durability %q: want strict or relaxed", mode)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := set.CheckClusters(cctx); err != nil {
		if errors.Is(err, shard.ErrNotACluster) {
			return false, asUsage(err)
		}
		return false, err
	}
	var weak []string
	for _, d := range set.Durability(cctx) {
		switch {
		case d.Err != nil:
			log.Warn("shard durability unknown; make sure it runs appendonly yes, appendfsync always", "shard", d.Shard, "err", d.Err)
		case !d.Durable():
			weak = append(weak, d.String())
		}
	}
	if len(weak) == 0 {
		return false, nil
	}
	if mode == "strict" {
		return false, fmt.Errorf("refusing to start: %s (or run with --durability relaxed, accepting that a host crash can lose or repeat money)", strings.Join(weak, "; "))
	}
	for _, w := range weak {
		log.Warn("durability relaxed: "+w, "durability", mode)
	}
	return true, nil
}

// checkSpecsDurability is checkDurability on the shards of specs, reached
// with opts: the check runs before the instance is built.
func checkSpecsDurability(ctx context.Context, specs []shard.Spec, opts shard.Options, mode string, log *slog.Logger) (relaxed bool, err error) {
	set, err := shard.Open(specs, 0, opts)
	if err != nil {
		return false, err
	}
	defer set.Close()
	return checkDurability(ctx, set, mode, log)
}
