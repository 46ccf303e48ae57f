package lua

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

func newClient(t *testing.T) *redis.Client {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	return c
}

func load(t *testing.T, c *redis.Client, sp rain.SubPool, batch int64, amounts ...int64) (LoadResult, int64) {
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

// openOne sets up sp on c as one packet of amount cents with a hold of 5 s,
// loaded and open, the scripts loaded.
func openOne(t *testing.T, c *redis.Client, sp rain.SubPool, amount int64) {
	t.Helper()
	ctx := context.Background()
	if _, _, err := Setup(ctx, c, sp, 1, amount, Window{HoldMS: 5000}); err != nil {
		t.Fatal(err)
	}
	if err := LoadScripts(ctx, c); err != nil {
		t.Fatal(err)
	}
	load(t, c, sp, 0, amount)
	if _, _, _, err := OpenSubPool(ctx, c, sp); err != nil {
		t.Fatal(err)
	}
}

func TestLoadBatchesOnceInOrder(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	sp := rain.SubPool{Pool: "p", Index: 0}
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
	sp := rain.SubPool{Pool: "p", Index: 1}
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
	if c, err := claimOne(ctx, c, &k, "u", 1, "", 0); err != nil || c.Outcome != Closed {
		t.Fatalf("claim on a loading sub-pool = %+v, %v; want closed", c, err)
	}
}

func TestClaimOutboxAndCounters(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	sp := rain.SubPool{Pool: "p", Index: 0}
	openOne(t, c, sp, 42)
	k := sp.Keys()
	got, err := claimOne(ctx, c, &k, "u1", 77, "", 0)
	if err != nil || got.Outcome != Granted || got.Amount != 42 || got.Serial != 77 || got.DeadlineMS == 0 {
		t.Fatalf("claim = %+v, %v; want granted 42 serial 77 with a deadline", got, err)
	}
	entries, err := c.XRange(ctx, k.Outbox, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("outbox = %v, %v; want one entry", entries, err)
	}
	e, err := ParseOutboxEntry(entries[0].Values)
	if err != nil || e.Release || e.User != "u1" || e.Amount != 42 || e.Serial != 77 || e.DeadlineMS != got.DeadlineMS {
		t.Fatalf("outbox entry %v = %+v, %v; want the grant's user, amount, serial and deadline", entries[0].Values, e, err)
	}
	if again, _ := claimOne(ctx, c, &k, "u1", 78, "", 0); again.Outcome != Already || again.Serial != 77 {
		t.Fatalf("second claim = %+v, want already with serial 77", again)
	}
	if empty, _ := claimOne(ctx, c, &k, "u2", 79, "", 0); empty.Outcome != Empty {
		t.Fatalf("claim on an empty sub-pool = %+v, want empty", empty)
	}
	a, err := AuditSubPool(ctx, c, sp)
	if err != nil || a.HeldCount != 1 || a.HeldCents != 42 || a.GrantsHeld != 1 || a.ListLen != 0 || a.StockCents != 0 || a.DeadlineEntries != 1 || a.Unindexed != 0 {
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
	sp := rain.SubPool{Pool: "p", Index: 0}
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
	if got, _ := claimOne(ctx, c, &k, "first", 1, "t1", valid); got.Outcome != Granted {
		t.Fatalf("first claim = %+v, want granted", got)
	}
	if got, _ := claimOne(ctx, c, &k, "u", 2, "t2", valid); got.Outcome != Reserved {
		t.Fatalf("claim on an empty home = %+v, want reserved", got)
	}
	waittest.Until(t, 5*time.Second, "the first grant released past its hold", func() bool {
		r, err := ReleaseExpired(ctx, c, &k, 10)
		if err != nil {
			t.Fatal(err)
		}
		return r.Count == 1
	})
	if got, _ := claimOne(ctx, c, &k, "u", 3, "t3", valid); got.Outcome != Busy {
		t.Fatalf("the same user's second request while spilling = %+v, want busy", got)
	}
	// The spill's adopt goes through (the amount came from a sibling).
	if got, ok, err := Adopt(ctx, c, &k, "u", "t2", 2, 70, 1, valid, 0); err != nil || !ok || got.Serial != 2 {
		t.Fatalf("adopt = %+v, %v, %v; want the grant with serial 2", got, ok, err)
	}
	if got, _ := claimOne(ctx, c, &k, "u", 4, "t4", valid); got.Outcome != Already || got.Serial != 2 {
		t.Fatalf("claim after the adopt = %+v, want already with serial 2", got)
	}
	// A second adopt for a user who holds a grant is refused.
	if _, err := c.HSet(ctx, k.Reserve, "u", "t5:"+strconv.FormatInt(time.Now().UnixMilli(), 10)).Result(); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := Adopt(ctx, c, &k, "u", "t5", 5, 70, 1, valid, 0); ok {
		t.Fatal("adopt for a user who holds a grant succeeded, want stale")
	}
}

// TestClaimManyReservationsInOneBatch: a reservation a batch makes is seen
// by the claims after it in the same batch: on an empty home, a user's
// second claim with another token is busy, the first one's sent again is
// reserved, and another user reserves too. In the next batch both are seen
// from the hash.
func TestClaimManyReservationsInOneBatch(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	k := openSubPool(t, c, 0, 60_000, 5)
	const valid = 60_000
	batch := []ClaimArg{
		{User: "a", Serial: 1, Token: "1"},
		{User: "u", Serial: 2, Token: "2"},
		{User: "u", Serial: 3, Token: "3"},
		{User: "u", Serial: 2, Token: "2"},
		{User: "v", Serial: 4, Token: "4"},
	}
	want := []Outcome{Granted, Reserved, Busy, Reserved, Reserved}
	check := func(batch []ClaimArg, want []Outcome) {
		t.Helper()
		got, errs, err := ClaimMany(ctx, c, &k, valid, batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, cl := range batch {
			if errs[i] != nil || got[i].Outcome != want[i] {
				t.Errorf("claim %+v = %+v, %v; want %v", cl, got[i], errs[i], want[i])
			}
		}
	}
	check(batch, want)
	check([]ClaimArg{{User: "v", Serial: 5, Token: "5"}, {User: "u", Serial: 2, Token: "2"}, {User: "w", Serial: 6, Token: "6"}},
		[]Outcome{Busy, Reserved, Reserved})
	if n, err := c.HLen(ctx, k.Reserve).Result(); err != nil || n != 3 {
		t.Fatalf("reservations = %d, %v; want 3 (u, v, w)", n, err)
	}
}

// TestClaimManyBatchesAsOneByOne: a batch of claim_many decides every claim
// as the same claims sent one by one decide them: random batches (users
// repeated within and across batches, pools of one sub-pool and of several)
// run through claim_many on one sub-pool and claim by claim (batches of
// one) on a twin with the same stock; the answers, the stock left and the
// grants agree (deadlines aside, which come from the clock), and the audit
// of the batched one holds.
func TestClaimManyBatchesAsOneByOne(t *testing.T) {
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
				want, werr := claimOne(ctx, c, &b, cl.User, cl.Serial, cl.Token, 60_000)
				if (errs[i] != nil) != (werr != nil) {
					t.Fatalf("claim %+v: error %v in the batch, %v alone", cl, errs[i], werr)
				}
				got[i].DeadlineMS, want.DeadlineMS = 0, 0
				if got[i] != want {
					t.Fatalf("claim %+v: answered %+v in the batch, %+v alone", cl, got[i], want)
				}
			}
		}
		sa, _ := c.LRange(ctx, a.Stock, 0, -1).Result()
		sb, _ := c.LRange(ctx, b.Stock, 0, -1).Result()
		if !slices.Equal(sa, sb) {
			t.Fatalf("stock left: batched %v, one by one %v", sa, sb)
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
			t.Fatalf("grants: batched %v, one by one %v", ga, gb)
		}
		au, err := AuditSubPool(ctx, c, rain.SubPool{Pool: "r", Index: 10 + 2*round})
		if err != nil || au.StockCount != au.ListLen || au.StockCents != au.ListSum || au.HeldCount != au.GrantsHeld ||
			au.HeldCents != au.GrantsHeldCents || au.Unindexed != 0 {
			t.Fatalf("audit of the batched sub-pool = %+v, %v: counters and records disagree", au, err)
		}
	}
}

