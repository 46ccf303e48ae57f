package soldout

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a fake clock that moves only when told.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// count returns how many pools c holds.
func (c *Cache) count() int {
	n := 0
	for i := range c.shards {
		n += len(*c.shards[i].pools.Load())
	}
	return n
}

func TestTTL(t *testing.T) {
	tests := []struct {
		name string
		ttl  time.Duration
		want time.Duration
	}{
		{"default", 0, time.Second},
		{"shorter", 200 * time.Millisecond, 200 * time.Millisecond},
		{"cut to MaxTTL", 5 * time.Second, MaxTTL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newClock()
			c := New(Config{TTL: tt.ttl, Now: clk.Now})
			c.MarkEmpty("p", 0)
			clk.Advance(tt.want - 1)
			if !c.Empty("p", 0) {
				t.Fatalf("Empty 1ns before %v = false, want true", tt.want)
			}
			clk.Advance(1)
			if c.Empty("p", 0) {
				t.Fatalf("Empty at %v = true, want false", tt.want)
			}
		})
	}
}

func TestMarkAgainExtends(t *testing.T) {
	clk := newClock()
	c := New(Config{Now: clk.Now})
	c.MarkEmpty("p", 0)
	clk.Advance(800 * time.Millisecond)
	c.MarkEmpty("p", 0)
	clk.Advance(800 * time.Millisecond)
	if !c.Empty("p", 0) {
		t.Fatal("Empty 800ms after the second mark = false, want true")
	}
}

func TestForget(t *testing.T) {
	c := New(Config{Now: newClock().Now})
	c.MarkEmpty("p", 0)
	c.MarkEmpty("p", 1)
	c.MarkEmpty("q", 1)
	c.Forget("p", 1)
	c.Forget("p", 7)      // never marked: nothing to do
	c.Forget("absent", 0) // unknown pool: nothing to do
	c.Forget("p", -1)     // out of range: nothing to do
	for _, tt := range []struct {
		pool string
		j    int
		want bool
	}{{"p", 0, true}, {"p", 1, false}, {"q", 1, true}} {
		if got := c.Empty(tt.pool, tt.j); got != tt.want {
			t.Errorf("Empty(%q, %d) = %v, want %v", tt.pool, tt.j, got, tt.want)
		}
	}
	c.Forget("p", 0)
	if c.Empty("p", 0) || !c.Empty("q", 1) {
		t.Errorf("after Forget(p, 0): Empty(p, 0) = %v, Empty(q, 1) = %v; want false, true", c.Empty("p", 0), c.Empty("q", 1))
	}
	c.MarkEmpty("p", 1) // a forgotten sub-pool can be marked again
	if !c.Empty("p", 1) {
		t.Error("Empty(p, 1) after marking again = false")
	}
}

func TestAllEmpty(t *testing.T) {
	tests := []struct {
		name    string
		marked  []int
		forget  []int
		advance time.Duration
		k       int
		want    bool
	}{
		{"none marked", nil, nil, 0, 4, false},
		{"all marked", []int{0, 1, 2, 3}, nil, 0, 4, true},
		{"one missing", []int{0, 1, 3}, nil, 0, 4, false},
		{"one forgotten", []int{0, 1, 2, 3}, []int{2}, 0, 4, false},
		{"all expired", []int{0, 1, 2, 3}, nil, time.Second, 4, false},
		{"marks beyond k do not matter", []int{0, 1, 5}, nil, 0, 2, true},
		{"k beyond the marks", []int{0, 1}, nil, 0, 3, false},
		{"k beyond the entry", []int{0}, nil, 0, 100, false},
		{"k zero", []int{0}, nil, 0, 0, false},
		{"k negative", []int{0}, nil, 0, -1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newClock()
			c := New(Config{Now: clk.Now})
			for _, j := range tt.marked {
				c.MarkEmpty("p", j)
			}
			for _, j := range tt.forget {
				c.Forget("p", j)
			}
			clk.Advance(tt.advance)
			if got := c.AllEmpty("p", tt.k); got != tt.want {
				t.Fatalf("AllEmpty(p, %d) = %v, want %v", tt.k, got, tt.want)
			}
		})
	}
}

// One expired mark makes AllEmpty false even when the others are fresh.
func TestAllEmptyNeedsEveryMarkUnexpired(t *testing.T) {
	clk := newClock()
	c := New(Config{Now: clk.Now})
	c.MarkEmpty("p", 0)
	clk.Advance(600 * time.Millisecond)
	c.MarkEmpty("p", 1)
	if !c.AllEmpty("p", 2) {
		t.Fatal("AllEmpty(p, 2) with both marked = false")
	}
	clk.Advance(400 * time.Millisecond) // sub-pool 0 expires
	if c.AllEmpty("p", 2) {
		t.Fatal("AllEmpty(p, 2) after sub-pool 0 expired = true")
	}
}

func TestSubPoolIndexes(t *testing.T) {
	c := New(Config{Now: newClock().Now})
	for _, j := range []int{0, 9, 100, MaxSubPools - 1} { // each grows the entry
		c.MarkEmpty("p", j)
	}
	for _, j := range []int{0, 9, 100, MaxSubPools - 1} {
		if !c.Empty("p", j) {
			t.Errorf("Empty(p, %d) = false after growing the entry", j)
		}
	}
	for _, j := range []int{-1, MaxSubPools, 1 << 40} {
		c.MarkEmpty("q", j)
		if c.Empty("q", j) {
			t.Errorf("Empty(q, %d) = true for an index out of range", j)
		}
	}
	if c.Empty("p", 1) || c.Empty("p", -1) || c.Empty("p", 1<<40) {
		t.Error("Empty of a sub-pool never marked = true")
	}
}

