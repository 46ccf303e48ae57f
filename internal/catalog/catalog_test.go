package catalog

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rain"
	"rain/internal/lua"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/shard/shardtest"
	"rain/internal/split"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.IgnoreProbe()) }

// env is a catalogue on real redis-server shards s1, s2, ... (s1 the serial
// shard), reached at addrs: the servers' own, or proxies in front of them.
type env struct {
	servers []*redistest.Server
	shards  *shard.Set
	cat     *Catalog
}

func newEnv(t testing.TB, n int, opts redistest.Options) *env {
	t.Helper()
	servers := redistest.StartN(t, n, opts)
	return envOn(t, servers, redistest.Addrs(servers))
}

func envOn(t testing.TB, servers []*redistest.Server, addrs []string) *env {
	t.Helper()
	set := shardtest.Open(t, addrs, shard.Options{}) // rain serve's options
	// A short seal lease: a close that died holding seals is taken over soon.
	return &env{servers: servers, shards: set, cat: New(set, Config{SealLease: 500 * time.Millisecond})}
}

func (e *env) preload(t testing.TB, spec rain.Spec) *rain.Status {
	t.Helper()
	st, created, err := e.cat.Preload(context.Background(), spec)
	if err != nil {
		t.Fatalf("Preload(%+v): %v", spec, err)
	}
	if !created {
		t.Fatalf("Preload(%+v): created = false, want true", spec)
	}
	return st
}

func (e *env) assertAudit(t testing.TB, pool string) {
	t.Helper()
	r, err := e.cat.Audit(context.Background(), pool)
	if err != nil {
		t.Fatalf("Audit(%s): %v", pool, err)
	}
	if !r.OK {
		t.Fatalf("Audit(%s) problems: %v", pool, r.Problems)
	}
}

// claim claims a packet of the pool for each user at their home sub-pool
// with claim_many, the script the grab path runs, serials from serial on.
func (e *env) claim(t testing.TB, id string, serial int64, users ...string) []lua.Claim {
	t.Helper()
	ctx := context.Background()
	p, err := e.cat.Cached(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var out []lua.Claim
	for i, u := range users {
		j := p.Home(u)
		k := p.SubPool(j).Keys()
		c, errs, err := lua.ClaimMany(ctx, e.shards.Client(p.Placement[j]), &k, lua.SpillValidity.Milliseconds(),
			[]lua.ClaimArg{{User: u, Serial: serial + int64(i)}})
		if err == nil {
			err = errs[0]
		}
		if err != nil {
			t.Fatalf("claim of %s: %v", u, err)
		}
		out = append(out, c[0])
	}
	return out
}

func TestPreloadIdempotent(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 2, redistest.Options{})
	spec := rain.Spec{PoolID: "p", TotalCents: 5000, Count: 100, MaxCents: 200}
	e.preload(t, spec)
	other := spec
	other.Count = 99
	same := spec
	same.MinCents, same.HoldSeconds = 1, rain.DefaultHoldSeconds
	for _, tt := range []struct {
		name string
		spec rain.Spec
		want error // nil: 200, created false
	}{
		{"the same spec", spec, nil},
		{"the same spec with its defaults spelled out", same, nil},
		{"another spec under the same id", other, rain.ErrConflict},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, created, err := e.cat.Preload(ctx, tt.spec)
			if !errors.Is(err, tt.want) || created {
				t.Fatalf("Preload: created %v, err %v; want false, %v", created, err, tt.want)
			}
		})
	}
	st, err := e.cat.Status(ctx, "p")
	if err != nil || st.Count != 100 || st.RemainingCount != 100 {
		t.Fatalf("Status after a refused preload = %+v, %v; want the first spec untouched", st, err)
	}
}

