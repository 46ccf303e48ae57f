package eventstest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"rain/internal/events"
)

// WaitSubscribed waits, for up to 5s, until every client's shard has at
// least n subscribers on events.Channel, and fails tb
// otherwise. It is for tests (of this package and of its users): a notice
// published before a subscription is made is not delivered to it.
func WaitSubscribed(tb testing.TB, clients []redis.UniversalClient, n int64) {
	tb.Helper()
	channel := events.Channel
	deadline := time.Now().Add(5 * time.Second)
	for i, c := range clients {
		for {
			got, err := c.PubSubNumSub(context.Background(), channel).Result()
			if err == nil && got[channel] >= n {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("shard %d: %d subscribers on %q (err %v), want ≥ %d", i+1, got[channel], channel, err, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
