package minimal

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"rain/internal/redistest"
)

// TestStockAndClaim: Stock pushes every amount in order across its batches
// and round trips, and sets the meta only when it is not set; ClaimSrc
// grants each user one amount from the head of the stock, answers a user
// who holds one with it again, a pool whose stock ran out "sold out", and
// a pool never stocked "no such pool".
func TestStockAndClaim(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t, redistest.Start(t, redistest.Options{}))
	k := Keys("p")
	n := int64(pushBatch*pushPipe + 2*pushBatch + 7) // over one round trip, and a part batch
	amounts := func(yield func(int64) bool) {
		for i := range n {
			if !yield(i + 1) {
				return
			}
		}
	}
	if err := Stock(ctx, c, k, 5, amounts); err != nil {
		t.Fatal(err)
	}
	if err := Stock(ctx, c, k, 9, Same(3, 100)); err != nil {
		t.Fatal(err)
	}
	whole := int64(pushBatch * pushPipe) // whole batches and round trips: no part batch left
	if err := Stock(ctx, c, k, 9, Same(whole, 7)); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range n {
		want = append(want, strconv.FormatInt(i+1, 10))
	}
	want = append(want, "100", "100", "100")
	for range whole {
		want = append(want, "7")
	}
	got, err := c.LRange(ctx, k[0], 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("stock holds %d amounts, want %d: 1 to %d, three of 100, %d of 7, in that order", len(got), len(want), n, whole)
	}
	if m, err := c.Get(ctx, k[2]).Result(); err != nil || m != "5" {
		t.Fatalf("meta = %q, %v; want 5, the first Stock's (set only when not set)", m, err)
	}

	claim := redis.NewScript(ClaimSrc)
	run := func(keys []string, user string) []int64 {
		t.Helper()
		r, err := claim.Run(ctx, c, keys, user).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := run(k, "alice"); !slices.Equal(r, []int64{2, 1}) {
		t.Fatalf("alice's claim = %v, want granted the head of the stock, {2 1}", r)
	}
	if r := run(k, "alice"); !slices.Equal(r, []int64{1, 1}) {
		t.Fatalf("alice's second claim = %v, want already granted, {1 1}", r)
	}
	if err := c.Del(ctx, k[0]).Err(); err != nil {
		t.Fatal(err)
	}
	if r := run(k, "bob"); !slices.Equal(r, []int64{0, 0}) {
		t.Fatalf("a claim on an empty stock = %v, want sold out, {0 0}", r)
	}
	if r := run(Keys("never"), "bob"); !slices.Equal(r, []int64{-1, 0}) {
		t.Fatalf("a claim on a pool never stocked = %v, want no such pool, {-1 0}", r)
	}
}
