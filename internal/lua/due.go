package lua

// This file is a shard's due index: the sub-pools there that have work for
// the reaper (a grant held, a spill's transfer in flight), with when each
// next needs a look. Grabs mark the sub-pools they grant from or take from
// (due_mark.lua); the reaper sweeps what is due and says when to look again,
// or drops a sub-pool with nothing left to do (due_done.lua). So background
// work follows what there is to do, not the pools that exist. The index
// only schedules: every release is still checked in its own script, and a
// mark lost to a crash is made up by the reaper's slow pass over every open
// pool.

import (
	"context"
	"strconv"
	"time"
)

// The index's keys, on each shard (one hash tag: one slot of a cluster).
const (
	DueAt  = "rain:{due}:at"
	DueGen = "rain:{due}:gen"
)

var (
	dueMarkScript = script("due_mark")
	dueReadScript = script("due_read")
	dueDoneScript = script("due_done")
)

func init() {
	scripts["due_mark"] = dueMarkScript
	scripts["due_read"] = dueReadScript
	scripts["due_done"] = dueDoneScript
}

// MarkDue marks the sub-pools (their meta keys) of one shard as having work
// for the reaper: due at the time given unless already in the index.
func MarkDue(ctx context.Context, c Client, at time.Time, metas []string) error {
	args := make([]any, 0, len(metas)+1)
	args = append(args, at.UnixMilli())
	for _, m := range metas {
		args = append(args, m)
	}
	return dueMarkScript.Run(ctx, c, []string{DueAt, DueGen}, args...).Err()
}

// Due is a sub-pool of the due index whose time has come.
type Due struct {
	Meta string // its meta key
	Gen  string // its marks when read (for DoneDue)
}

// ReadDue returns up to limit sub-pools of the shard that are due at now,
// earliest first, and when the earliest of the others is (zero: none).
func ReadDue(ctx context.Context, c Client, now time.Time, limit int) ([]Due, time.Time, error) {
	res, err := dueReadScript.Run(ctx, c, []string{DueAt, DueGen}, now.UnixMilli(), limit).Slice()
	if err != nil {
		return nil, time.Time{}, err
	}
	var next time.Time
	if ms := integer(res, 0); ms >= 0 {
		next = time.UnixMilli(ms)
	}
	due := make([]Due, 0, (len(res)-1)/2)
	for i := 1; i+1 < len(res); i += 2 {
		due = append(due, Due{Meta: str(res, i), Gen: str(res, i+1)})
	}
	return due, next, nil
}

// DoneDue tells the index the reaper swept d: look again at next, or, with
// next zero, nothing is left to do there, and d leaves the index unless it
// was marked since it was read. It reports whether d left.
func DoneDue(ctx context.Context, c Client, d Due, next time.Time) (bool, error) {
	ms := int64(-1)
	if !next.IsZero() {
		ms = next.UnixMilli()
	}
	n, err := dueDoneScript.Run(ctx, c, []string{DueAt, DueGen}, d.Meta, d.Gen, strconv.FormatInt(ms, 10)).Int()
	return n == 1, err
}

// ParseMeta returns the sub-pool whose meta key is key; ok is false for a
// key that is not one.
func ParseMeta(key string) (sp SubPool, ok bool) {
	return parseKey(key, "}:meta", func(k Keys) string { return k.Meta })
}
