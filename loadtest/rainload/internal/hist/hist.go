// Package hist is a fixed-memory, lock-free latency histogram in the style of
// HdrHistogram: log-linear buckets with about 1% relative precision from 1 ns to
// beyond 60 s.
//
// Values below 256 ns are counted exactly. Above that, every power of two
// [2^k, 2^(k+1)) is cut into 128 equal buckets, so a bucket is at most 1/128 of its
// lower bound wide, and a quantile read back as the bucket's midpoint is within
// 0.4% of a value in that bucket. The top bucket ends at 2^36 ns (68.7 s); longer
// values are counted in it, and Max still reports them exactly.
package hist

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

const (
	subBits = 7
	sub     = 1 << subBits // buckets per power of two
	// topExp is the largest k of a bucket range [2^k, 2^(k+1)).
	topExp = 35
	// nBuckets: 2*sub exact buckets for [0, 256), then sub per power of two
	// from 2^8 to 2^topExp.
	nBuckets = 2*sub + (topExp-subBits)*sub
)

// Hist counts durations. The zero value is an empty histogram, ready to use. All
// methods may be called concurrently; Record is lock-free (a few atomic adds).
// Readers running beside writers see each counter atomically but not all of them
// at one instant: a quantile may miss a value being recorded. A Hist must not be
// copied after first use.
type Hist struct {
	counts [nBuckets]atomic.Uint64
	n      atomic.Uint64
	sum    atomic.Uint64 // nanoseconds
	max    atomic.Int64  // nanoseconds
}

// Record counts one duration; negative durations count as 0.
func (h *Hist) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[index(v)].Add(1)
	h.n.Add(1)
	h.sum.Add(uint64(v))
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			return
		}
	}
}

// index returns the bucket of v >= 0 ns.
func index(v int64) int {
	if v < 2*sub {
		return int(v)
	}
	k := bits.Len64(uint64(v)) - 1 // v in [2^k, 2^(k+1)), k >= subBits+1
	if k > topExp {
		return nBuckets - 1
	}
	shift := k - subBits
	return 2*sub + (k-subBits-1)*sub + int(v>>shift) - sub
}

// bounds returns the range [lo, hi) of bucket i in nanoseconds.
func bounds(i int) (lo, hi int64) {
	if i < 2*sub {
		return int64(i), int64(i) + 1
	}
	j := i - 2*sub
	shift := j/sub + 1 // k - subBits
	lo = int64(sub+j%sub) << shift
	return lo, lo + 1<<shift
}

// Count returns how many durations were recorded.
func (h *Hist) Count() uint64 { return h.n.Load() }

// Max returns the largest duration recorded, 0 when none was.
func (h *Hist) Max() time.Duration { return time.Duration(h.max.Load()) }

// Mean returns the mean of the recorded durations, 0 when none was.
func (h *Hist) Mean() time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / n)
}

// Quantile returns the duration at quantile q in [0, 1]: the value of rank
// ceil(q·n) among the n recorded ones in increasing order (the smallest for q = 0),
// as the midpoint of its bucket, never above Max. Quantile(1) is Max. It returns 0
// when nothing was recorded.
func (h *Hist) Quantile(q float64) time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	mx := h.max.Load()
	if q >= 1 {
		return time.Duration(mx)
	}
	rank := uint64(math.Ceil(q * float64(n)))
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			lo, hi := bounds(i)
			mid := lo + (hi-lo-1)/2
			return time.Duration(min(mid, mx))
		}
	}
	// A writer added to n but not yet to its bucket.
	return time.Duration(mx)
}

// Merge adds the counts of o to h. o may be recorded into meanwhile; h then gets
// some of those values, not necessarily all.
func (h *Hist) Merge(o *Hist) {
	var n uint64
	for i := range o.counts {
		if c := o.counts[i].Load(); c > 0 {
			h.counts[i].Add(c)
			n += c
		}
	}
	h.n.Add(n)
	h.sum.Add(o.sum.Load())
	v := o.max.Load()
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			return
		}
	}
}

// Reset empties h. Values recorded while Reset runs may be partly kept.
func (h *Hist) Reset() {
	for i := range h.counts {
		h.counts[i].Store(0)
	}
	h.n.Store(0)
	h.sum.Store(0)
	h.max.Store(0)
}