// TestConcurrentPreloadsCreateOnce: identical preloads of a new id sent at
// once (an operator's retries, two consoles) all succeed with the same
// pool, and exactly one says it created it (201; the others 200, API.md).
// Before, each that found the pool loading finished the load and said it
// created it.
func TestConcurrentPreloadsCreateOnce(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 2, redistest.Options{})
	for round := range 5 {
		spec := rain.Spec{PoolID: fmt.Sprintf("c%d", round), TotalCents: 2_000_000, Count: 20_000, SubPools: 2}
		const n = 6
		var created atomic.Int32
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				_, c, err := e.cat.Preload(ctx, spec)
				errs[i] = err
				if c {
					created.Add(1)
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if got := created.Load(); got != 1 {
			t.Fatalf("round %d: %d of %d concurrent identical preloads said they created the pool, want exactly 1", round, got, n)
		}
		if st, err := e.cat.Status(ctx, spec.PoolID); err != nil || st.RemainingCount != spec.Count || st.State != string(rain.Open) {
			t.Fatalf("round %d: status %+v, %v; want all %d packets, open", round, st, err, spec.Count)
		}
		e.assertAudit(t, spec.PoolID)
	}
}

func TestPreloadInvalid(t *testing.T) {
	e := newEnv(t, 1, redistest.Options{})
	past := time.Now().Add(-time.Hour)
	for _, tt := range []struct {
		name string
		spec rain.Spec
	}{
		{"no id", rain.Spec{PoolID: "", TotalCents: 10, Count: 1}},
		{"a space in the id", rain.Spec{PoolID: "bad id", TotalCents: 10, Count: 1}},
		{"braces in the id", rain.Spec{PoolID: "p{x}", TotalCents: 10, Count: 1}},
		{"no packets", rain.Spec{PoolID: "p", TotalCents: 10, Count: 0}},
		{"under a cent a packet", rain.Spec{PoolID: "p", TotalCents: 5, Count: 10}},
		{"min over the mean", rain.Spec{PoolID: "p", TotalCents: 100, Count: 10, MinCents: 20}},
		{"max under the mean", rain.Spec{PoolID: "p", TotalCents: 100, Count: 10, MaxCents: 5}},
		{"over the total limit", rain.Spec{PoolID: "p", TotalCents: rain.MaxTotalCents + 1, Count: 10}},
		{"negative sub-pools", rain.Spec{PoolID: "p", TotalCents: 100, Count: 10, SubPools: -1}},
		{"more sub-pools than packets", rain.Spec{PoolID: "p", TotalCents: 100, Count: 10, SubPools: 11}},
		{"negative hold", rain.Spec{PoolID: "p", TotalCents: 100, Count: 10, HoldSeconds: -5}},
		{"an empty window", rain.Spec{PoolID: "p", TotalCents: 100, Count: 10, StartsAt: &past, EndsAt: &past}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := e.cat.Preload(context.Background(), tt.spec); !errors.Is(err, rain.ErrInvalid) {
				t.Errorf("Preload(%+v) err = %v, want ErrInvalid", tt.spec, err)
			}
		})
	}
	// Nothing was written.
	keys, err := e.shards.Client("s1").Keys(context.Background(), "*").Result()
	if err != nil || len(keys) != 0 {
		t.Fatalf("keys after invalid preloads = %v, %v; want none", keys, err)
	}
}

