package lua

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"rain"
)

// TestDueIndex: a marked sub-pool is due once the time given has passed;
// marking it again keeps the time the reaper set, unless the mark is a
// spill's transfer's and asks for a sooner one; a reaper that found
// nothing to do drops it only if nobody marked it since it read it, nor
// within DueQuiet before (then it is looked at again once that has
// passed).
//
// On a redis-server and on the try-it mode's embedded shards (miniredis,
// whose Lua returns no value, not nil, from a string.match that finds
// nothing).
func TestDueIndex(t *testing.T) {
	t.Run("redis-server", func(t *testing.T) { testDueIndex(t, newClient(t)) })
	t.Run("embedded", func(t *testing.T) { testDueIndex(t, embeddedClient(t)) })
}

// embeddedClient is a client of an embedded shard, as rain serve's try-it
// mode starts them.
func embeddedClient(t *testing.T) *redis.Client {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { c.Close() })
	return c
}

func testDueIndex(t *testing.T, c *redis.Client) {
	ctx := context.Background()
	a, b := rain.SubPool{Pool: "p", Index: 0}.Keys().Meta, rain.SubPool{Pool: "p", Index: 1, Salt: "7"}.Keys().Meta
	if err := MarkDue(ctx, c, time.Hour, []string{a}); err != nil {
		t.Fatal(err)
	}
	if due, next, err := ReadDue(ctx, c, 0, 10); err != nil || len(due) != 0 || next < 59*time.Minute {
		t.Fatalf("ReadDue = %+v, %v, %v; want nothing due, a in an hour", due, next, err)
	}
	// A mark for a grant keeps a's time; one for a spill's transfer brings
	// it forward (and one for a later time leaves it), as a transfer needs
	// the reaper long before the grants held there fall due.
	if err := MarkDue(ctx, c, 0, []string{a}); err != nil {
		t.Fatal(err)
	}
	if due, next, err := ReadDue(ctx, c, 0, 10); err != nil || len(due) != 0 || next < 59*time.Minute {
		t.Fatalf("after a grant's mark, ReadDue = %+v, %v, %v; want a still in an hour", due, next, err)
	}
	if err := MarkDueSooner(ctx, c, 10*time.Minute, []string{a}); err != nil {
		t.Fatal(err)
	}
	if err := MarkDueSooner(ctx, c, 30*time.Minute, []string{a}); err != nil {
		t.Fatal(err)
	}
	if due, next, err := ReadDue(ctx, c, 0, 10); err != nil || len(due) != 0 || next < 9*time.Minute || next > 10*time.Minute {
		t.Fatalf("after a transfer's marks, ReadDue = %+v, %v, %v; want a in 10 minutes", due, next, err)
	}
	if err := MarkDueSooner(ctx, c, time.Hour, []string{b}); err != nil { // not in the index: added
		t.Fatal(err)
	}
	if n, err := c.ZCard(ctx, DueAt).Result(); err != nil || n != 2 {
		t.Fatalf("%d sub-pools in the index after a transfer's mark of b, %v; want 2", n, err)
	}
	c.ZRem(ctx, DueAt, b)
	c.HDel(ctx, DueGen, b)
	if err := MarkDue(ctx, c, 0, []string{b}); err != nil {
		t.Fatal(err)
	}
	due, _, err := ReadDue(ctx, c, 0, 10)
	if err != nil || len(due) != 1 || due[0].Meta != b {
		t.Fatalf("ReadDue = %+v, %v; want b due", due, err)
	}
	// b had nothing to do, but it was marked a moment ago: it is looked at
	// again once DueQuiet has passed.
	if done, err := DoneDue(ctx, c, due[0], -1); err != nil || done != DueMoved {
		t.Fatalf("DoneDue(b) just after its mark = %v, %v; want moved", done, err)
	}
	if due, next, err := ReadDue(ctx, c, 0, 10); err != nil || len(due) != 0 || next > DueQuiet {
		t.Fatalf("ReadDue = %+v, %v, %v; want b again within %v", due, next, err, DueQuiet)
	}
	// Once quiet: a mark made after the read keeps it, else it leaves.
	if err := c.HSet(ctx, DueGen, b, "1:1000").Err(); err != nil { // its last mark long ago
		t.Fatal(err)
	}
	c.ZAdd(ctx, DueAt, redis.Z{Score: 0, Member: b})
	due, _, _ = ReadDue(ctx, c, 0, 10)
	if err := MarkDue(ctx, c, 0, []string{b}); err != nil {
		t.Fatal(err)
	}
	if done, err := DoneDue(ctx, c, due[0], -1); err != nil || done != DueStays {
		t.Fatalf("DoneDue(b) after a new mark = %v, %v; want it kept due", done, err)
	}
	c.HSet(ctx, DueGen, b, "2:1000")
	due, _, _ = ReadDue(ctx, c, 0, 10)
	if done, err := DoneDue(ctx, c, due[0], -1); err != nil || done != DueLeft {
		t.Fatalf("DoneDue(b) quiet, unmarked since = %v, %v; want it dropped", done, err)
	}
	// A sub-pool with work is looked at again when it says.
	c.ZAdd(ctx, DueAt, redis.Z{Score: 0, Member: a})
	due, _, _ = ReadDue(ctx, c, 0, 10)
	if done, err := DoneDue(ctx, c, due[0], time.Minute); err != nil || done != DueMoved {
		t.Fatalf("DoneDue(a, a minute) = %v, %v", done, err)
	}
	if due, next, err := ReadDue(ctx, c, 0, 10); err != nil || len(due) != 0 || next < 59*time.Second || next > time.Minute {
		t.Fatalf("ReadDue = %+v, %v, %v; want a in a minute", due, next, err)
	}
	// Marked while the reaper swept it (a spill's transfer taken after the
	// reaper looked for transfers there), a sub-pool with grants held is
	// looked at again within DueQuiet, not when its grants fall due.
	c.ZAdd(ctx, DueAt, redis.Z{Score: 0, Member: a})
	due, _, _ = ReadDue(ctx, c, 0, 10)
	if err := MarkDueSooner(ctx, c, 2*time.Minute, []string{a}); err != nil {
		t.Fatal(err)
	}
	if done, err := DoneDue(ctx, c, due[0], time.Hour); err != nil || done != DueMoved {
		t.Fatalf("DoneDue(a, an hour) after a mark = %v, %v", done, err)
	}
	if due, next, err := ReadDue(ctx, c, 0, 10); err != nil || len(due) != 0 || next > DueQuiet {
		t.Fatalf("ReadDue = %+v, %v, %v; want a again within %v", due, next, err, DueQuiet)
	}
	// skip passes over due sub-pools a pass could not move.
	c.ZAdd(ctx, DueAt, redis.Z{Score: 0, Member: a}, redis.Z{Score: 1, Member: b})
	if due, _, err := ReadDue(ctx, c, 1, 10); err != nil || len(due) != 1 || due[0].Meta != b {
		t.Fatalf("ReadDue skipping 1 = %+v, %v; want b", due, err)
	}
	if n, _ := c.HLen(ctx, DueGen).Result(); n != 1 {
		t.Fatalf("%d marks counted, want a's only (b's went with it)", n)
	}
	for _, m := range []string{a, b} {
		sp, ok := rain.ParseMeta(m)
		if !ok || sp.Keys().Meta != m {
			t.Fatalf("ParseMeta(%q) = %+v, %v", m, sp, ok)
		}
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

// TestDueKeyNamesAreData: the due index lives under these names on every
// shard; an upgraded rain must find the marks the older one made.
func TestDueKeyNamesAreData(t *testing.T) {
	if DueAt != "rain:{due}:at" || DueGen != "rain:{due}:gen" {
		t.Errorf("due index keys %q, %q, want rain:{due}:at, rain:{due}:gen (the names earlier versions wrote)", DueAt, DueGen)
	}
}
