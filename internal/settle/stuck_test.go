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
// pass) is tried again at its own backoff. The grants made after it, in
// pool b on the same shard and in its own sub-pool of pool a, both with a
// hold of 2 s, are each confirmed before their deadline meanwhile, and so
// is one of a whose confirm fails once: it is tried again after a wait of
// its own. Before, its failures doubled the whole shard's wait between
// passes, up to MaxRetryDelay (8 s here, 15 s by default), and the other
// grants waited past their hold. Once its record is back, it is confirmed
// and paid too: nothing was acknowledged while it failed.
func TestOneStuckOutboxSlowsNoOther(t *testing.T) {
	st := startStuck(t, 10, []string{"u0"}, nil, rain.Spec{PoolID: "b", TotalCents: 500, Count: 5, SubPools: 1, HoldSeconds: 2})
	// Seven failed passes in a row: the shard's own backoff was past 3 s
	// from then on.
	waittest.Until(t, 30*time.Second, "a's confirm refused seven times", func() bool { return st.w.Stats().Failures >= 7 })

	for i := range 4 {
		for _, id := range []string{"b", "a"} {
			r, err := st.ge.Service.Grab(st.ctx, id, fmt.Sprintf("v%d", i))
			if err != nil || r.Outcome != grab.Granted {
				t.Fatalf("grab of %s by v%d = %+v, %v", id, i, r, err)
			}
			st.confirmedBy(t, id, int64(i+1), r)
		}
	}
	waittest.Until(t, 20*time.Second, "the 8 grants after a's first paid", func() bool {
		paid, _ := st.sink.stats()
		return paid == 8
	})
	if s, err := st.ge.Catalog.Status(st.ctx, "a"); err != nil || s.ConfirmedCount != 4 || s.HeldCount != 1 {
		t.Fatalf("a while its first grant's confirm fails: %+v, %v; want 4 confirmed, 1 held", s, err)
	}
	tries := st.failOnce(t, 4)

	st.put(t, "u0", st.recs["u0"])
	waittest.Until(t, 30*time.Second, "a's grant paid once its record is back", func() bool {
		paid, _ := st.sink.stats()
		return paid == 9+tries
	})
	if s, err := st.ge.Catalog.Status(st.ctx, "a"); err != nil || s.ConfirmedCount != int64(5+tries) {
		t.Fatalf("a: %+v, %v; want its grant confirmed", s, err)
	}
}

// TestEntriesPutOffHideNoOther: a full read of an outbox's pending entries
// (Config.Batch, 2 here) that are all put off (two grants whose confirms
// keep failing) does not hide the entry behind them: a grant whose
// confirm fails once is tried again after its own wait and confirmed
// before its deadline. Before, the passes read the same first page of
// pending entries again and again, and the entry behind it was read again
// only when the takeover of idle entries (ClaimAfter, a minute here) took
// it.
func TestEntriesPutOffHideNoOther(t *testing.T) {
	st := startStuck(t, 10, []string{"u0", "u1"}, func(cfg *settle.Config) { cfg.Batch, cfg.ClaimAfter = 2, time.Minute })
	waittest.Until(t, 30*time.Second, "both confirms refused four times", func() bool { return st.w.Stats().Failures >= 8 })
	made := st.failOnce(t, 0)
	st.put(t, "u0", st.recs["u0"])
	st.put(t, "u1", st.recs["u1"])
	waittest.Until(t, 30*time.Second, "every grant paid once the records are back", func() bool {
		paid, _ := st.sink.stats()
		return paid == made+2
	})
	waittest.Until(t, 30*time.Second, "the outbox empty", func() bool {
		n, err := st.c.XLen(st.ctx, st.keys.Outbox).Result()
		return err == nil && n == 0
	})
}

