package known

import (
	"strconv"
	"sync"
	"testing"

	"github.com/bits-and-blooms/bloom/v3"
)

// rwFilter is the baseline: one Bloom filter behind a sync.RWMutex.
type rwFilter struct {
	mu sync.RWMutex // guards b
	b  *bloom.BloomFilter
}

func (r *rwFilter) MayContain(id string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.b.TestString(id)
}

// BenchmarkMayContain compares Filter (lock-free reads of an immutable
// filter) with the RWMutex baseline, for members and for unknown ids (the
// flood of forged ids), all goroutines reading at once.
func BenchmarkMayContain(b *testing.B) {
	const n = 100_000
	members := ids("pool-", n)
	unknown := ids("forged-", n)
	f := New(Config{})
	f.Reset(members)
	rw := &rwFilter{b: bloom.NewWithEstimates(2*n, designRate)}
	for _, id := range members {
		rw.b.AddString(id)
	}
	impls := []struct {
		name string
		fn   func(string) bool
	}{
		{"filter", f.MayContain},
		{"rwmutex", rw.MayContain},
	}
	for _, impl := range impls {
		for _, q := range []struct {
			name string
			ids  []string
		}{{"member", members}, {"unknown", unknown}} {
			b.Run(impl.name+"/"+q.name, func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					for pb.Next() {
						impl.fn(q.ids[i%n])
						i++
					}
				})
			})
		}
	}
}

// BenchmarkAdd measures Add of a new id: a copy of the whole filter, so it
// grows with the capacity (once per preloaded pool).
func BenchmarkAdd(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			f := New(Config{})
			f.Reset(ids("pool-", n))
			added := 0
			for b.Loop() {
				f.Add("new-" + strconv.Itoa(added)) // never a repeat: each one copies
				added++
				if added%(n/4) == 0 { // stay below the capacity: no rebuild
					b.StopTimer()
					f.Reset(ids("pool-", n))
					b.StartTimer()
				}
			}
		})
	}
}
