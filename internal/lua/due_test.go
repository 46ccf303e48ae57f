package lua

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestDueIndex: a marked sub-pool is due now; marking it again keeps the
// time the reaper set; a reaper that found nothing to do drops it only if
// nobody marked it since it read it.
func TestDueIndex(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	now := time.UnixMilli(1_800_000_000_000)
	a, b := SubPool{Pool: "p", Index: 0}.Keys().Meta, SubPool{Pool: "p", Index: 1, Salt: "7"}.Keys().Meta
	if err := MarkDue(ctx, c, now, []string{a, b}); err != nil {
		t.Fatal(err)
	}
	due, next, err := ReadDue(ctx, c, now, 10)
	if err != nil || len(due) != 2 || !next.IsZero() {
		t.Fatalf("ReadDue = %+v, %v, %v; want both due, nothing later", due, next, err)
	}
	// a has a grant falling due in a minute: look then.
	later := now.Add(time.Minute)
	if left, err := DoneDue(ctx, c, due[0], later); err != nil || left {
		t.Fatalf("DoneDue(a, later) = %v, %v", left, err)
	}
	// b had nothing to do, but a grab marked it after the read: it stays.
	if err := MarkDue(ctx, c, now, []string{b, a}); err != nil {
		t.Fatal(err)
	}
	if left, err := DoneDue(ctx, c, due[1], time.Time{}); err != nil || left {
		t.Fatalf("DoneDue(b) after a new mark = %v, %v; want it kept", left, err)
	}
	due, next, err = ReadDue(ctx, c, now, 10)
	if err != nil || len(due) != 1 || due[0].Meta != b || !next.Equal(later) {
		t.Fatalf("ReadDue = %+v, %v, %v; want b due, a at %v (a mark keeps the reaper's time)", due, next, err, later)
	}
	if left, err := DoneDue(ctx, c, due[0], time.Time{}); err != nil || !left {
		t.Fatalf("DoneDue(b) with no mark since = %v, %v; want it dropped", left, err)
	}
	due, _, err = ReadDue(ctx, c, later, 10)
	if err != nil || len(due) != 1 || due[0].Meta != a {
		t.Fatalf("ReadDue at the minute = %+v, %v; want a", due, err)
	}
	if n, _ := c.HLen(ctx, DueGen).Result(); n != 1 {
		t.Fatalf("%d marks counted, want a's only (b's went with it)", n)
	}
	for _, m := range []string{a, b} {
		sp, ok := ParseMeta(m)
		if !ok || sp.Keys().Meta != m {
			t.Fatalf("ParseMeta(%q) = %+v, %v", m, sp, ok)
		}
	}
	if !slices.Contains(SubPool{Pool: "p", Index: 0}.Keys().All(), a) {
		t.Fatal("the meta key is not a sub-pool key")
	}
}

// TestReleaseAndTransfersSayWhatIsLeft: release counts the grants still
// held, and transfers those in flight, for the reaper to know when a
// sub-pool has nothing left to do.
func TestReleaseAndTransfersSayWhatIsLeft(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	h := openSubPool(t, c, 0, 60_000, 10)
	j := openSubPool(t, c, 1, 60_000, 20)
	r, err := ReleaseExpired(ctx, c, &h, 10)
	if err != nil || r.Held != 0 {
		t.Fatalf("release on an untouched sub-pool = %+v, %v", r, err)
	}
	if cl, err := claimOne(ctx, c, &h, "u1", 1, "1", 60_000); err != nil || cl.Outcome != Granted {
		t.Fatalf("claim = %+v, %v", cl, err)
	}
	r, err = ReleaseExpired(ctx, c, &h, 10)
	if err != nil || r.Held != 1 {
		t.Fatalf("release with one grant held = %+v, %v; want held 1", r, err)
	}
	f, err := StaleTransfers(ctx, c, &j, 3000, 8000)
	if err != nil || f.Count != 0 {
		t.Fatalf("transfers with none in flight = %+v, %v", f, err)
	}
	if taken, _, err := Take(ctx, c, &j, "2", 0, "u2", 0); err != nil || taken != TakenAmount {
		t.Fatalf("take = %v, %v", taken, err)
	}
	f, err = StaleTransfers(ctx, c, &j, 3000, 8000)
	if err != nil || f.Count != 1 || len(f.Stale) != 0 {
		t.Fatalf("transfers with one in flight, young = %+v, %v; want count 1, none stale", f, err)
	}
}