// TestEntriesLeftForAnOperatorAreNoLag: an outbox whose pending entries,
// more than two reads' worth (Batch 2), all wait for an operator (entries
// that cannot be read as grants) is no lag: the passes that read a page
// behind the front do not take one of those as a mark of unsettled
// entries behind it. They did, a review found: the lag grew for as long as
// the entries waited.
func TestEntriesLeftForAnOperatorAreNoLag(t *testing.T) {
	st := startStuck(t, 10, nil, func(cfg *settle.Config) { cfg.Batch = 2 })
	for range 5 {
		if err := st.c.XAdd(st.ctx, &redis.XAddArgs{Stream: st.keys.Outbox, Values: []string{"G", "unreadable"}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waittest.Until(t, 20*time.Second, "the five entries left for an operator", func() bool { return st.w.Stats().Conflicts == 5 })
	time.Sleep(3 * time.Second) // the passes read their pages again, many times over
	if s := st.w.Stats(); s.Lag > time.Second || s.LeftForOperator == 0 {
		t.Fatalf("with only entries left for an operator pending: lag %v, %d left for an operator; want no lag, some left", s.Lag, s.LeftForOperator)
	}
}

// stuck is a worker on one shard with pool a (hold 2 s, one sub-pool),
// grants of it whose records are garbled, and whatever other pools were
// given.
type stuck struct {
	ctx  context.Context
	ge   *grabtest.Env
	c    redis.UniversalClient
	keys rain.Keys // pool a's sub-pool's
	sink *memSink
	cfg  settle.Config
	w    *settle.Worker
	held atomic.Bool // the worker's passes stop (Config.Held)
	log  logtest.Buffer
	recs map[string]string // the garbled records, as they were
}

// startStuck preloads pool a (count packets) and the others, grants each
// of users one of a (in a batch of its own) and garbles its record, and
// then starts a worker: fastConfig with retries of 50 ms to 8 s, and what
// set changes.
func startStuck(t *testing.T, count int64, users []string, set func(*settle.Config), others ...rain.Spec) *stuck {
	st := &stuck{ctx: context.Background(), ge: grabtest.Start(t, 1, redistest.Options{})}
	for _, s := range append([]rain.Spec{{PoolID: "a", TotalCents: 100 * count, Count: count, SubPools: 1, HoldSeconds: 2}}, others...) {
		if _, _, err := st.ge.Catalog.Preload(st.ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	subs, err := st.ge.Catalog.SubPools(st.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sp := range subs {
		if sp.Pool == "a" {
			st.keys, st.c = sp.Keys(), st.ge.Shards.Client(sp.Shard)
		}
	}
	st.recs = map[string]string{}
	for _, u := range users {
		if r, err := st.ge.Service.Grab(st.ctx, "a", u); err != nil || r.Outcome != grab.Granted {
			t.Fatalf("grab of a by %s = %+v, %v", u, r, err)
		}
		st.recs[u] = st.garble(t, u)
	}
	st.sink = newMemSink(0)
	st.cfg = fastConfig("a")
	st.cfg.RetryDelay, st.cfg.MaxRetryDelay = 50*time.Millisecond, 8*time.Second
	st.cfg.Held = func(string) bool { return st.held.Load() }
	st.cfg.Logger = slog.New(slog.NewTextHandler(&st.log, nil))
	if set != nil {
		set(&st.cfg)
	}
	st.w = settle.New(st.ge.Shards, st.ge.Catalog, st.sink, st.cfg)
	run(t, st.w)
	return st
}

// garble garbles user's grant record of pool a, and returns what it was.
func (st *stuck) garble(t *testing.T, user string) string {
	t.Helper()
	rec, err := st.c.HGet(st.ctx, st.keys.Grants, user).Result()
	if err != nil {
		t.Fatal(err)
	}
	st.put(t, user, "garbled")
	return rec
}

// put sets user's grant record of pool a.
func (st *stuck) put(t *testing.T, user, rec string) {
	t.Helper()
	if err := st.c.HSet(st.ctx, st.keys.Grants, user, rec).Err(); err != nil {
		t.Fatal(err)
	}
}

// confirmedBy waits for pool id's confirmed count to reach n, and checks
// that r, the grant it waited for, was confirmed before its deadline.
func (st *stuck) confirmedBy(t *testing.T, id string, n int64, r grab.Result) {
	t.Helper()
	waittest.Until(t, 20*time.Second, id+"'s grant confirmed", func() bool {
		s, err := st.ge.Catalog.Status(st.ctx, id)
		return err == nil && s.ConfirmedCount == n
	})
	if late := time.Since(r.ExpiresAt); late > 0 {
		t.Fatalf("%s's grant of serial %d confirmed %v after its deadline", id, r.Serial, late)
	}
}

// failOnce grants a new user of pool a a packet whose confirm fails once
// (its record garbled before the worker reads its entry, put back once
// the worker has tried), and checks that it is confirmed before its
// deadline; a had confirmed grants before it. It returns how many grants
// it made (the worker may read an entry before its record is garbled:
// then that grant is confirmed and it tries again).
func (st *stuck) failOnce(t *testing.T, confirmed int64) int {
	t.Helper()
	for try := 0; try < 5; try++ {
		// The passes stop; one under way may read an entry yet (its
		// blocking read wakes at once): given time to end, and checked.
		st.held.Store(true)
		time.Sleep(4 * st.cfg.Block)
		user := fmt.Sprintf("x%d", try)
		x, err := st.ge.Service.Grab(st.ctx, "a", user)
		if err != nil || x.Outcome != grab.Granted {
			t.Fatalf("grab of a by %s = %+v, %v", user, x, err)
		}
		rec := st.garble(t, user)
		read := readBy(t, st.c, st.keys.Outbox)
		if !read {
			st.held.Store(false)
			waittest.Until(t, 20*time.Second, user+"'s confirm tried", func() bool {
				return strings.Contains(st.log.String(), fmt.Sprintf("serial=%d ", x.Serial))
			})
		}
		st.put(t, user, rec)
		st.held.Store(false)
		st.confirmedBy(t, "a", confirmed+int64(try)+1, x)
		if !read {
			return try + 1
		}
	}
	t.Fatal("the worker read every new entry before its record could be garbled")
	return 0
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