// claimOne runs one claim through claim_many, the script production runs:
// a batch of one.
func claimOne(ctx context.Context, c Client, k *rain.Keys, user string, serial int64, token string, validityMS int64) (Claim, error) {
	claims, errs, err := ClaimMany(ctx, c, k, validityMS, []ClaimArg{{User: user, Serial: serial, Token: token}})
	if err != nil {
		return Claim{}, err
	}
	return claims[0], errs[0]
}

// TestExpiredHoldReleasedOnRead: a held grant past its deadline (the reaper
// has not swept it yet) is never answered: a grab of its user releases it
// as the reaper would (its amount back to the stock, a release entry in the
// outbox, the counters moved) and is decided as a new grab, with a deadline
// ahead. The claim that made the grant, sent again, still answers it.
func TestExpiredHoldReleasedOnRead(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	k := openSubPool(t, c, 0, 20, 7, 8) // a hold of 20 ms
	first, err := claimOne(ctx, c, &k, "u", 1, "", 0)
	if err != nil || first.Outcome != Granted {
		t.Fatalf("claim = %+v, %v; want granted", first, err)
	}
	now := func() int64 {
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	waittest.Until(t, 5*time.Second, "the grant's deadline passed on the shard's clock", func() bool { return now() > first.DeadlineMS })
	if again, err := claimOne(ctx, c, &k, "u", 1, "", 0); err != nil || again != first {
		t.Fatalf("the first claim sent again = %+v, %v; want its grant %+v", again, err, first)
	}
	next, err := claimOne(ctx, c, &k, "u", 2, "", 0)
	if err != nil || next.Outcome != Granted || next.Serial != 2 || next.DeadlineMS < now() {
		t.Fatalf("a grab after the hold ran out = %+v, %v; want a new grant with serial 2 and a deadline ahead", next, err)
	}
	m, _ := c.HGetAll(ctx, k.Meta).Result()
	if m["released_count"] != "1" || m["released_cents"] != strconv.FormatInt(first.Amount, 10) || m["held_count"] != "1" || m["stock_count"] != "1" {
		t.Fatalf("counters %v: want 1 released (%d cents), 1 held, 1 in stock", m, first.Amount)
	}
	entries, _ := c.XRange(ctx, k.Outbox, "-", "+").Result()
	var kinds []string
	for _, e := range entries {
		en, err := ParseOutboxEntry(e.Values)
		if err != nil {
			t.Fatalf("outbox entry %v: %v", e.Values, err)
		}
		kind := "grant"
		if en.Release {
			kind = "release"
		}
		kinds = append(kinds, fmt.Sprint(kind, ":", en.Serial))
	}
	if !slices.Equal(kinds, []string{"grant:1", "release:1", "grant:2"}) {
		t.Fatalf("outbox %v, want grant:1 release:1 grant:2", kinds)
	}
	a, err := AuditSubPool(ctx, c, rain.SubPool{Pool: "r", Index: 0})
	if err != nil || a.HeldCount != a.GrantsHeld || a.Unindexed != 0 || a.StockCount != a.ListLen || a.StockCents != a.ListSum {
		t.Fatalf("audit %+v, %v: counters and records disagree", a, err)
	}
}
