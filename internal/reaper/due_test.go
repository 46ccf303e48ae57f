package reaper

import (
	"context"
	"testing"
	"time"

	"rain/internal/catalog"
	"rain/internal/lua"
	"rain/internal/wait/waittest"
)

// indexed is how many sub-pools the shards' due indexes hold.
func (e *env) indexed(t *testing.T) int64 {
	t.Helper()
	var n int64
	for _, c := range e.clients {
		k, err := c.ZCard(context.Background(), lua.DueAt).Result()
		if err != nil {
			t.Fatal(err)
		}
		n += k
	}
	return n
}

// TestDueIndexFollowsTheWork: grabs mark their sub-pools in their shards'
// due indexes; the reaper (whose slow pass over every pool runs once, when
// it starts leading, before anything is held) releases the grants at their
// deadline from the index alone, and once nothing is held the sub-pools
// leave it. A pool whose window starts tomorrow, and one nobody grabbed
// from, are never in it.
func TestDueIndexFollowsTheWork(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	tomorrow := time.Now().Add(24 * time.Hour)
	for _, sp := range []catalog.Spec{
		{PoolID: "later", TotalCents: 1000, Count: 10, SubPools: 2, StartsAt: &tomorrow},
		{PoolID: "quiet", TotalCents: 1000, Count: 10, SubPools: 2},
	} {
		if _, _, err := e.cat.Preload(ctx, sp); err != nil {
			t.Fatal(err)
		}
	}
	r := New(e.cat, e.locker(time.Second), Config{Interval: 100 * time.Millisecond, IdlePoll: 200 * time.Millisecond, FullSweep: time.Hour})
	start(t, r)
	waittest.Until(t, 10*time.Second, "the reaper's first pass", func() bool { return r.Stats().Sweeps > 0 })
	e.grabAll(t, "p", 20, 1)
	waittest.Until(t, 10*time.Second, "the grabbed pool's 2 sub-pools in the due indexes", func() bool { return e.indexed(t) == 2 })
	waittest.Until(t, 10*time.Second, "the 20 grants released", func() bool { return r.Stats().Released == 20 })
	waittest.Until(t, 10*time.Second, "the sub-pools gone from the due indexes", func() bool { return e.indexed(t) == 0 })
	e.assertAudit(t, "p")
}

// TestSlowPassMakesUpALostMark: grants whose marks were lost (the due
// indexes emptied, as a crash between a grant and its mark would leave
// them) are found by the reaper's slow pass over every live pool, put in
// the index, and released at their deadline.
func TestSlowPassMakesUpALostMark(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.grabAll(t, "p", 20, 2)
	waittest.Until(t, 10*time.Second, "the marks made", func() bool { return e.indexed(t) == 2 })
	for _, c := range e.clients {
		if err := c.Del(ctx, lua.DueAt, lua.DueGen).Err(); err != nil {
			t.Fatal(err)
		}
	}
	r := New(e.cat, e.locker(time.Second), Config{Interval: 100 * time.Millisecond, IdlePoll: 200 * time.Millisecond, FullSweep: time.Hour})
	start(t, r)
	waittest.Until(t, 10*time.Second, "the sub-pools back in the due indexes", func() bool { return e.indexed(t) == 2 })
	waittest.Until(t, 10*time.Second, "the 20 grants released", func() bool { return r.Stats().Released == 20 })
	e.assertAudit(t, "p")
}
