package catalog

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/redistest"
)

// TestAuditNamesWhatIsWrong: the audit says exactly where a difference is
// (invariant 2): one corruption at a time of one sub-pool's records (a
// packet's amount in the stock, a held grant's record gone, a counter
// bumped, a serial granted twice, the deadline index lost) makes it
// report problems of that sub-pool and shard only, among them the
// quantity that moved, with what was expected and what was found; undone,
// the audit is OK again.
func TestAuditNamesWhatIsWrong(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 3, redistest.Options{})
	e.preload(t, rain.Spec{PoolID: "au", TotalCents: 3000, Count: 30, SubPools: 3})
	users := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	e.claim(t, "au", 1, users...)
	e.assertAudit(t, "au")
	p, err := e.cat.Cached(ctx, "au")
	if err != nil {
		t.Fatal(err)
	}
	j := p.Home("a")
	c := e.shards.Client(p.Placement[j])
	k := p.SubPool(j).Keys()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	record, err := c.HGet(ctx, k.Grants, "a").Result()
	must(err)
	first, err := c.LIndex(ctx, k.Stock, 0).Result()
	must(err)
	amount, _ := strconv.ParseInt(first, 10, 64)
	deadlines, err := c.Dump(ctx, k.Deadlines).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	batches, err := c.Dump(ctx, k.Batches).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	restore := func(key, dump string) {
		if dump != "" {
			must(c.RestoreReplace(ctx, key, 0, dump).Err())
		}
	}
	for _, tc := range []struct {
		name     string
		quantity string // a problem's Quantity holds it
		corrupt  func()
		undo     func()
	}{
		{"a packet's amount in the stock", "stock_cents (list sum)",
			func() { must(c.LSet(ctx, k.Stock, 0, amount+1).Err()) },
			func() { must(c.LSet(ctx, k.Stock, 0, amount).Err()) }},
		{"a held grant's record gone", "held_count (grants)",
			func() { must(c.HDel(ctx, k.Grants, "a").Err()) },
			func() { must(c.HSet(ctx, k.Grants, "a", record).Err()) }},
		{"stock_cents bumped", "stock_cents (list sum)",
			func() { must(c.HIncrBy(ctx, k.Meta, "stock_cents", 1).Err()) },
			func() { must(c.HIncrBy(ctx, k.Meta, "stock_cents", -1).Err()) }},
		{"a serial granted twice", "duplicate serials",
			func() { must(c.HSet(ctx, k.Grants, "a2", record).Err()) },
			func() { must(c.HDel(ctx, k.Grants, "a2").Err()) }},
		{"the deadline index lost", "deadline index",
			func() { must(c.Del(ctx, k.Deadlines, k.Batches).Err()) },
			func() { restore(k.Deadlines, deadlines); restore(k.Batches, batches) }},
	} {
		tc.corrupt()
		r, err := e.cat.Audit(ctx, "au")
		if err != nil {
			t.Fatalf("%s: Audit: %v", tc.name, err)
		}
		if r.OK || len(r.Problems) == 0 {
			t.Fatalf("%s: the audit is OK, want its problems", tc.name)
		}
		named := false
		for _, pr := range r.Problems {
			if pr.SubPool == nil || *pr.SubPool != j || pr.Shard != p.Placement[j] {
				t.Errorf("%s: problem %s, want every problem of sub-pool %d on %s", tc.name, pr, j, p.Placement[j])
			}
			if strings.Contains(pr.Quantity, tc.quantity) && pr.Expected != pr.Found {
				named = true
			}
		}
		if !named {
			t.Errorf("%s: problems %v, none of %q with what was expected and found", tc.name, r.Problems, tc.quantity)
		}
		tc.undo()
		e.assertAudit(t, "au")
	}
}
