package idgen

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"rain/internal/lua"
)

// Key is the counter every grant serial of rain comes from, on the serial shard.
const Key = "rain:serial"

// RedisAllocator reserves IDs on a counter key of one Redis, the primary
// (rain's serial shard). Every generator and process that shares the key
// shares one ID space.
//
// A primary that loses writes (its host lost power with appendfsync
// everysec, an older backup was restored) would hand out again the segments
// it lost, to another instance: the generator's own guard sees only what
// that generator reserved. So each reservation's end is also copied, as a
// watermark that only rises, to the mirrors (the other shards), and each
// reservation starts at or above the highest watermark it reads: a primary
// that came back older is carried past everything handed out before. Reads
// and writes of the watermark each need a majority of the mirrors, so any
// read meets the copy of the last write while at most a minority of mirrors
// is down; with no mirrors (one shard) uniqueness rests on the primary's own
// durability (appendfsync always).
type RedisAllocator struct {
	primary redis.Cmdable
	key     string
	mirrors []Mirror
	// MirrorTimeout bounds each mirror call. Default 500ms.
	MirrorTimeout time.Duration
}

// Mirror is where one watermark copy lives: a client, and the key on it.
type Mirror struct {
	C   redis.Cmdable
	Key string
}

// NewRedisAllocator returns an allocator on key at primary, with watermark
// copies at key+":watermark" on mirrors.
func NewRedisAllocator(primary redis.Cmdable, key string, mirrors ...redis.Cmdable) *RedisAllocator {
	ms := make([]Mirror, len(mirrors))
	for i, m := range mirrors {
		ms[i] = Mirror{C: m, Key: key + ":watermark"}
	}
	return NewRedisAllocatorMirrors(primary, key, ms)
}

// NewRedisAllocatorMirrors is NewRedisAllocator with a key of its own for
// each copy: on a Redis Cluster the copies are keys whose slots fall on
// other primaries than the counter's (see the instance's wiring).
func NewRedisAllocatorMirrors(primary redis.Cmdable, key string, mirrors []Mirror) *RedisAllocator {
	return &RedisAllocator{primary: primary, key: key, mirrors: mirrors, MirrorTimeout: 500 * time.Millisecond}
}

// errNoQuorum is returned when fewer than a majority of mirrors answered.
var errNoQuorum = errors.New("fewer than a majority of the serial watermark copies answered")

// Alloc reserves n IDs and returns the end of the reserved range: it reads
// the watermark from the mirrors, runs max(counter, watermark) + n on the
// primary, and raises the mirrors' watermark to the new end before it
// returns, so no ID of the range is served before its copies exist. An
// Alloc that fails after the primary moved leaves a gap, never a duplicate.
func (a *RedisAllocator) Alloc(ctx context.Context, n int64) (int64, error) {
	floor, err := a.watermark(ctx)
	if err != nil {
		return 0, err
	}
	end, err := lua.ReserveSerials(ctx, a.primary, a.key, n, floor)
	if err != nil {
		return 0, fmt.Errorf("reserve %s: %w", a.key, err)
	}
	if err := a.raise(ctx, end); err != nil {
		return 0, err
	}
	return end, nil
}

func (a *RedisAllocator) quorum() int { return len(a.mirrors)/2 + 1 }

// watermark is the highest watermark a majority of the mirrors hold.
func (a *RedisAllocator) watermark(ctx context.Context) (int64, error) {
	if len(a.mirrors) == 0 {
		return 0, nil
	}
	vals, errs := a.each(ctx, func(ctx context.Context, m Mirror) (int64, error) {
		v, err := m.C.Get(ctx, m.Key).Int64()
		if errors.Is(err, redis.Nil) {
			return 0, nil
		}
		return v, err
	})
	return a.decide(vals, errs, "read")
}

// raise lifts the watermark on every mirror to at least end.
func (a *RedisAllocator) raise(ctx context.Context, end int64) error {
	if len(a.mirrors) == 0 {
		return nil
	}
	vals, errs := a.each(ctx, func(ctx context.Context, m Mirror) (int64, error) {
		return lua.RaiseWatermark(ctx, m.C, m.Key, end)
	})
	_, err := a.decide(vals, errs, "raise")
	return err
}

// decide returns the highest value when a majority answered.
func (a *RedisAllocator) decide(vals []int64, errs []error, op string) (int64, error) {
	var high int64
	ok := 0
	for i, err := range errs {
		if err == nil {
			ok++
			high = max(high, vals[i])
		}
	}
	if ok < a.quorum() {
		return 0, fmt.Errorf("%s the watermark of %s: %w (%d of %d): %w", op, a.key, errNoQuorum, ok, len(a.mirrors), errors.Join(errs...))
	}
	return high, nil
}

// quorumGrace is how long the mirrors that have not answered get once a
// majority has (see each).
const quorumGrace = 50 * time.Millisecond

// errLate is the error of a mirror that had not answered quorumGrace after
// a majority had.
var errLate = errors.New("no answer within the grace after a majority answered")

// each calls f on every mirror at once, each bounded by MirrorTimeout.
// Once a majority has answered, the others get quorumGrace more: a mirror
// that hangs does not hold a load up (its call goes on in the background
// until its budget ends, and is counted as errLate), while a healthy one a
// moment slower still counts: a raise reaches more copies than a bare
// majority, and a read sees more of them, which is margin beyond what the
// quorum promises (any read majority meets any raise majority).
func (a *RedisAllocator) each(ctx context.Context, f func(context.Context, Mirror) (int64, error)) ([]int64, []error) {
	type answer struct {
		i   int
		v   int64
		err error
	}
	answers := make(chan answer, len(a.mirrors)) // buffered: a late call's goroutine never blocks
	for i, m := range a.mirrors {
		go func() {
			mctx, cancel := context.WithTimeout(ctx, a.MirrorTimeout)
			defer cancel()
			v, err := f(mctx, m)
			answers <- answer{i, v, err}
		}()
	}
	vals := make([]int64, len(a.mirrors))
	errs := make([]error, len(a.mirrors))
	for i := range errs {
		errs[i] = errLate
	}
	ok := 0
	var grace <-chan time.Time // set once a majority has answered
	for range a.mirrors {
		select {
		case r := <-answers:
			vals[r.i], errs[r.i] = r.v, r.err
			if r.err == nil {
				if ok++; ok == a.quorum() {
					grace = time.After(quorumGrace)
				}
			}
		case <-grace:
			return vals, errs
		}
	}
	return vals, errs
}