// TestPreloadResumesAfterCrash: the preload's process is cut off from the
// shard of sub-pool 1 right after its first load script ran there (a
// partition: to the shard, a process that died), with the rest of the
// preload under way. The half-loaded pool stays loading (grabs answer
// not_started); the same preload again, from a process that reaches every
// shard, finishes the job: every packet, once, and the pool opens.
func TestPreloadResumesAfterCrash(t *testing.T) {
	ctx := context.Background()
	servers := redistest.StartN(t, 3, redistest.Options{})
	proxies := make([]*redisproxy.Proxy, len(servers))
	addrs := make([]string, len(servers))
	for i, s := range servers {
		proxies[i] = redisproxy.Start(t, s.Addr)
		addrs[i] = proxies[i].Addr
	}
	crashing := envOn(t, servers, addrs)
	spec := rain.Spec{PoolID: "big", TotalCents: 10_000_000, Count: 100_000, SubPools: 3}
	// Where sub-pool 1 will be: the placement walks the ring from the id.
	units, err := crashing.cat.units(ctx)
	if err != nil {
		t.Fatal(err)
	}
	placement, _, err := crashing.cat.place(spec.PoolID, 3, units)
	if err != nil {
		t.Fatal(err)
	}
	at := slices.Index(crashing.shards.Names(), placement[1])
	proxies[at].PartitionAfter(redisproxy.Script(lua.SHA("load")), 1, nil)
	if _, _, err := crashing.cat.Preload(ctx, spec); err == nil {
		t.Fatal("Preload cut off from a shard midway succeeded")
	}
	e := envOn(t, servers, redistest.Addrs(servers)) // the next process
	st, err := e.cat.Status(ctx, "big")
	if err != nil || st.State != string(rain.Loading) || st.RemainingCount >= spec.Count {
		t.Fatalf("Status(half-loaded) = %+v, %v; want loading with partial stock", st, err)
	}
	if c := e.claim(t, "big", 1, "early"); c[0].Outcome != lua.Closed {
		t.Fatalf("claim on the half-loaded pool = %+v, want closed (not_started)", c[0])
	}
	st, created, err := e.cat.Preload(ctx, spec)
	if err != nil || !created {
		t.Fatalf("Preload again = created %v, %v; want it to finish the job", created, err)
	}
	if st.RemainingCount != spec.Count || st.RemainingCents != spec.TotalCents || st.State != string(rain.Open) {
		t.Fatalf("Status after resume = %+v, want all %d packets, %d cents, open", st, spec.Count, spec.TotalCents)
	}
	e.assertAudit(t, "big")
	if c := e.claim(t, "big", 2, "now"); c[0].Outcome != lua.Granted {
		t.Fatalf("claim after resume = %+v, want granted", c[0])
	}
}

func TestPlacement(t *testing.T) {
	e := newEnv(t, 3, redistest.Options{})
	for _, tt := range []struct {
		k    int
		want int // distinct shards
	}{{1, 1}, {3, 3}, {5, 3}} {
		t.Run(fmt.Sprintf("%d sub-pools", tt.k), func(t *testing.T) {
			id := fmt.Sprintf("pl%d", tt.k)
			st := e.preload(t, rain.Spec{PoolID: id, TotalCents: 1000, Count: 100, SubPools: tt.k})
			shards := map[string]int{}
			for _, sp := range st.SubPools {
				shards[sp.Shard]++
			}
			if len(st.SubPools) != tt.k || len(shards) != tt.want {
				t.Fatalf("placement %+v, want %d sub-pools on %d distinct shards", st.SubPools, tt.k, tt.want)
			}
			e.assertAudit(t, id)
		})
	}
}

func TestAutoSubPools(t *testing.T) {
	for _, tt := range []struct {
		count  int64
		shards int
		want   int
	}{
		{1, 4, 1}, {100_000, 4, 1}, {100_001, 4, 2}, {350_000, 4, 4}, {1_000_000, 4, 4}, {1_000_000, 16, 10}, {5, 1, 1},
	} {
		t.Run(fmt.Sprintf("%d packets on %d shards", tt.count, tt.shards), func(t *testing.T) {
			if got := autoSubPools(tt.count, tt.shards); got != tt.want {
				t.Errorf("autoSubPools(%d, %d) = %d, want %d", tt.count, tt.shards, got, tt.want)
			}
		})
	}
}

