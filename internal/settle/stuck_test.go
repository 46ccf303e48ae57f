package settle_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/logtest"
	"rain/internal/redistest"
	"rain/internal/settle"
	"rain/internal/wait/waittest"
)

// TestOneStuckOutboxSlowsNoOther: a grant whose confirm keeps failing (its
// record garbled on the shard: confirm_many answers an error for it, every
// pass) is read again at its outbox's own backoff. The grants made after
// it, in pool b on the same shard and in its own sub-pool of pool a, both
// with a hold of 2 s, are each confirmed before their deadline meanwhile.
// Before, its failures doubled the whole shard's wait between passes, up
// to MaxRetryDelay (8 s here, 15 s by default), and the other grants
// waited past their hold. Once its record is back, it is confirmed and
// paid too: nothing was acknowledged while it failed.
func TestOneStuckOutboxSlowsNoOther(t *testing.T) {
	ge := grabtest.Start(t, 1, redistest.Options{})
	ctx := context.Background()
	for _, s := range []rain.Spec{
		{PoolID: "a", TotalCents: 1000, Count: 10, SubPools: 1, HoldSeconds: 2},
		{PoolID: "b", TotalCents: 500, Count: 5, SubPools: 1, HoldSeconds: 2},
	} {
		if _, _, err := ge.Catalog.Preload(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	grabAll(t, ge.Service, "a", "u", 1)
	subs, err := ge.Catalog.SubPools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var stuck rain.Keys
	for _, sp := range subs {
		if sp.Pool == "a" {
			stuck = sp.Keys()
		}
	}
	c := ge.Shards.Client(subs[0].Shard)
	rec, err := c.HGet(ctx, stuck.Grants, "u0").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, stuck.Grants, "u0", "garbled").Err(); err != nil {
		t.Fatal(err)
	}

	sink := newMemSink(0)
	cfg := fastConfig("a")
	cfg.RetryDelay, cfg.MaxRetryDelay = 50*time.Millisecond, 8*time.Second
	var held atomic.Bool
	cfg.Held = func(string) bool { return held.Load() }
	var log logtest.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	w := settle.New(ge.Shards, ge.Catalog, sink, cfg)
	run(t, w)
	// Seven failed passes in a row: the shard's own backoff was past 3 s
	// from then on.
	waittest.Until(t, 30*time.Second, "a's confirm refused seven times", func() bool { return w.Stats().Failures >= 7 })

	for i := range 4 {
		for _, id := range []string{"b", "a"} {
			r, err := ge.Service.Grab(ctx, id, fmt.Sprintf("v%d", i))
			if err != nil || r.Outcome != grab.Granted {
				t.Fatalf("grab of %s by v%d = %+v, %v", id, i, r, err)
			}
			waittest.Until(t, 20*time.Second, id+"'s grant confirmed", func() bool {
				st, err := ge.Catalog.Status(ctx, id)
				return err == nil && st.ConfirmedCount == int64(i+1)
			})
			if late := time.Since(r.ExpiresAt); late > 0 {
				t.Fatalf("%s's grant %d confirmed %v after its deadline, while a's first grant's confirm failed", id, i, late)
			}
		}
	}
	waittest.Until(t, 20*time.Second, "the 8 grants after a's first paid", func() bool {
		paid, _ := sink.stats()
		return paid == 8
	})
	if st, err := ge.Catalog.Status(ctx, "a"); err != nil || st.ConfirmedCount != 4 || st.HeldCount != 1 {
		t.Fatalf("a while its first grant's confirm fails: %+v, %v; want 4 confirmed, 1 held", st, err)
	}

	// A grant of a made after that, whose confirm fails once (its record
	// garbled before the worker reads its entry, put back once the worker
	// has tried): tried again after a wait of its own, not the first
	// grant's, and confirmed before its deadline.
	var x grab.Result
	try := 0
	for ; ; try++ {
		// The passes stop; one under way may read an entry yet (its
		// blocking read wakes at once): given time to end, and checked.
		held.Store(true)
		time.Sleep(4 * cfg.Block)
		user := fmt.Sprintf("x%d", try)
		var err error
		if x, err = ge.Service.Grab(ctx, "a", user); err != nil || x.Outcome != grab.Granted {
			t.Fatalf("grab of a by %s = %+v, %v", user, x, err)
		}
		xrec, err := c.HGet(ctx, stuck.Grants, user).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.HSet(ctx, stuck.Grants, user, "garbled").Err(); err != nil {
			t.Fatal(err)
		}
		if !readBy(t, c, stuck.Outbox) {
			held.Store(false)
			waittest.Until(t, 20*time.Second, "x's confirm tried", func() bool {
				return strings.Contains(log.String(), fmt.Sprintf("serial=%d ", x.Serial))
			})
			if err := c.HSet(ctx, stuck.Grants, user, xrec).Err(); err != nil {
				t.Fatal(err)
			}
			break
		}
		// Read (and perhaps confirmed) before it was garbled: put back.
		if err := c.HSet(ctx, stuck.Grants, user, xrec).Err(); err != nil {
			t.Fatal(err)
		}
		held.Store(false)
		if try == 4 {
			t.Fatal("the worker read every new entry before its record could be garbled")
		}
		waittest.Until(t, 20*time.Second, user+"'s grant confirmed", func() bool {
			st, err := ge.Catalog.Status(ctx, "a")
			return err == nil && st.ConfirmedCount == int64(5+try)
		})
	}
	waittest.Until(t, 20*time.Second, "x's grant confirmed", func() bool {
		st, err := ge.Catalog.Status(ctx, "a")
		return err == nil && st.ConfirmedCount == int64(5+try)
	})
	if late := time.Since(x.ExpiresAt); late > 0 {
		t.Fatalf("a grant whose confirm failed once was confirmed %v after its deadline, while a's first grant's confirm failed", late)
	}

	if err := c.HSet(ctx, stuck.Grants, "u0", rec).Err(); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 30*time.Second, "a's grant paid once its record is back", func() bool {
		paid, _ := sink.stats()
		return paid == 10+try
	})
	if st, err := ge.Catalog.Status(ctx, "a"); err != nil || st.ConfirmedCount != int64(6+try) {
		t.Fatalf("a: %+v, %v; want its grant confirmed", st, err)
	}
}

// readBy reports whether the settle group has read the last entry of the
// stream key.
func readBy(t *testing.T, c redis.UniversalClient, key string) bool {
	t.Helper()
	ctx := context.Background()
	st, err := c.XInfoStream(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	gs, err := c.XInfoGroups(ctx, key).Result()
	if err != nil || len(gs) != 1 {
		t.Fatalf("groups of %s: %v, %v", key, gs, err)
	}
	return gs[0].LastDeliveredID == st.LastGeneratedID
}
