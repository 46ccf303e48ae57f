package catalog

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"rain"
	"rain/internal/lua"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// settleByHand does what settlement does to every outbox entry of the
// pool: confirms each grant and acknowledges (deletes) the entry. It
// returns the cents confirmed.
func (e *env) settleByHand(t testing.TB, id string) int64 {
	t.Helper()
	ctx := context.Background()
	p, err := e.cat.Read(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var cents int64
	for j := range p.SubPools() {
		k := p.SubPool(j).Keys()
		c := e.cat.client(p, j)
		entries, err := c.XRange(ctx, k.Outbox, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, en := range entries {
			g, err := lua.ParseOutboxEntry(en.Values)
			if err != nil {
				t.Fatalf("outbox entry %v: %v", en.Values, err)
			}
			if !g.Release {
				res, err := lua.Confirm(ctx, c, &k, g.User, g.Serial)
				if err != nil || res != lua.Confirmed {
					t.Fatalf("confirm %v = %v, %v", en.Values, res, err)
				}
				cents += g.Amount
			}
			if err := c.XDel(ctx, k.Outbox, en.ID).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	return cents
}

// keys is every key on every shard, by shard.
func (e *env) keys(t testing.TB) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, name := range e.shards.Names() {
		ks, err := e.shards.Client(name).Keys(context.Background(), "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(ks)
		out[name] = ks
	}
	return out
}

// dump is every key and value on every shard, to compare two moments.
func (e *env) dump(t testing.TB) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for name, ks := range e.keys(t) {
		c := e.shards.Client(name)
		for _, k := range ks {
			v, err := c.Dump(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			out[name+" "+k] = v
		}
	}
	return out
}

// refused checks that Close answers ErrNotNow naming want, and changes
// nothing on any shard.
func (e *env) refused(t *testing.T, id, want string) {
	t.Helper()
	before := e.dump(t)
	_, err := e.cat.Close(context.Background(), id)
	if !errors.Is(err, rain.ErrNotNow) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Close = %v; want not now: %q", err, want)
	}
	if after := e.dump(t); !reflect.DeepEqual(before, after) {
		t.Fatalf("a refused close changed the shards (%d keys before, %d after)", len(before), len(after))
	}
}

// TestLifeOfAPool: a pool closes only once it has ended, nothing is held
// and every outbox entry is acknowledged (each refusal says why and changes
// nothing); closed, its account balances, every key of its sub-pools is
// freed, its status and audit answer from the account, a grab answers
// ended, a preload of its id is refused and a close again answers the same
// account.
func TestLifeOfAPool(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 3, redistest.Options{})
	spec := rain.Spec{PoolID: "life", TotalCents: 100_000, Count: 1_000, SubPools: 3}
	before := e.keys(t) // before the pool: nothing of it
	e.preload(t, spec)
	if _, err := e.cat.Close(ctx, "nope"); !errors.Is(err, rain.ErrNotFound) {
		t.Fatalf("Close(unknown) = %v, want not found", err)
	}
	users := make([]string, 60)
	for i := range users {
		users[i] = fmt.Sprintf("user-%d", i)
	}
	claims := e.claim(t, "life", 1, users...)
	e.refused(t, "life", "window open")
	st, err := e.cat.End(ctx, "life")
	if err != nil || st.State != "ended" {
		t.Fatalf("End = %+v, %v; want ended", st, err)
	}
	if again, err := e.cat.End(ctx, "life"); err != nil || again.State != "ended" {
		t.Fatalf("End again = %+v, %v; want ended, nothing changed", again, err)
	}
	if c := e.claim(t, "life", 100, "late"); c[0].Outcome != lua.Ended {
		t.Fatalf("claim after the end = %+v, want ended", c[0])
	}
	e.refused(t, "life", "grants held")
	confirmed := e.settleByHand(t, "life")
	var granted int64
	for _, c := range claims {
		granted += c.Amount
	}
	if confirmed != granted {
		t.Fatalf("confirmed %d cents, granted %d", confirmed, granted)
	}
	a, err := e.cat.Close(ctx, "life")
	if err != nil {
		t.Fatalf("Close = %v", err)
	}
	if a.State != "closed" || a.PreloadedCount != spec.Count || a.PreloadedCents != spec.TotalCents ||
		a.ConfirmedCount != int64(len(users)) || a.ConfirmedCents != granted ||
		a.UnclaimedCount != spec.Count-int64(len(users)) || a.UnclaimedCents != spec.TotalCents-granted || len(a.SubPools) != 3 {
		t.Fatalf("account %+v; want %d preloaded (%d cents), %d confirmed (%d cents), the rest unclaimed",
			a, spec.Count, spec.TotalCents, len(users), granted)
	}
	var subCount, subCents int64
	for _, s := range a.SubPools {
		subCount += s.ConfirmedCount + s.UnclaimedCount
		subCents += s.ConfirmedCents + s.UnclaimedCents
	}
	if subCount != spec.Count || subCents != spec.TotalCents {
		t.Fatalf("the sub-pools' accounts add up to %d packets, %d cents; want %d, %d", subCount, subCents, spec.Count, spec.TotalCents)
	}
	e.checkFreed(t, "life", before)
	fresh := envOn(t, e.servers, redistest.Addrs(e.servers)) // another process
	checkClosed(t, fresh, spec, a)
}

// checkFreed checks that each shard holds what it held before the pool
// (before, by shard), and the pool's record, its id in the registry, the
// life counter and the tombstone of each of its sub-pools there (a meta of
// state closed, with the pool and the index): every other sub-pool key is
// freed.
func (e *env) checkFreed(t *testing.T, id string, before map[string][]string) {
	t.Helper()
	ctx := context.Background()
	p, err := e.cat.Read(ctx, id)
	if err != nil || p.State != rain.Closed {
		t.Fatalf("Read(%s) = %+v, %v; want closed", id, p, err)
	}
	for name, ks := range e.keys(t) {
		want := slices.Clone(before[name])
		for _, k := range []string{recordKey(id), registryKey, lifeKey} {
			if !slices.Contains(want, k) {
				want = append(want, k)
			}
		}
		for j, on := range p.Placement {
			if on == name {
				meta := p.SubPool(j).Keys().Meta
				want = append(want, meta)
				tomb, err := e.shards.Client(name).HGetAll(ctx, meta).Result()
				if w := map[string]string{"state": "closed", "pool": id, "index": fmt.Sprint(j)}; err != nil || !reflect.DeepEqual(tomb, w) {
					t.Errorf("shard %s: %s = %v, %v; want the tombstone %v", name, meta, tomb, err, w)
				}
			}
		}
		slices.Sort(want)
		if !slices.Equal(ks, want) {
			t.Errorf("shard %s holds %v after the close; want %v", name, ks, want)
		}
	}
}

// checkClosed checks what a closed pool answers: its account, from its
// status, its audit and a close again; ended to a grab; a preload refused.
func checkClosed(t *testing.T, e *env, spec rain.Spec, a *rain.Account) {
	t.Helper()
	ctx := context.Background()
	st, err := e.cat.Status(ctx, spec.PoolID)
	if err != nil || st.State != "closed" || !reflect.DeepEqual(st.Account, a) {
		t.Fatalf("Status(closed) = %+v, %v; want closed with the account %+v", st, err, a)
	}
	if again, err := e.cat.Close(ctx, spec.PoolID); err != nil || !reflect.DeepEqual(again, a) {
		t.Fatalf("Close again = %+v, %v; want the same account", again, err)
	}
	rep, err := e.cat.Audit(ctx, spec.PoolID)
	if err != nil || !rep.OK || len(rep.Notes) == 0 {
		t.Fatalf("Audit(closed) = %+v, %v; want ok, answered from the account", rep, err)
	}
	if _, _, err := e.cat.Preload(ctx, spec); !errors.Is(err, rain.ErrConflict) {
		t.Fatalf("Preload of a closed pool's id = %v, want conflict", err)
	}
	if st, err := e.cat.End(ctx, spec.PoolID); err != nil || st.State != "closed" {
		t.Fatalf("End(closed) = %+v, %v; want closed, nothing changed", st, err)
	}
	p, err := e.cat.Cached(ctx, spec.PoolID)
	if err != nil || p.State != rain.Closed {
		t.Fatalf("Pool(closed) = %+v, %v", p, err)
	}
	refs, err := e.cat.SubPools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refs {
		if r.Pool == spec.PoolID {
			t.Fatalf("SubPools lists the closed pool: %+v", r)
		}
	}
}

// crashEnv is a pool ended and settled on three shards, e straight to
// them, and the proxies in front of them for a process that will die.
func crashEnv(t *testing.T, spec rain.Spec) (e *env, proxies []*redisproxy.Proxy, addrs []string) {
	t.Helper()
	servers := redistest.StartN(t, 3, redistest.Options{})
	proxies = make([]*redisproxy.Proxy, len(servers))
	addrs = make([]string, len(servers))
	for i, s := range servers {
		proxies[i] = redisproxy.Start(t, s.Addr)
		addrs[i] = proxies[i].Addr
	}
	e = envOn(t, servers, redistest.Addrs(servers))
	e.preload(t, spec)
	e.claim(t, spec.PoolID, 1, "a", "b", "c", "d", "e", "f")
	if _, err := e.cat.End(context.Background(), spec.PoolID); err != nil {
		t.Fatal(err)
	}
	e.settleByHand(t, spec.PoolID)
	return e, proxies, addrs
}

// crashPoint is a write of a close: the nth command matching on one
// shard's proxy.
type crashPoint struct {
	proxy int
	name  string
	match redisproxy.Match
	n     int
}

// closeWrites runs a close through proxies that record, and returns each
// write it made: a seal, a record written, a sub-pool retired.
func closeWrites(t *testing.T, spec rain.Spec) []crashPoint {
	t.Helper()
	_, proxies, addrs := crashEnv(t, spec)
	for _, p := range proxies {
		p.Record()
	}
	if _, err := envOn(t, nil, addrs).cat.Close(context.Background(), spec.PoolID); err != nil {
		t.Fatal(err)
	}
	var out []crashPoint
	for i, p := range proxies {
		seen := map[string]int{}
		for _, x := range p.Exchanges() {
			var name string
			var m redisproxy.Match
			for _, script := range []string{"seal", "record", "retire"} {
				if x.Cmd[0] == "EVALSHA" && strings.EqualFold(x.Cmd[1], lua.SHA(script)) {
					name, m = script, redisproxy.Script(lua.SHA(script))
				}
			}
			if name == "" {
				continue
			}
			seen[name]++
			out = append(out, crashPoint{i, fmt.Sprintf("s%d %s #%d", i+1, name, seen[name]), m, seen[name]})
		}
	}
	return out
}

// TestCloseResumesAfterACrash: a close whose process dies after any of its
// writes (each seal, each record written closing or closed, each sub-pool
// retired, on every shard) is finished by a close run again from another
// process, with the same account and every key freed; before that, grabs
// answer ended and the audit stays ok. A close that died holding seals is
// finished once their lease has run out (before, the next close is told
// another is at work).
func TestCloseResumesAfterACrash(t *testing.T) {
	spec := rain.Spec{PoolID: "crash", TotalCents: 50_000, Count: 500, SubPools: 3}
	points := closeWrites(t, spec)
	if len(points) < 12 { // 3 seals, 6 record writes, 3 retires at least
		t.Fatalf("a close made %d writes: %v", len(points), points)
	}
	for _, pt := range points {
		t.Run(pt.name, func(t *testing.T) {
			ctx := context.Background()
			e, proxies, addrs := crashEnv(t, spec)
			die := func() {
				for _, p := range proxies {
					p.Partition()
				}
			}
			proxies[pt.proxy].PartitionAfter(pt.match, pt.n, die)
			if _, err := envOn(t, nil, addrs).cat.Close(ctx, spec.PoolID); err == nil {
				t.Fatalf("a close whose process died after %s succeeded", pt.name)
			}
			// The script answers ended, or closed once the sub-pool's meta
			// is freed; then the record is past open, and the grab path
			// answers ended from it.
			c := e.claim(t, spec.PoolID, 50, "late")
			p, err := e.cat.Read(ctx, spec.PoolID)
			if err != nil || c[0].Outcome != lua.Ended && (c[0].Outcome != lua.Closed || !p.State.Over()) {
				t.Fatalf("a grab after a close died = %+v, the record %+v, %v; want ended", c[0], p, err)
			}
			if rep, err := e.cat.Audit(ctx, spec.PoolID); err != nil || !rep.OK {
				t.Fatalf("audit after a close died = %+v, %v", rep, err)
			}
			var a *rain.Account
			waittest.Until(t, 10*time.Second, "a close run again finishes once the dead close's seals lapse", func() bool {
				a, err = e.cat.Close(ctx, spec.PoolID)
				if errors.Is(err, rain.ErrNotNow) && strings.Contains(err.Error(), "another close is at work") {
					return false
				}
				if err != nil {
					t.Fatalf("Close run again = %v", err)
				}
				return true
			})
			if a.ConfirmedCount != 6 || a.PreloadedCount != spec.Count || a.UnclaimedCount != spec.Count-6 {
				t.Fatalf("account %+v; want 6 confirmed of %d", a, spec.Count)
			}
			e.checkFreed(t, spec.PoolID, nil)
			checkClosed(t, e, spec, a)
		})
	}
}

// TestCloseWhileASpillIsInFlight: a spill taken out of a sub-pool and not
// settled keeps the pool from closing, and the sub-pools sealed before the
// refusal are opened again (nothing changed).
func TestCloseWhileASpillIsInFlight(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 2, redistest.Options{})
	e.preload(t, rain.Spec{PoolID: "sp", TotalCents: 1_000, Count: 10, SubPools: 2})
	p, err := e.cat.Read(ctx, "sp")
	if err != nil {
		t.Fatal(err)
	}
	k := p.SubPool(1).Keys()
	if tk, _, err := lua.Take(ctx, e.cat.client(p, 1), &k, "tok", 0, "u", 0); err != nil || tk != lua.TakenAmount {
		t.Fatalf("take = %v, %v", tk, err)
	}
	if _, err := e.cat.End(ctx, "sp"); err != nil {
		t.Fatal(err)
	}
	e.refused(t, "sp", "sub-pool 1: 1 spills in flight")
	for j := range 2 {
		k := p.SubPool(j).Keys()
		if st, _ := e.cat.client(p, j).HGet(ctx, k.Meta, "state").Result(); st != "open" {
			t.Fatalf("sub-pool %d is %q after a refused close, want open", j, st)
		}
	}
}
