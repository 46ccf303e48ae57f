package soldout

import (
	"strconv"
	"sync"
	"testing"
	"time"
)

// rwCache is the baseline: one map of deadlines behind a sync.RWMutex.
type rwCache struct {
	mu    sync.RWMutex // guards until
	until map[string][]time.Time
}

func (r *rwCache) AllEmpty(pool string, k int) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	u := r.until[pool]
	if k <= 0 || k > len(u) {
		return false
	}
	now := time.Now()
	for _, d := range u[:k] {
		if !now.Before(d) {
			return false
		}
	}
	return true
}

// BenchmarkAllEmpty is the sold-out flood: every goroutine asks about the
// same hot pool of k sub-pools, all marked empty, beside the RWMutex
// baseline. 1000 other pools are present.
func BenchmarkAllEmpty(b *testing.B) {
	for _, k := range []int{1, 8, 32} {
		c := New(Config{})
		rw := &rwCache{until: map[string][]time.Time{}}
		for i := range 1000 {
			c.MarkEmpty("cold-"+strconv.Itoa(i), 0)
		}
		for j := range k {
			c.MarkEmpty("hot", j)
		}
		rw.until["hot"] = make([]time.Time, k)
		for j := range k {
			rw.until["hot"][j] = time.Now().Add(time.Hour)
		}
		b.Run("cache/k="+strconv.Itoa(k), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					if i&0xffff == 0 { // marks last 1s, a run longer: renew them now and then
						for j := range k {
							c.MarkEmpty("hot", j)
						}
					}
					if !c.AllEmpty("hot", k) {
						b.Error("AllEmpty = false")
						return
					}
				}
			})
		})
		b.Run("rwmutex/k="+strconv.Itoa(k), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					rw.AllEmpty("hot", k)
				}
			})
		})
	}
}

// BenchmarkEmpty asks about one sub-pool: of the hot pool (marked), and of a
// pool the cache does not hold (the common case before a sell-out).
func BenchmarkEmpty(b *testing.B) {
	c := New(Config{})
	for _, q := range []struct {
		name, pool string
		want       bool
	}{{"marked", "hot", true}, {"unknown", "cold", false}} {
		b.Run(q.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					if i&0xffff == 0 && q.want { // marks last 1s, a run longer
						c.MarkEmpty(q.pool, 3)
					}
					if c.Empty(q.pool, 3) != q.want {
						b.Errorf("Empty(%q, 3) = %v", q.pool, !q.want)
						return
					}
				}
			})
		})
	}
}

// BenchmarkMarkEmpty marks a sub-pool of a pool already held: an atomic
// store, no lock.
func BenchmarkMarkEmpty(b *testing.B) {
	c := New(Config{})
	c.MarkEmpty("hot", 7)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		j := 0
		for pb.Next() {
			c.MarkEmpty("hot", j&7)
			j++
		}
	})
}
