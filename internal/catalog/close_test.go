package catalog

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"rain"
	"rain/internal/lua"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// endedAndSettled preloads spec on e, grabs for six users, ends the pool
// and settles every grant by hand: the pool can close.
func (e *env) endedAndSettled(t *testing.T, spec rain.Spec) {
	t.Helper()
	e.preload(t, spec)
	e.claim(t, spec.PoolID, 1, "a", "b", "c", "d", "e", "f")
	if _, err := e.cat.End(context.Background(), spec.PoolID); err != nil {
		t.Fatal(err)
	}
	e.settleByHand(t, spec.PoolID)
}

// TestClosedPoolSurvivesTheSerialShardsLoss: the serial shard restarted
// without its data after a close (or in the middle of one, the record left
// closing) loses nothing: another process finds the pool on the other
// shards with its account, writes the whole record back (its account
// too), answers status, audit and close from it without a panic, and
// finishes a close that was caught in closing.
func TestClosedPoolSurvivesTheSerialShardsLoss(t *testing.T) {
	for _, caught := range []bool{false, true} {
		name := "closed"
		if caught {
			name = "caught in closing"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			spec := rain.Spec{PoolID: "lost", TotalCents: 10_000, Count: 100, SubPools: 3}
			servers := redistest.StartN(t, 3, redistest.Options{})
			proxies := make([]*redisproxy.Proxy, len(servers))
			addrs := make([]string, len(servers))
			for i, s := range servers {
				proxies[i] = redisproxy.Start(t, s.Addr)
				addrs[i] = proxies[i].Addr
			}
			e := envOn(t, servers, redistest.Addrs(servers))
			e.endedAndSettled(t, spec)
			var a *rain.Account
			if caught {
				// The closing process dies once the record says closing on
				// every shard (s3's copy is written last), before it
				// retires a sub-pool.
				proxies[2].PartitionAfter(redisproxy.Script(lua.SHA("record")), 1, func() {
					for _, p := range proxies {
						p.Partition()
					}
				})
				if _, err := envOn(t, nil, addrs).cat.Close(ctx, spec.PoolID); err == nil {
					t.Fatal("a close whose process died before retiring succeeded")
				}
			} else {
				var err error
				if a, err = e.cat.Close(ctx, spec.PoolID); err != nil {
					t.Fatal(err)
				}
			}
			servers[0].Kill() // the serial shard, s1: no persistence
			servers[0].Restart()
			fresh := envOn(t, servers, redistest.Addrs(servers)) // another process
			st, err := fresh.cat.Status(ctx, spec.PoolID)
			if err != nil || st.Account == nil {
				t.Fatalf("Status after the serial shard lost its data = %+v, %v; want the account", st, err)
			}
			if caught {
				if st.State != string(rain.Closing) {
					t.Fatalf("state = %s, want closing", st.State)
				}
				if a, err = fresh.cat.Close(ctx, spec.PoolID); err != nil {
					t.Fatalf("the close caught in closing, run again = %v", err)
				}
			}
			if rep, err := fresh.cat.Audit(ctx, spec.PoolID); err != nil || !rep.OK {
				t.Fatalf("Audit = %+v, %v", rep, err)
			}
			rec, err := fresh.shards.Client("s1").HGetAll(ctx, recordKey(spec.PoolID)).Result()
			if err != nil || rec["state"] != string(rain.Closed) || rec["account"] == "" || rec["spec"] == "" {
				t.Fatalf("the serial shard's record after the read = %v, %v; want it whole, closed, with its account", rec, err)
			}
			checkClosed(t, fresh, spec, a)
		})
	}
}

// TestEndAndCloseNeedEveryPlacementShard: a tool or instance that lacks a
// shard the pool was placed on refuses End and Close with ErrUnavailable
// naming the shard, before it writes anything: no sub-pool is left ended
// or sealed while others are not.
func TestEndAndCloseNeedEveryPlacementShard(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 3, redistest.Options{})
	spec := rain.Spec{PoolID: "far", TotalCents: 3_000, Count: 30, SubPools: 3}
	e.preload(t, spec)
	short := envOn(t, e.servers[:2], redistest.Addrs(e.servers[:2])) // s1 and s2 only
	before := e.dump(t)
	if _, err := short.cat.End(ctx, spec.PoolID); !errors.Is(err, rain.ErrUnavailable) || !strings.Contains(err.Error(), "s3") {
		t.Fatalf("End without s3 = %v; want unavailable, naming s3", err)
	}
	if after := e.dump(t); !reflect.DeepEqual(before, after) {
		t.Fatal("a refused end changed the shards")
	}
	if _, err := e.cat.End(ctx, spec.PoolID); err != nil {
		t.Fatal(err)
	}
	before = e.dump(t)
	if _, err := short.cat.Close(ctx, spec.PoolID); !errors.Is(err, rain.ErrUnavailable) || !strings.Contains(err.Error(), "s3") {
		t.Fatalf("Close without s3 = %v; want unavailable, naming s3", err)
	}
	if after := e.dump(t); !reflect.DeepEqual(before, after) {
		t.Fatal("a refused close changed the shards")
	}
}

