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

// DueQuiet is how long after its last mark a sub-pool with nothing to do
// may leave the due index: longer than the interval a grab marks a
// sub-pool at (at most every 250 ms), so that a grant made in between,
// unmarked, is seen (see due_done.lua).
const DueQuiet = 2 * time.Second

// MarkDue marks the sub-pools (their meta keys) of one shard as having work
// for the reaper: due after the given time from now (by the shard's clock)
// unless already in the index (a grant made falls due no sooner than what
// the index holds).
func MarkDue(ctx context.Context, c Client, after time.Duration, metas []string) error {
	return markDue(ctx, c, after, "keep", metas)
}

// MarkDueSooner is MarkDue for a sub-pool that may need the reaper sooner
// than the index says (a spill's transfer taken there): due after the given
// time from now unless it is due sooner already.
func MarkDueSooner(ctx context.Context, c Client, after time.Duration, metas []string) error {
	return markDue(ctx, c, after, "sooner", metas)
}

func markDue(ctx context.Context, c Client, after time.Duration, mode string, metas []string) error {
	args := make([]any, 0, len(metas)+2)
	args = append(args, after.Milliseconds(), mode)
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

// ReadDue returns up to limit sub-pools of the shard that are due by its
// clock, earliest first, after skipping skip of them, and how long until
// the earliest of the others is (negative: none).
func ReadDue(ctx context.Context, c Client, skip, limit int) ([]Due, time.Duration, error) {
	res, err := dueReadScript.Run(ctx, c, []string{DueAt, DueGen}, skip, limit).Slice()
	if err != nil {
		return nil, 0, err
	}
	next := time.Duration(integer(res, 0)) * time.Millisecond
	if integer(res, 0) < 0 {
		next = -1
	}
	due := make([]Due, 0, (len(res)-1)/2)
	for i := 1; i+1 < len(res); i += 2 {
		due = append(due, Due{Meta: str(res, i), Gen: str(res, i+1)})
	}
	return due, next, nil
}

// DueDone is what DoneDue did.
type DueDone uint8

// DoneDue results.
const (
	DueStays DueDone = iota // still due: marked since it was read
	DueLeft                 // out of the index: nothing to do there
	DueMoved                // its next look is later
)

// DoneDue tells the index the reaper swept d (or could not): look again
// after in (after DueQuiet at the latest when d was marked since it was
// read: a spill's transfer taken after the reaper looked needs a look
// before the grants held there fall due), or, with in negative, nothing is
// left to do there, and d leaves the index unless it was marked since it
// was read or within DueQuiet (then it is looked at again once DueQuiet
// has passed).
func DoneDue(ctx context.Context, c Client, d Due, in time.Duration) (DueDone, error) {
	ms := int64(-1)
	if in >= 0 {
		ms = in.Milliseconds()
	}
	n, err := dueDoneScript.Run(ctx, c, []string{DueAt, DueGen}, d.Meta, d.Gen, strconv.FormatInt(ms, 10), DueQuiet.Milliseconds()).Int()
	return DueDone(n), err
}
