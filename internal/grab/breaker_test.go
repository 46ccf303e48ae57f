package grab

import (
	"testing"
	"time"
)

// TestBreaker walks the breaker through its states on a fake clock, with
// a probe the test answers.
func TestBreaker(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	shardUp, probes := false, 0
	b := newBreaker(time.Second, func() bool { probes++; return shardUp }, func(f func()) { f() })
	b.now = func() time.Time { return now }
	step := func(what string, allow bool, want breakerState, wantProbes int) {
		t.Helper()
		if got := b.allow(); got != allow {
			t.Fatalf("%s: allow() = %v, want %v", what, got, allow)
		}
		if got := b.current(); got != want {
			t.Fatalf("%s: state %v, want %v", what, got, want)
		}
		if probes != wantProbes {
			t.Fatalf("%s: %d probes, want %d", what, probes, wantProbes)
		}
	}
	step("new", true, breakerClosed, 0)
	b.done(false)
	step("after a success", true, breakerClosed, 0)
	b.done(true)
	step("after a failure", false, breakerOpen, 0)
	now = now.Add(999 * time.Millisecond)
	step("within the cooldown", false, breakerOpen, 0)
	now = now.Add(time.Millisecond)
	// The claim that finds the cooldown over is refused too: the probe is
	// a PING, never a user's claim. It finds the shard still down.
	step("after the cooldown: a failed probe", false, breakerOpen, 1)
	step("within the next cooldown", false, breakerOpen, 1)
	now = now.Add(time.Second)
	shardUp = true
	step("the next probe, answered", false, breakerClosed, 2)
	step("closed again", true, breakerClosed, 2)
	if n := b.trips.Load(); n != 2 {
		t.Fatalf("trips = %d, want 2", n)
	}

	// While a probe is out (half-open), claims are refused and no second
	// probe starts.
	var pending func()
	b = newBreaker(time.Second, func() bool { probes++; return true }, func(f func()) { pending = f })
	b.now = func() time.Time { return now }
	b.done(true)
	now = now.Add(time.Second)
	probes = 0
	step("the probe starts", false, breakerHalfOpen, 0)
	step("while it is out", false, breakerHalfOpen, 0)
	pending()
	step("it was answered", true, breakerClosed, 1)

	// A probe that fails after a batch the shard answered closed the
	// breaker leaves it closed.
	b = newBreaker(time.Second, func() bool { probes++; return false }, func(f func()) { pending = f })
	b.now = func() time.Time { return now }
	b.done(true)
	now = now.Add(time.Second)
	probes = 0
	step("a probe starts", false, breakerHalfOpen, 0)
	b.done(false) // a batch sent before the breaker opened comes back answered
	pending()
	step("the late failed probe", true, breakerClosed, 1)

	// An older probe's answer does not speak for a newer one.
	var out []func()
	b = newBreaker(time.Second, func() bool { probes++; return probes == 1 }, func(f func()) { out = append(out, f) })
	b.now = func() time.Time { return now }
	b.done(true)
	now = now.Add(time.Second)
	probes = 0
	step("probe 1 starts", false, breakerHalfOpen, 0)
	b.done(true) // a batch from before fails: open again
	now = now.Add(time.Second)
	step("probe 2 starts", false, breakerHalfOpen, 0)
	out[1]() // probe 2: answered (the second probe run)
	step("probe 2 closed it", true, breakerClosed, 1)
	b.done(true)
	now = now.Add(time.Second)
	step("probe 3 starts", false, breakerHalfOpen, 1)
	out[0]() // probe 1 comes back at last, failed: not probe 3's answer
	step("probe 1's late answer changes nothing", false, breakerHalfOpen, 2)
}
