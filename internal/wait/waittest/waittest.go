// Package waittest is the one polling helper of rain's tests: Until waits for
// a condition a test cannot be told about directly (a shard's state, another
// goroutine's progress), and fails the test when it does not come in time.
package waittest

import (
	"testing"
	"time"
)

// Until polls cond every millisecond until it is true, and returns how long
// that took; it fails tb with what when within passes first.
func Until(tb testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			tb.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}
