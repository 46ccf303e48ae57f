package main

// This file checks that the shards keep what rain acknowledges.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
// refused; one that did not answer (any of a cluster shard's primaries) is
// named in unreached, for checkLater.
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
			if name := shardOf(d); !slices.Contains(unreached, name) {
				unreached = append(unreached, name)
			}
		case d.Err != nil:
			log.Warn(warnDurabilityUnknown, "shard", d.Shard, "err", d.Err)
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

// warnDurabilityUnknown is logged of a shard that answered but whose
// settings could not be read (CONFIG not allowed): warned of, never refused.
const warnDurabilityUnknown = "shard durability unknown; make sure it runs appendonly yes, appendfsync always"

// notAnswered reports whether err is not the shard's own answer (CONFIG
// refused or renamed, or an answer without appendonly): the shard was not
// reached, or its answer was lost.
func notAnswered(err error) bool {
	var rerr redis.Error
	return !errors.As(err, &rerr) && !errors.Is(err, shard.ErrNoAppendOnly)
}

// shardOf is the shard a Durability is of: its name, a cluster primary's
// ("c1/host:port") its cluster shard's.
func shardOf(d shard.Durability) string {
	name, _, _ := strings.Cut(d.Shard, "/")
	return name
}

// heldShards are the shards that did not answer the durability check at
// start, under strict: no claim is sent there, and no confirm made,
// until checkLater has read them. relaxed says whether a shard was let
// through --durability relaxed though it can lose grants, at start or
// once checkLater read it (rain_durability_relaxed).
type heldShards struct {
	m       sync.Map
	relaxed atomic.Bool
}

func newHeld(names []string, relaxed bool) *heldShards {
	h := &heldShards{}
	for _, n := range names {
		h.m.Store(n, true)
	}
	h.relaxed.Store(relaxed)
	return h
}

// isRelaxed reports whether a shard that can lose grants is in use.
func (h *heldShards) isRelaxed() bool { return h.relaxed.Load() }

// has reports whether the shard is held.
func (h *heldShards) has(name string) bool { _, ok := h.m.Load(name); return ok }

// release lets the shard be used.
func (h *heldShards) release(name string) { h.m.Delete(name) }

// checkLater reads, every period until ctx ends, the persistence settings
// of the shards that did not answer at start (unreached), until each has
// answered (a cluster shard: every primary): a shard that comes back
// unable to keep what rain acknowledges is refused as it would have been
// at start. Under strict the instance then stops (the error says why; a
// restart refuses to start until the shard is fixed); under relaxed it is
// warned of, and held.relaxed set. Each shard is released from held once
// it has been read and may be used (under strict, the shards are held
// until then: nothing is granted or confirmed there before its settings
// are known).
func checkLater(ctx context.Context, set *shard.Set, unreached []string, mode string, period time.Duration, log *slog.Logger,
	held *heldShards) error {
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
		of := map[string][]shard.Durability{}
		for _, d := range ds {
			of[shardOf(d)] = append(of[shardOf(d)], d)
		}
		for name := range left {
			if len(of[name]) == 0 || slices.ContainsFunc(of[name], func(d shard.Durability) bool { return d.Err != nil && notAnswered(d.Err) }) {
				continue // not every part of it answered yet
			}
			delete(left, name)
			for _, d := range of[name] {
				switch {
				case d.Err != nil:
					log.Warn(warnDurabilityUnknown, "shard", d.Shard, "err", d.Err)
				case d.Durable():
					log.Info("shard durability checked now that it answers", "shard", d.Shard, "durability", d.String())
				case mode == "strict":
					return fmt.Errorf("stopping: a shard that did not answer at start came back unable to keep what rain acknowledges: %s (or run with --durability relaxed, accepting that a host crash can lose or repeat money)", d)
				default:
					held.relaxed.Store(true)
					log.Warn("durability relaxed: "+d.String(), "durability", mode)
				}
			}
			held.release(name)
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