// TestRefusedCloseLeavesNothingSealed: a close refused (a grant still
// held) whose seal's reply was lost and sent again (rain's client retries)
// opens every sub-pool it sealed: the re-sent seal is its own.
func TestRefusedCloseLeavesNothingSealed(t *testing.T) {
	ctx := context.Background()
	spec := rain.Spec{PoolID: "held", TotalCents: 3_000, Count: 30, SubPools: 3}
	servers := redistest.StartN(t, 3, redistest.Options{})
	e := envOn(t, servers, redistest.Addrs(servers))
	e.preload(t, spec)
	p, err := e.cat.Read(ctx, spec.PoolID)
	if err != nil {
		t.Fatal(err)
	}
	// A grant held on the last sub-pool: the close is refused there.
	var user string
	for u := 0; ; u++ {
		if user = string(rune('a'+u%26)) + strings.Repeat("x", u/26); p.Home(user) == 2 {
			break
		}
	}
	e.claim(t, spec.PoolID, 1, user)
	if _, err := e.cat.End(ctx, spec.PoolID); err != nil {
		t.Fatal(err)
	}
	proxies := make([]*redisproxy.Proxy, len(servers))
	addrs := make([]string, len(servers))
	for i, s := range servers {
		proxies[i] = redisproxy.Start(t, s.Addr)
		addrs[i] = proxies[i].Addr
		proxies[i].DropReplies(redisproxy.Script(lua.SHA("seal")), 1)
	}
	if _, err := envOn(t, nil, addrs).cat.Close(ctx, spec.PoolID); !errors.Is(err, rain.ErrNotNow) || !strings.Contains(err.Error(), "held") {
		t.Fatalf("Close with a grant held = %v; want not now, held", err)
	}
	for j := range p.SubPools() {
		k := p.SubPool(j).Keys()
		if st, _ := e.cat.client(p, j).HGet(ctx, k.Meta, "state").Result(); st != "open" {
			t.Errorf("sub-pool %d is %q after a refused close whose seal was sent twice; want open", j, st)
		}
	}
}

// TestCloseMeetsAnotherAtWork: a close that meets a sub-pool sealed by
// another close at work refuses, naming it, opens only the sub-pools it
// sealed itself and leaves the other's seal; once that seal's lease has run
// out (its close died), a close takes it over and finishes.
func TestCloseMeetsAnotherAtWork(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 3, redistest.Options{})
	spec := rain.Spec{PoolID: "two", TotalCents: 3_000, Count: 30, SubPools: 3}
	e.endedAndSettled(t, spec)
	p, err := e.cat.Read(ctx, spec.PoolID)
	if err != nil {
		t.Fatal(err)
	}
	k1 := p.SubPool(1).Keys()
	if s, err := lua.Seal(ctx, e.cat.client(p, 1), &k1, "the-other-close", e.cat.lease); err != nil || !s.OK {
		t.Fatalf("the other close's seal = %+v, %v", s, err)
	}
	if _, err := e.cat.Close(ctx, spec.PoolID); !errors.Is(err, rain.ErrNotNow) || !strings.Contains(err.Error(), "another close is at work") {
		t.Fatalf("Close beside another = %v; want not now, another close at work", err)
	}
	for j, want := range []string{"open", "closing", "open"} {
		k := p.SubPool(j).Keys()
		if st, _ := e.cat.client(p, j).HGet(ctx, k.Meta, "state").Result(); st != want {
			t.Errorf("sub-pool %d is %q after the refusal, want %q", j, st, want)
		}
	}
	var a *rain.Account
	waittest.Until(t, 10*time.Second, "the close finishes once the other's seal lapsed", func() bool {
		a, err = e.cat.Close(ctx, spec.PoolID)
		return err == nil
	})
	if a.ConfirmedCount != 6 {
		t.Fatalf("account %+v, want 6 confirmed", a)
	}
	e.checkFreed(t, spec.PoolID, nil)
}

