package grab

import (
	"testing"
	"time"
)

// TestBreaker walks the breaker through its states on a fake clock.
func TestBreaker(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	b := newBreaker(time.Second)
	b.now = func() time.Time { return now }
	step := func(what string, allow bool, want breakerState) {
		t.Helper()
		if got := b.allow(); got != allow {
			t.Fatalf("%s: allow() = %v, want %v", what, got, allow)
		}
		if got := b.current(); got != want {
			t.Fatalf("%s: state %v, want %v", what, got, want)
		}
	}
	step("new", true, breakerClosed)
	b.done(false)
	step("after a success", true, breakerClosed)
	b.done(true)
	step("after a failure", false, breakerOpen)
	now = now.Add(999 * time.Millisecond)
	step("within the cooldown", false, breakerOpen)
	now = now.Add(time.Millisecond)
	step("after the cooldown: the probe", true, breakerHalfOpen)
	step("while the probe is out", false, breakerHalfOpen)
	b.done(true)
	step("after a failed probe", false, breakerOpen)
	now = now.Add(time.Second)
	step("the next probe", true, breakerHalfOpen)
	b.done(false)
	step("after a good probe", true, breakerClosed)
	if n := b.trips.Load(); n != 2 {
		t.Fatalf("trips = %d, want 2", n)
	}
}
