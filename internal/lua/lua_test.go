package lua

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"rain/internal/redistest"
)

func TestKeysShareOneTag(t *testing.T) {
	sp := SubPool{Pool: "cny:2027.a-b_c", Index: 7}
	k := sp.Keys()
	// All lists every field of Keys, each once.
	v := reflect.ValueOf(k)
	var fields []string
	for i := range v.NumField() {
		fields = append(fields, v.Field(i).String())
	}
	if all := k.All(); !slices.Equal(slices.Sorted(slices.Values(all)), slices.Sorted(slices.Values(fields))) {
		t.Fatalf("Keys.All() = %q, want every field of Keys once: %q", all, fields)
	}
	for _, key := range k.All() {
		if !strings.Contains(key, "{cny:2027.a-b_c:7}") || strings.Count(key, "{") != 1 {
			t.Fatalf("key %q does not carry exactly the tag {cny:2027.a-b_c:7}", key)
		}
	}
}

func newClient(t *testing.T) *redis.Client {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	return c
}

func load(t *testing.T, c *redis.Client, sp SubPool, batch int64, amounts ...int64) (LoadResult, int64) {
	t.Helper()
	pipe := c.Pipeline()
	cmd := LoadCmd(context.Background(), pipe, sp, batch, amounts)
	if _, err := pipe.Exec(context.Background()); err != nil {
		t.Fatalf("load batch %d: %v", batch, err)
	}
	res, next, err := ParseLoad(cmd)
	if err != nil {
		t.Fatal(err)
	}
	return res, next
}