// TestCloseOfAClosingPoolNeedsEveryShard: a pool caught in closing (its
// close died once the record said closing, before any sub-pool retired),
// closed again by a tool that lacks one of its shards, is refused with
// ErrUnavailable naming the shard before any retire: no panic, no sub-pool
// retired on some shards and not on others.
func TestCloseOfAClosingPoolNeedsEveryShard(t *testing.T) {
	ctx := context.Background()
	spec := rain.Spec{PoolID: "caught", TotalCents: 3_000, Count: 30, SubPools: 3}
	servers := redistest.StartN(t, 3, redistest.Options{})
	proxies := make([]*redisproxy.Proxy, len(servers))
	addrs := make([]string, len(servers))
	for i, s := range servers {
		proxies[i] = redisproxy.Start(t, s.Addr)
		addrs[i] = proxies[i].Addr
	}
	e := envOn(t, servers, redistest.Addrs(servers))
	e.endedAndSettled(t, spec)
	proxies[2].PartitionAfter(redisproxy.Script(lua.SHA("record")), 1, func() {
		for _, p := range proxies {
			p.Partition()
		}
	})
	if _, err := envOn(t, nil, addrs).cat.Close(ctx, spec.PoolID); err == nil {
		t.Fatal("a close whose process died before retiring succeeded")
	}
	short := envOn(t, servers[:2], redistest.Addrs(servers[:2])) // s1 and s2 only
	before := e.dump(t)
	if _, err := short.cat.Close(ctx, spec.PoolID); !errors.Is(err, rain.ErrUnavailable) || !strings.Contains(err.Error(), "s3") {
		t.Fatalf("Close of a closing pool without s3 = %v; want unavailable, naming s3", err)
	}
	if after := e.dump(t); !reflect.DeepEqual(before, after) {
		t.Fatal("a refused close of a closing pool changed the shards")
	}
	if _, err := e.cat.Close(ctx, spec.PoolID); err != nil {
		t.Fatalf("the close with every shard = %v", err)
	}
}

// TestAnotherProcessSeesTheClose: a process that keeps a pool's open
// record and hears no notice (rain settle) sees the pool closed at its next
// registry read (the shards' life counters moved), and reads no record
// again while nothing moves.
func TestAnotherProcessSeesTheClose(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 2, redistest.Options{})
	spec := rain.Spec{PoolID: "seen", TotalCents: 2_000, Count: 20, SubPools: 2}
	e.endedAndSettled(t, spec)
	other := envOn(t, e.servers, redistest.Addrs(e.servers))
	if _, err := other.cat.ReadList(ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := other.cat.Cached(ctx, spec.PoolID); err != nil || p.State != rain.Open {
		t.Fatalf("Cached = %+v, %v; want open", p, err)
	}
	if _, err := e.cat.Close(ctx, spec.PoolID); err != nil {
		t.Fatal(err)
	}
	if p, _ := other.cat.Cached(ctx, spec.PoolID); p.State != rain.Open {
		t.Fatalf("before its next registry read the other process reads %s; want its kept record, open", p.State)
	}
	if _, err := other.cat.ReadList(ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := other.cat.Cached(ctx, spec.PoolID); err != nil || p.State != rain.Closed {
		t.Fatalf("Cached after the next registry read = %+v, %v; want closed", p, err)
	}
}

// TestClosedRecordsKeptAreBounded: a process keeps at most so many closed
// pools' records in memory (a season's would stay for its life otherwise);
// one that left is read again, still closed, with its account.
func TestClosedRecordsKeptAreBounded(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 2, redistest.Options{})
	e.cat.kept = 2
	for i := range 4 {
		spec := rain.Spec{PoolID: fmt.Sprintf("night-%d", i), TotalCents: 2_000, Count: 20, SubPools: 2}
		e.endedAndSettled(t, spec)
		if _, err := e.cat.Close(ctx, spec.PoolID); err != nil {
			t.Fatal(err)
		}
		if p, err := e.cat.Cached(ctx, spec.PoolID); err != nil || p.State != rain.Closed {
			t.Fatalf("Cached(%s) = %+v, %v; want closed", spec.PoolID, p, err)
		}
	}
	e.cat.mu.RLock()
	closed := 0
	for _, p := range e.cat.records {
		if p.State == rain.Closed {
			closed++
		}
	}
	counted := e.cat.closed
	e.cat.mu.RUnlock()
	if closed != 2 || counted != 2 {
		t.Fatalf("%d closed records kept (%d counted); want 2", closed, counted)
	}
	// A listing of the live sub-pools skips every closed pool without
	// reading its record again, those whose record left memory too.
	reads := func() (n int64) {
		for _, s := range e.servers {
			n += hgetallCalls(t, s)
		}
		return n
	}
	before := reads()
	for range 3 {
		if subs, err := e.cat.SubPools(ctx); err != nil || len(subs) != 0 {
			t.Fatalf("SubPools with only closed pools = %v, %v; want none", subs, err)
		}
	}
	if n := reads() - before; n != 0 {
		t.Fatalf("listing the live sub-pools read %d pool records again, want none (every pool is closed)", n)
	}
	for i := range 4 {
		p, err := e.cat.Cached(ctx, fmt.Sprintf("night-%d", i))
		if err != nil || p.State != rain.Closed || p.Account == nil || p.Account.PreloadedCents != 2_000 {
			t.Fatalf("Cached(night-%d) = %+v, %v; want closed with its account", i, p, err)
		}
	}
}

// hgetallCalls is how many HGETALL the server has run (a pool record's
// read), from INFO commandstats.
func hgetallCalls(t *testing.T, s *redistest.Server) int64 {
	t.Helper()
	info, err := redistest.Client(t, s).Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_hgetall:calls="); ok {
			n, _ := strconv.ParseInt(strings.Split(rest, ",")[0], 10, 64)
			return n
		}
	}
	return 0
}
