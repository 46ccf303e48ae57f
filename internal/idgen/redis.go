package idgen

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// RedisAllocator reserves IDs with INCRBY on one key. Every generator and
// process that shares the key shares one ID space.
type RedisAllocator struct {
	rdb redis.Cmdable
	key string
}

// NewRedisAllocator returns an allocator on key.
func NewRedisAllocator(rdb redis.Cmdable, key string) *RedisAllocator {
	return &RedisAllocator{rdb: rdb, key: key}
}

// Alloc runs INCRBY key n and returns the new value.
func (a *RedisAllocator) Alloc(ctx context.Context, n int64) (int64, error) {
	end, err := a.rdb.IncrBy(ctx, a.key, n).Result()
	if err != nil {
		return 0, fmt.Errorf("incrby %s: %w", a.key, err)
	}
	return end, nil
}