func TestLoadBatchesOnceInOrder(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	sp := SubPool{Pool: "p", Index: 0}
	if _, _, err := Setup(ctx, c, sp, 4, 10, Window{HoldMS: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Setup(ctx, c, sp, 5, 10, Window{HoldMS: 1000}); !errors.Is(err, ErrSpecMismatch) {
		t.Fatalf("Setup with another count = %v, want ErrSpecMismatch", err)
	}
	if err := LoadScripts(ctx, c); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		batch   int64
		amounts []int64
		want    LoadResult
		next    int64
	}{
		{1, []int64{3, 4}, Skipped, 0}, // out of order
		{0, []int64{1, 2}, Loaded, 1},
		{0, []int64{1, 2}, Skipped, 1}, // again: applied once
		{1, []int64{3, 4}, Loaded, 2},
	} {
		if res, next := load(t, c, sp, step.batch, step.amounts...); res != step.want || next != step.next {
			t.Fatalf("load batch %d = %s next %d, want %s next %d", step.batch, res, next, step.want, step.next)
		}
	}
	if opened, _, _, err := OpenSubPool(ctx, c, sp); err != nil || !opened {
		t.Fatalf("OpenSubPool = %v, %v; want opened", opened, err)
	}
	if res, _ := load(t, c, sp, 2, 9); res != AlreadyOpen {
		t.Fatalf("load into an open sub-pool = %s, want open (nothing appended)", res)
	}
	k := sp.Keys()
	if got, _ := c.LRange(ctx, k.Stock, 0, -1).Result(); strings.Join(got, ",") != "1,2,3,4" {
		t.Fatalf("stock = %v, want 1,2,3,4", got)
	}
}

func TestOpenRefusesPartialStock(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	sp := SubPool{Pool: "p", Index: 1}
	if _, _, err := Setup(ctx, c, sp, 3, 6, Window{HoldMS: 1000}); err != nil {
		t.Fatal(err)
	}
	if err := LoadScripts(ctx, c); err != nil {
		t.Fatal(err)
	}
	load(t, c, sp, 0, 1, 2)
	opened, n, cents, err := OpenSubPool(ctx, c, sp)
	if err != nil || opened || n != 2 || cents != 3 {
		t.Fatalf("OpenSubPool with 2 of 3 packets = %v (%d, %d), %v; want refused with 2 packets, 3 cents", opened, n, cents, err)
	}
	k := sp.Keys()
	if c, err := ClaimGrant(ctx, c, &k, "u", 1, "", 0); err != nil || c.Outcome != Closed {
		t.Fatalf("claim on a loading sub-pool = %+v, %v; want closed", c, err)
	}
}

func TestClaimOutboxAndCounters(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	sp := SubPool{Pool: "p", Index: 0}
	if _, _, err := Setup(ctx, c, sp, 1, 42, Window{HoldMS: 5000}); err != nil {
		t.Fatal(err)
	}
	if err := LoadScripts(ctx, c); err != nil {
		t.Fatal(err)
	}
	load(t, c, sp, 0, 42)
	if _, _, _, err := OpenSubPool(ctx, c, sp); err != nil {
		t.Fatal(err)
	}
	k := sp.Keys()
	got, err := ClaimGrant(ctx, c, &k, "u1", 77, "", 0)
	if err != nil || got.Outcome != Granted || got.Amount != 42 || got.Serial != 77 || got.DeadlineMS == 0 {
		t.Fatalf("claim = %+v, %v; want granted 42 serial 77 with a deadline", got, err)
	}
	entries, err := c.XRange(ctx, k.Outbox, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("outbox = %v, %v; want one entry", entries, err)
	}
	v := entries[0].Values
	if v["user"] != "u1" || v["amount"] != "42" || v["serial"] != "77" || v["pool"] != "p" || v["sub"] != "0" {
		t.Fatalf("outbox entry = %v, want the grant's user, amount, serial, pool, sub-pool", v)
	}
	if again, _ := ClaimGrant(ctx, c, &k, "u1", 78, "", 0); again.Outcome != Already || again.Serial != 77 {
		t.Fatalf("second claim = %+v, want already with serial 77", again)
	}
	if empty, _ := ClaimGrant(ctx, c, &k, "u2", 79, "", 0); empty.Outcome != Empty {
		t.Fatalf("claim on an empty sub-pool = %+v, want empty", empty)
	}
	a, err := AuditSubPool(ctx, c, sp)
	if err != nil || a.HeldCount != 1 || a.HeldCents != 42 || a.GrantsHeld != 1 || a.ListLen != 0 || a.StockCents != 0 || a.DeadlineEntries != 1 {
		t.Fatalf("audit = %+v, %v; want one held grant of 42, stock empty", a, err)
	}
}

// TestSecondRequestDuringSpill: while a user's spill is in flight (a
// reservation younger than T), stock coming back to the home must not grant
// the same user a second time: the claim answers busy, and the spill's adopt
// stands alone.
func TestSecondRequestDuringSpill(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	sp := SubPool{Pool: "p", Index: 0}
	if _, _, err := Setup(ctx, c, sp, 1, 50, Window{HoldMS: 300}); err != nil {
		t.Fatal(err)
	}
	if err := LoadScripts(ctx, c); err != nil {
		t.Fatal(err)
	}
	load(t, c, sp, 0, 50)
	if _, _, _, err := OpenSubPool(ctx, c, sp); err != nil {
		t.Fatal(err)
	}
	k := sp.Keys()
	const valid = 10_000
	if got, _ := ClaimGrant(ctx, c, &k, "first", 1, "t1", valid); got.Outcome != Granted {
		t.Fatalf("first claim = %+v, want granted", got)
	}
	if got, _ := ClaimGrant(ctx, c, &k, "u", 2, "t2", valid); got.Outcome != Reserved {
		t.Fatalf("claim on an empty home = %+v, want reserved", got)
	}
	time.Sleep(400 * time.Millisecond)
	if r, err := ReleaseExpired(ctx, c, &k, 10); err != nil || r.Count != 1 {
		t.Fatalf("release = %+v, %v; want the first grant back in stock", r, err)
	}
	if got, _ := ClaimGrant(ctx, c, &k, "u", 3, "t3", valid); got.Outcome != Busy {
		t.Fatalf("the same user's second request while spilling = %+v, want busy", got)
	}
	// The spill's adopt goes through (the amount came from a sibling).
	if got, ok, err := Adopt(ctx, c, &k, "u", "t2", 2, 70, 1, valid); err != nil || !ok || got.Serial != 2 {
		t.Fatalf("adopt = %+v, %v, %v; want the grant with serial 2", got, ok, err)
	}
	if got, _ := ClaimGrant(ctx, c, &k, "u", 4, "t4", valid); got.Outcome != Already || got.Serial != 2 {
		t.Fatalf("claim after the adopt = %+v, want already with serial 2", got)
	}
	// A second adopt for a user who holds a grant is refused.
	if _, err := c.HSet(ctx, k.Reserve, "u", "t5:"+strconv.FormatInt(time.Now().UnixMilli(), 10)).Result(); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := Adopt(ctx, c, &k, "u", "t5", 5, 70, 1, valid); ok {
		t.Fatal("adopt for a user who holds a grant succeeded, want stale")
	}
}

// TestClaimManyMatchesClaim: batches of claim_many decide every claim as
// claim decides it one by one: random batches (users repeated within and
// across batches, pools of one sub-pool and of several) run through
// claim_many on one sub-pool and claim by claim on a twin with the same
// stock; the answers, the stock left and the grants agree (deadlines aside,
// which come from the clock), and the audit of the batched one holds.
func TestClaimManyMatchesClaim(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	rng := rand.New(rand.NewPCG(11, 12))
	for round, spill := range []bool{false, true, false, true} {
		amounts := make([]int64, 40)
		for i := range amounts {
			amounts[i] = 1 + rng.Int64N(99)
		}
		a := openSubPool(t, c, 10+2*round, 60_000, amounts...)
		b := openSubPool(t, c, 11+2*round, 60_000, amounts...)
		serial := int64(1000 * (round + 1))
		for range 12 {
			var batch []ClaimArg
			for range 1 + rng.IntN(8) {
				serial++
				token := ""
				if spill {
					token = strconv.FormatInt(serial, 10)
				}
				batch = append(batch, ClaimArg{User: "u" + strconv.Itoa(rng.IntN(50)), Serial: serial, Token: token})
			}
			got, errs, err := ClaimMany(ctx, c, &a, 60_000, batch)
			if err != nil {
				t.Fatal(err)
			}
			for i, cl := range batch {
				want, werr := ClaimGrant(ctx, c, &b, cl.User, cl.Serial, cl.Token, 60_000)
				if (errs[i] != nil) != (werr != nil) {
					t.Fatalf("claim %+v: claim_many error %v, claim error %v", cl, errs[i], werr)
				}
				got[i].DeadlineMS, want.DeadlineMS = 0, 0
				if got[i] != want {
					t.Fatalf("claim %+v: claim_many answered %+v, claim %+v", cl, got[i], want)
				}
			}
		}
		sa, _ := c.LRange(ctx, a.Stock, 0, -1).Result()
		sb, _ := c.LRange(ctx, b.Stock, 0, -1).Result()
		if !slices.Equal(sa, sb) {
			t.Fatalf("stock left: claim_many %v, claim %v", sa, sb)
		}
		ga, _ := c.HGetAll(ctx, a.Grants).Result()
		gb, _ := c.HGetAll(ctx, b.Grants).Result()
		trim := func(m map[string]string) map[string]string {
			out := map[string]string{}
			for u, g := range m {
				out[u] = g[:strings.LastIndex(g, ":")]
			}
			return out
		}
		if !maps.Equal(trim(ga), trim(gb)) {
			t.Fatalf("grants: claim_many %v, claim %v", ga, gb)
		}
		au, err := AuditSubPool(ctx, c, SubPool{Pool: "r", Index: 10 + 2*round})
		if err != nil || au.StockCount != au.ListLen || au.StockCents != au.ListSum || au.HeldCount != au.GrantsHeld ||
			au.HeldCents != au.GrantsHeldCents || au.DeadlineEntries != au.GrantsHeld {
			t.Fatalf("audit of the batched sub-pool = %+v, %v: counters and records disagree", au, err)
		}
	}
}
