package grab_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"rain"
	"rain/internal/grab"
	"rain/internal/lua"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/shard/shardtest"
	"rain/internal/wait/waittest"
)

// grabRetrying grabs, retrying while the user has a spill in flight.
func grabRetrying(t *testing.T, s *grab.Service, pool, user string) grab.Result {
	t.Helper()
	for try := 0; ; try++ {
		r, err := s.Grab(context.Background(), pool, user)
		if errors.Is(err, grab.ErrBusy) && try < 200 {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("Grab(%s, %s): %v", pool, user, err)
		}
		return r
	}
}

// TestSpillNoFalseSoldOut: 100 packets in 4 sub-pools, 100 users: every one
// gets a packet, whatever their home sub-pool.
func TestSpillNoFalseSoldOut(t *testing.T) {
	e := newEnv(t, 3, redistest.Options{})
	e.preload(t, rain.Spec{PoolID: "spill", TotalCents: 10_000, Count: 100, SubPools: 4})
	var cents int64
	for u := range 100 {
		r := grabRetrying(t, e.svc, "spill", fmt.Sprintf("u%d", u))
		if r.Outcome != grab.Granted {
			t.Fatalf("user %d of 100 got %+v, want granted: stock was left in a sibling", u, r)
		}
		cents += r.Amount
	}
	if cents != 10_000 {
		t.Fatalf("granted %d cents, want 10000", cents)
	}
	if r := grabRetrying(t, e.svc, "spill", "late"); r.Outcome != grab.SoldOut {
		t.Fatalf("the 101st user got %+v, want sold_out", r)
	}
	st, _ := e.cat.Status(context.Background(), "spill")
	if st.HeldCount != 100 || st.RemainingCount != 0 {
		t.Fatalf("status %+v, want 100 held, none left", st)
	}
	e.assertAudit(t, "spill")
}

// TestNoFalseSoldOutUnderContention: as many users as packets, three in
// four of them homed in one sub-pool of four, all grabbing at once through
// two instances (each retrying what is answered 503, as a client does):
// every one is granted. A sold_out to any of them would be false, the
// stock being there for them all (invariant 4); with more users than
// packets, as in the other concurrent tests, a false one would go
// unnoticed.
func TestNoFalseSoldOutUnderContention(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 3, redistest.Options{})
	const n = 200
	e.preload(t, rain.Spec{PoolID: "full", TotalCents: 100 * n, Count: n, SubPools: 4})
	p, err := e.cat.Cached(ctx, "full")
	if err != nil {
		t.Fatal(err)
	}
	var users []string
	for i := 0; len(users) < n; i++ {
		u := fmt.Sprintf("u%d", i)
		if p.Home(u) == 0 || len(users) >= n*3/4 {
			users = append(users, u)
		}
	}
	svc2, _ := e.service(t, shardtest.Open(t, redistest.Addrs(e.servers), shard.Options{}))
	services := []*grab.Service{e.svc, svc2}
	results := make([]grab.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, u := range users {
		wg.Go(func() {
			svc := services[i%2]
			for try := 0; ; try++ {
				r, err := svc.Grab(ctx, "full", u)
				if err != nil && try < 400 {
					time.Sleep(5 * time.Millisecond) // 503: busy, unavailable, outcome unknown
					continue
				}
				results[i], errs[i] = r, err
				return
			}
		})
	}
	wg.Wait()
	var cents int64
	for i, r := range results {
		if errs[i] != nil || (r.Outcome != grab.Granted && r.Outcome != grab.AlreadyGranted) {
			t.Errorf("%s (home %d) got %+v, %v; want granted: a packet was left for every user", users[i], p.Home(users[i]), r, errs[i])
		}
		cents += r.Amount
	}
	if cents != 100*n {
		t.Errorf("granted %d cents, want %d", cents, 100*n)
	}
	if st, err := e.cat.Status(ctx, "full"); err != nil || st.HeldCount != n || st.RemainingCount != 0 {
		t.Fatalf("status %+v, %v; want %d held, none left", st, err, n)
	}
	e.assertAudit(t, "full")
}

