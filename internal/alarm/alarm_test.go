package alarm

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRing: an alarm rings after the time it was set for; set again to 0
// it does not ring; closed with a ring not taken, or twice, it stops.
func TestRing(t *testing.T) {
	a := New()
	if a == nil {
		t.Fatal("New: no timerfd on this system")
	}
	t.Cleanup(a.Close)
	const d = 300 * time.Microsecond
	start := time.Now()
	a.Set(d)
	select {
	case <-a.C():
		if took := time.Since(start); took < d {
			t.Fatalf("the alarm rang after %v, set for %v", took, d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the alarm set for 300µs did not ring in 10 s")
	}
	a.Set(time.Hour)
	a.Set(0)
	select {
	case <-a.C():
		t.Fatal("an alarm set to 0 rang")
	case <-time.After(20 * time.Millisecond):
	}

	other := New()
	other.Set(time.Microsecond) // rings at once, and no one takes it
	time.Sleep(50 * time.Millisecond)
	closed := make(chan struct{})
	go func() { other.Close(); other.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return in 10 s with a ring not taken")
	}
}