// TestPreloadArbitration: two instances with different shard lists (whose
// first shards by name differ, s0 and s1; both run with s1 as the serial
// shard) preload one pool id at once. One record wins everywhere: every
// shard that has the pool's record has the serial shard's, and the loser
// answers the same pool or refuses, never a second placement.
func TestPreloadArbitration(t *testing.T) {
	ctx := context.Background()
	servers := redistest.StartN(t, 5, redistest.Options{}) // s0..s4
	open := func(idx ...int) *Catalog {
		var specs []shard.Spec
		for _, i := range idx {
			specs = append(specs, shard.Spec{Name: fmt.Sprintf("s%d", i), Weight: 1, Addr: servers[i].Addr})
		}
		set, err := shard.Open(specs, 0, shard.Options{Serial: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { set.Close() })
		return New(set, Config{})
	}
	for round := range 20 {
		a, b := open(1, 2, 3), open(0, 1, 4)
		id := fmt.Sprintf("arb%d", round)
		spec := rain.Spec{PoolID: id, TotalCents: 1000, Count: 10, SubPools: 2}
		var wg sync.WaitGroup
		var errA, errB error
		wg.Go(func() { _, _, errA = a.Preload(ctx, spec) })
		wg.Go(func() { _, _, errB = b.Preload(ctx, spec) })
		wg.Wait()
		if errA != nil && errB != nil {
			t.Fatalf("round %d: both preloads failed: %v; %v", round, errA, errB)
		}
		var first string
		for _, i := range []int{1, 0, 2, 3, 4} { // the serial shard first
			c := shard.NewClient(servers[i].Addr, shard.Options{})
			placement, err := c.HGet(ctx, recordKey(id), "placement").Result()
			c.Close()
			if err != nil {
				continue // this shard has no record
			}
			if first == "" {
				first = placement
			}
			if placement != first {
				t.Fatalf("round %d: shard s%d holds placement %q, another %q", round, i, placement, first)
			}
		}
		if first == "" {
			t.Fatalf("round %d: no shard has the record", round)
		}
	}
}

// TestAuditInPages: the audit of a big sub-pool never holds its shard for
// long: every command it sends reads one page (an LRANGE of at most
// lua's list page, an HSCAN asking at most its hash page, a ZSCAN of the
// deadline index asking at most its page: the hash page for a member per
// grant, the index page for a member per batch), read through a
// recording proxy, none the whole list or hash at once; and it still finds
// the pool whole. And an audit while users grab reports no false problem.
func TestAuditInPages(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, redistest.Options{})
	proxy := redisproxy.Start(t, srv.Addr)
	e := envOn(t, []*redistest.Server{srv}, []string{proxy.Addr})
	const packets = 300_000
	e.preload(t, rain.Spec{PoolID: "big", TotalCents: 3 * packets, Count: packets, HoldSeconds: 3600})
	p, err := e.cat.Cached(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	k := p.SubPool(0).Keys()
	c := e.shards.Client("s1")
	for b := range 100 { // 50,000 grants, 500 a batch, every other one named by a member per batch
		batch := make([]lua.ClaimArg, 500)
		for i := range batch {
			n := int64(b*500 + i + 1)
			batch[i] = lua.ClaimArg{User: "u" + strconv.FormatInt(n, 10), Serial: 1e9 + n}
		}
		pipe := c.Pipeline()
		cmd := lua.ClaimManyCmd(ctx, pipe, &k, 0, false, lua.Form{BatchedDeadlines: b%2 == 0}, batch, nil)
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if _, _, err := lua.ParseClaimMany(cmd, len(batch)); err != nil {
			t.Fatal(err)
		}
	}
	proxy.Record()
	rep, err := e.cat.Audit(ctx, "big")
	if err != nil || !rep.OK || len(rep.Notes) != 0 {
		t.Fatalf("audit of a quiet big pool = %+v, %v; want ok and recounted", rep, err)
	}
	pages, zscans := 0, map[string]int{}
	for _, x := range proxy.Exchanges() {
		cmd := x.Cmd
		switch cmd[0] {
		case "LRANGE":
			lo, _ := strconv.Atoi(cmd[2])
			hi, _ := strconv.Atoi(cmd[3])
			if hi < 0 || hi-lo+1 > lua.AuditListPage {
				t.Errorf("the audit sent %q: more than a page of %d", cmd, lua.AuditListPage)
			}
			pages++
		case "HSCAN":
			if i := slices.IndexFunc(cmd, func(a string) bool { return strings.EqualFold(a, "count") }); i < 0 || cmd[i+1] != strconv.Itoa(lua.AuditHashPage) {
				t.Errorf("the audit sent %q: want COUNT %d", cmd, lua.AuditHashPage)
			}
			pages++
		case "ZSCAN":
			page := lua.AuditHashPage
			if cmd[1] == k.Batches {
				page = lua.AuditIndexPage
			}
			if i := slices.IndexFunc(cmd, func(a string) bool { return strings.EqualFold(a, "count") }); i < 0 || cmd[i+1] != strconv.Itoa(page) {
				t.Errorf("the audit sent %q: want COUNT %d", cmd, page)
			}
			zscans[cmd[1]]++
		case "HGETALL", "HVALS", "HKEYS", "SMEMBERS", "ZRANGE":
			if !strings.HasSuffix(cmd[1], ":pool") {
				t.Errorf("the audit sent %q: a whole key at once", cmd)
			}
		}
	}
	if pages < packets/lua.AuditListPage {
		t.Fatalf("the audit read %d pages, want at least %d", pages, packets/lua.AuditListPage)
	}
	if zscans[k.Deadlines] == 0 || zscans[k.Batches] == 0 {
		t.Fatalf("the audit read the deadline index in %v ZSCANs, want both keys read", zscans)
	}

	// Audits while users grab: counters are always checked; a recount that
	// races the grabs is noted, never a problem.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				u := fmt.Sprintf("live%d.%d", w, i)
				if _, _, err := lua.ClaimMany(ctx, c, &k, 0, []lua.ClaimArg{{User: u, Serial: 2e9 + int64(w)*1e8 + int64(i)}}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for range 5 {
		rep, err := e.cat.Audit(ctx, "big")
		if err != nil || !rep.OK {
			close(stop)
			wg.Wait()
			t.Fatalf("audit during grabs = %+v, %v; want ok", rep, err)
		}
		t.Logf("audit during grabs: ok, notes %q", rep.Notes)
	}
	close(stop)
	wg.Wait()
}

// BenchmarkPreload: 1,000,000 packets into 8 sub-pools on 4 local shards
// (target ≤ 3 s per op), beside the bare minimum: the same amounts pushed
// with pipelined RPUSH of 1,000 and no scripts, bookkeeping or split.
func BenchmarkPreload(b *testing.B) {
	const count, total = 1_000_000, 500_000_000
	b.Run("rain", func(b *testing.B) {
		e := newEnv(b, 4, redistest.Options{})
		i := 0
		for b.Loop() {
			i++
			_, created, err := e.cat.Preload(context.Background(), rain.Spec{
				PoolID: fmt.Sprintf("bench%d", i), TotalCents: total, Count: count, SubPools: 8})
			if err != nil || !created {
				b.Fatalf("Preload: created %v, %v", created, err)
			}
		}
		b.ReportMetric(float64(count)*float64(b.N)/b.Elapsed().Seconds(), "packets/s")
	})
	b.Run("rpush-baseline", func(b *testing.B) {
		e := newEnv(b, 4, redistest.Options{})
		amounts, err := split.Amounts(rand.New(rand.NewPCG(1, 2)), split.Spec{TotalCents: total, Count: count})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		i := 0
		for b.Loop() {
			i++
			// 8 lists, two per shard, loaded one after another per shard.
			done := make(chan error, 4)
			for s, name := range e.shards.Names() {
				c := e.shards.Client(name)
				go func() {
					pipe := c.Pipeline()
					for part := range 2 {
						key := fmt.Sprintf("base%d:%d:%d", i, s, part)
						lo := (s*2 + part) * count / 8
						for off := lo; off < lo+count/8; off += 1000 {
							args := make([]any, 0, 1000)
							for _, a := range amounts[off:min(off+1000, lo+count/8)] {
								args = append(args, a)
							}
							pipe.RPush(ctx, key, args...)
							if pipe.Len() == batchesPerTrip {
								if _, err := pipe.Exec(ctx); err != nil {
									done <- err
									return
								}
							}
						}
					}
					_, err := pipe.Exec(ctx)
					done <- err
				}()
			}
			for range 4 {
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(count)*float64(b.N)/b.Elapsed().Seconds(), "packets/s")
	})
}
