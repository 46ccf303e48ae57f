package main

// This file checks that the shards keep what rain acknowledges.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

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
// refused; one that could not be reached is named in unreached, for
// checkLater.
func checkDurability(ctx context.Context, set *shard.Set, mode string, log *slog.Logger) (relaxed bool, unreached []string, err error) {
	if mode != "strict" && mode != "relaxed" {
		return false, nil, usagef("--durability %q: want strict or relaxed", mode)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := set.CheckClusters(cctx); err != nil {
		if errors.Is(err, shard.ErrNotACluster) {
			return false, nil, asUsage(err)
		}
		return false, nil, err
	}
	var weak []string
	for _, d := range set.Durability(cctx) {
		switch {
		case d.Err != nil && notAnswered(d.Err):
			log.Warn("shard durability unknown: the shard did not answer; it is checked once it does", "shard", d.Shard, "err", d.Err)
			unreached = append(unreached, d.Shard)
		case d.Err != nil:
			log.Warn("shard durability unknown; make sure it runs appendonly yes, appendfsync always", "shard", d.Shard, "err", d.Err)
		case !d.Durable():
			weak = append(weak, d.String())
		}
	}
	if len(weak) == 0 {
		return false, unreached, nil
	}
	if mode == "strict" {
		return false, nil, fmt.Errorf("refusing to start: %s (or run with --durability relaxed, accepting that a host crash can lose or repeat money)", strings.Join(weak, "; "))
	}
	for _, w := range weak {
		log.Warn("durability relaxed: "+w, "durability", mode)
	}
	return true, unreached, nil
}

// notAnswered reports whether err is not the shard's own answer (CONFIG
// refused, renamed): the shard was not reached, or its answer was lost.
func notAnswered(err error) bool {
	var rerr redis.Error
	return !errors.As(err, &rerr)
}

// checkLater reads, every period until ctx ends, the persistence settings
// of the shards that did not answer at start (unreached), until each has
// answered: a shard that comes back unable to keep what rain acknowledges
// is refused as it would have been at start. Under strict the instance
// then stops (the error says why; a restart refuses to start until the
// shard is fixed); under relaxed it is warned of. Until a shard is read,
// its claims go to it as to any other: a shard that comes back is read
// within a period.
func checkLater(ctx context.Context, set *shard.Set, unreached []string, mode string, period time.Duration, log *slog.Logger) error {
	left := map[string]bool{}
	for _, name := range unreached {
		left[name] = true
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for len(left) > 0 {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ds := set.Durability(cctx)
		cancel()
		for _, d := range ds {
			if !left[d.Shard] || (d.Err != nil && notAnswered(d.Err)) {
				continue
			}
			delete(left, d.Shard)
			switch {
			case d.Err != nil:
				log.Warn("shard durability unknown; make sure it runs appendonly yes, appendfsync always", "shard", d.Shard, "err", d.Err)
			case d.Durable():
				log.Info("shard durability checked now that it answers", "shard", d.Shard, "durability", d.String())
			case mode == "strict":
				return fmt.Errorf("stopping: a shard that did not answer at start came back unable to keep what rain acknowledges: %s (or run with --durability relaxed, accepting that a host crash can lose or repeat money)", d)
			default:
				log.Warn("durability relaxed: "+d.String(), "durability", mode)
			}
		}
	}
	return nil
}

// checkSpecsDurability is checkDurability on the shards of specs, reached
// with opts: the check runs before the instance is built.
func checkSpecsDurability(ctx context.Context, specs []shard.Spec, opts shard.Options, mode string, log *slog.Logger) (relaxed bool, unreached []string, err error) {
	set, err := shard.Open(specs, 0, opts)
	if err != nil {
		return false, nil, err
	}
	defer set.Close()
	return checkDurability(ctx, set, mode, log)
}