// Pools whose marks all expired are dropped at the next insert into their
// shard.
func TestSweepsExpired(t *testing.T) {
	clk := newClock()
	c := New(Config{Now: clk.Now})
	for i := range 1000 {
		c.MarkEmpty("old-"+strconv.Itoa(i), 0)
	}
	clk.Advance(time.Second)
	for i := range 1000 {
		c.MarkEmpty("new-"+strconv.Itoa(i), 0)
	}
	if n := c.count(); n != 1000 {
		t.Fatalf("pools held = %d, want 1000 (the expired ones swept)", n)
	}
}

func TestBoundedPools(t *testing.T) {
	clk := newClock()
	c := New(Config{MaxPools: 64, Now: clk.Now})
	for i := range 10_000 {
		id := "p-" + strconv.Itoa(i)
		c.MarkEmpty(id, 0)
		if !c.Empty(id, 0) {
			t.Fatalf("Empty(%q) right after its mark = false", id)
		}
	}
	if n := c.count(); n > 64 {
		t.Fatalf("pools held = %d, want ≤ 64", n)
	}
}

// sameShard returns n pool ids that fall in one shard of c.
func sameShard(c *Cache, n int) []string {
	byShard := map[*shard][]string{}
	for i := 0; ; i++ {
		id := "p-" + strconv.Itoa(i)
		s := c.shard(id)
		byShard[s] = append(byShard[s], id)
		if len(byShard[s]) == n {
			return byShard[s]
		}
	}
}

// A full shard drops expired pools first, then the pool that expires soonest.
func TestEvictionOrder(t *testing.T) {
	clk := newClock()
	c := New(Config{MaxPools: 2 * numShards, Now: clk.Now}) // 2 per shard
	p := sameShard(c, 4)
	c.MarkEmpty(p[0], 0)
	clk.Advance(600 * time.Millisecond)
	c.MarkEmpty(p[1], 0)
	clk.Advance(500 * time.Millisecond) // p0 expired, p1 live
	c.MarkEmpty(p[2], 0)                // sweeps p0, no eviction
	if !c.Empty(p[1], 0) || !c.Empty(p[2], 0) {
		t.Fatalf("after sweeping an expired pool: Empty(p1) = %v, Empty(p2) = %v; want both true", c.Empty(p[1], 0), c.Empty(p[2], 0))
	}
	c.MarkEmpty(p[3], 0) // full of live pools: evicts p1, which expires first
	if c.Empty(p[1], 0) || !c.Empty(p[2], 0) || !c.Empty(p[3], 0) {
		t.Fatalf("after evicting: Empty(p1, p2, p3) = %v, %v, %v; want false, true, true", c.Empty(p[1], 0), c.Empty(p[2], 0), c.Empty(p[3], 0))
	}
}

func TestHotPathDoesNotAllocate(t *testing.T) {
	c := New(Config{})
	for j := range 8 {
		c.MarkEmpty("hot", j)
	}
	for name, fn := range map[string]func(){
		"Empty":           func() { c.Empty("hot", 3) },
		"Empty unknown":   func() { c.Empty("cold", 3) },
		"AllEmpty":        func() { c.AllEmpty("hot", 8) },
		"MarkEmpty known": func() { c.MarkEmpty("hot", 5) },
	} {
		if n := testing.AllocsPerRun(100, fn); n != 0 {
			t.Errorf("%s allocates %v times, want 0", name, n)
		}
	}
}

// Every method at once, under -race, with the real clock. With room for
// every pool, each worker also owns a pool nobody else forgets: its own
// marks must read back at once. With little room, pools are evicted while
// read (and a read-back may miss: eviction is allowed to cost a mark).
func TestConcurrent(t *testing.T) {
	for _, tt := range []struct {
		name     string
		maxPools int
		readBack bool
	}{
		{"room", 0, true},
		{"evicting", 2 * numShards, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := New(Config{MaxPools: tt.maxPools})
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					own := "own-" + strconv.Itoa(g)
					for i := range 3_000 {
						shared := "shared-" + strconv.Itoa(i%17)
						j := i % 40 // past minSubs: entries grow while read
						c.MarkEmpty(own, j)
						if !c.Empty(own, j) && tt.readBack {
							t.Errorf("Empty(%q, %d) right after its mark = false", own, j)
							return
						}
						c.MarkEmpty(shared, j)
						c.Empty(shared, (j+1)%40)
						c.AllEmpty(shared, 4)
						if i%25 == 0 {
							c.Forget(shared, j)
						}
						if i%100 == 0 { // inserts copy the shard maps
							c.MarkEmpty("churn-"+strconv.Itoa(g)+"-"+strconv.Itoa(i), 0)
						}
					}
				})
			}
			wg.Wait()
			limit := tt.maxPools
			if limit == 0 {
				limit = DefaultMaxPools
			}
			if n := c.count(); n > limit {
				t.Errorf("pools held = %d, want ≤ %d", n, limit)
			}
		})
	}
}