// TestSpillRace: many users race for the last packets across sub-pools:
// exactly the stock is granted, nobody twice.
func TestSpillRace(t *testing.T) {
	e := newEnv(t, 3, redistest.Options{})
	e.preload(t, rain.Spec{PoolID: "race", TotalCents: 4_000, Count: 40, SubPools: 4})
	var mu sync.Mutex
	granted := map[string]grab.Result{}
	var wg sync.WaitGroup
	for u := range 200 {
		wg.Go(func() {
			user := fmt.Sprintf("u%d", u)
			for range 2 { // each user twice, concurrently with everyone
				r := grabRetrying(t, e.svc, "race", user)
				if r.Outcome == grab.Granted || r.Outcome == grab.AlreadyGranted {
					mu.Lock()
					if prev, ok := granted[user]; ok && prev.Serial != r.Serial {
						t.Errorf("user %s got two grants: %+v and %+v", user, prev, r)
					}
					granted[user] = r
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	var cents int64
	for _, r := range granted {
		cents += r.Amount
	}
	if len(granted) != 40 || cents != 4_000 {
		t.Fatalf("%d users granted %d cents, want exactly the stock: 40, 4000", len(granted), cents)
	}
	e.assertAudit(t, "race")
}

// crashingEnv is two shards, a survivor instance that reaches them
// directly, and a crashing one that reaches them only through proxies,
// whose spill T and age before recovery are short. crash cuts the crashing
// instance off every shard (a partition: to the shards, a process that
// died) right after the first reply of script on the proxies of shards.
func crashingEnv(t *testing.T) (survivor, crashing *env, crash func(script string, shards ...int)) {
	t.Helper()
	const valid, age = 300 * time.Millisecond, 200 * time.Millisecond
	servers := redistest.StartN(t, 2, redistest.Options{})
	proxies := make([]*redisproxy.Proxy, len(servers))
	addrs := make([]string, len(servers))
	for i, srv := range servers {
		proxies[i] = redisproxy.Start(t, srv.Addr)
		addrs[i] = proxies[i].Addr
	}
	survivor = envWith(t, servers, redistest.Addrs(servers), valid, age)
	crashing = envWith(t, servers, addrs, valid, age)
	die := func() {
		for _, p := range proxies {
			p.Partition()
		}
	}
	crash = func(script string, shards ...int) {
		for _, i := range shards {
			proxies[i].PartitionAfter(redisproxy.Script(lua.SHA(script)), 1, die)
		}
	}
	return survivor, crashing, crash
}

// spillVictim drains the stock of sub-pool 0 of the pool (k sub-pools, n
// packets each) with users whose home it is, through e, and returns their
// grants, a user of the same home, whose grab must spill, and the shard
// (its index) of that home.
func spillVictim(t *testing.T, e *env, pool string, k, n int) (drained map[string]grab.Result, victim string, shardOfHome int) {
	t.Helper()
	p, err := e.cat.Cached(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	drained = map[string]grab.Result{}
	users := usersWithHome("h", 0, k, n+1)
	for _, u := range users[:n] {
		if drained[u] = grabRetrying(t, e.svc, pool, u); drained[u].Outcome != grab.Granted {
			t.Fatalf("grab of %s at its home = %+v, want granted", u, drained[u])
		}
	}
	return drained, users[n], slices.Index(e.shards.Names(), p.Placement[0])
}

// resolved waits until the survivor's reaper has finished what the crash
// left in flight: every packet in the stock or held, none in a transfer.
func resolved(t *testing.T, e *env, pool string, count int64) {
	t.Helper()
	waittest.Until(t, 10*time.Second, "the reaper resolved the spill the crash left", func() bool {
		e.sweep(t)
		st := e.status(t, pool)
		return st.RemainingCount+st.HeldCount+st.ConfirmedCount == count
	})
}

// TestSpillCrashAtEveryStep: a grab that spills dies right after each step
// of the protocol: its process is cut off from every shard the moment the
// step's reply comes back (the reply never reaches it). The pool is
// consistent meanwhile; once the reservation's T and the transfer's age
// have passed, the survivor's reaper finishes what it left; then every
// packet is granted exactly once, to users who each hold one.
func TestSpillCrashAtEveryStep(t *testing.T) {
	for _, step := range []struct{ name, script string }{
		{"reserved", "claim_many"}, {"taken", "take"}, {"adopted", "adopt"}, {"acked", "ack"},
	} {
		t.Run(step.name, func(t *testing.T) {
			e, crashing, crash := crashingEnv(t)
			const count, total = 8, 800
			e.preload(t, rain.Spec{PoolID: "crash", TotalCents: total, Count: count, SubPools: 4})
			granted, victim, home := spillVictim(t, e, "crash", 4, count/4)
			if step.script == "claim_many" {
				crash(step.script, home) // the victim's claim at its home reserves
			} else {
				crash(step.script, 0, 1) // the spill's step, wherever it runs
			}
			r, err := crashing.svc.Grab(context.Background(), "crash", victim)
			t.Logf("the victim's grab, cut off after %s: %+v, %v", step.script, r, err)
			e.assertAudit(t, "crash") // consistent even mid-protocol
			resolved(t, e, "crash", count)
			e.assertAudit(t, "crash")
			// The victim holds at most one grant, and the others get the rest.
			if r := grabRetrying(t, e.svc, "crash", victim); r.Outcome == grab.Granted || r.Outcome == grab.AlreadyGranted {
				granted[victim] = r
			}
			for u := 0; len(granted) < count && u < 3000; u++ {
				user := fmt.Sprintf("u%d", u)
				if r := grabRetrying(t, e.svc, "crash", user); r.Outcome == grab.Granted {
					granted[user] = r
				}
			}
			var cents int64
			for _, r := range granted {
				cents += r.Amount
			}
			if len(granted) != count || cents != total {
				t.Fatalf("after the crash at %q: %d grants, %d cents; want all %d packets, %d cents, each once", step.name, len(granted), cents, count, total)
			}
			st := e.status(t, "crash")
			if st.RemainingCount != 0 || st.HeldCount != count || st.HeldCents != total {
				t.Fatalf("status %+v, want everything held, nothing left or in flight", st)
			}
			e.assertAudit(t, "crash")
		})
	}
}

func (e *env) status(t *testing.T, pool ...string) *rain.Status {
	t.Helper()
	id := "crash"
	if len(pool) > 0 {
		id = pool[0]
	}
	st, err := e.cat.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestSpillAdoptedThenRegrabbed: a grab dies after adopt, before the ack;
// its grant expires and is released, the user grabs again; only then does
// the reaper resolve the transfer. It must ack it (the grant was made), not
// put the amount back at the sibling a second time.
func TestSpillAdoptedThenRegrabbed(t *testing.T) {
	ctx := context.Background()
	e, crashing, crash := crashingEnv(t)
	e.preload(t, rain.Spec{PoolID: "re", TotalCents: 400, Count: 4, SubPools: 2, HoldSeconds: 1})
	_, victim, _ := spillVictim(t, e, "re", 2, 2)
	crash("ack", 0, 1)
	if r, err := crashing.svc.Grab(ctx, "re", victim); err != nil || r.Outcome != grab.Granted {
		t.Fatalf("the victim's grab, cut off before its ack = %+v, %v; want granted (the adopt ran)", r, err)
	}
	p, err := e.cat.Cached(ctx, "re")
	if err != nil {
		t.Fatal(err)
	}
	k := p.SubPool(0).Keys()
	home := e.shards.Client(p.Placement[0])
	waittest.Until(t, 5*time.Second, "the victim's grant released at its deadline", func() bool {
		if _, err := lua.ReleaseExpired(ctx, home, &k, 100); err != nil {
			t.Fatal(err)
		}
		g, err := home.HGet(ctx, k.Grants, victim).Result()
		return err == nil && strings.HasPrefix(g, "r:")
	})
	if r := grabRetrying(t, e.svc, "re", victim); r.Outcome != grab.Granted {
		t.Fatalf("the victim's grab after the release = %+v, want a new grant", r)
	}
	resolved(t, e, "re", 4)
	e.assertAudit(t, "re")
	st := e.status(t, "re")
	if st.RemainingCount+st.HeldCount+st.ConfirmedCount != 4 || st.RemainingCents+st.HeldCents+st.ConfirmedCents != 400 {
		t.Fatalf("status %+v: stock + held + confirmed must stay 4 packets, 400 cents", st)
	}
}

// TestSoldOutFloodLeavesNoRecord: a sold-out pool of several sub-pools
// whose grabs get past the local sold-out marks (an instance just started,
// marks that lapsed) reach Redis, reserve at home, find every sibling
// empty and answer sold_out, and leave nothing behind: no verdict, no
// reservation. (A verdict is recorded only where an amount may be in
// flight under the token.)
func TestSoldOutFloodLeavesNoRecord(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 2, redistest.Options{})
	e.preload(t, rain.Spec{PoolID: "flood", TotalCents: 400, Count: 4, SubPools: 2})
	for u := range 4 {
		if r := grabRetrying(t, e.svc, "flood", fmt.Sprintf("u%d", u)); r.Outcome != grab.Granted {
			t.Fatalf("user %d got %+v", u, r)
		}
	}
	p, err := e.cat.Read(ctx, "flood")
	if err != nil {
		t.Fatal(err)
	}
	records := func() (n int64) {
		for j := range p.SubPools() {
			k := p.SubPool(j).Keys()
			for _, key := range []string{k.Verdicts, k.Reserve} {
				l, err := e.shards.Client(p.Placement[j]).HLen(ctx, key).Result()
				if err != nil {
					t.Fatal(err)
				}
				n += l
			}
		}
		return n
	}
	before := records()
	for u := range 20 {
		svc, _ := e.service(t, e.shards) // a new instance each time: no local marks
		if r := grabRetrying(t, svc, "flood", fmt.Sprintf("late%d", u)); r.Outcome != grab.SoldOut {
			t.Fatalf("late user %d got %+v, want sold_out", u, r)
		}
	}
	if after := records(); after != before {
		t.Fatalf("20 sold-out grabs left %d verdicts and reservations (%d before); want none", after-before, before)
	}
	e.assertAudit(t, "flood")
}
