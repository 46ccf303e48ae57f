package known

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ids returns n distinct pool ids with a prefix.
func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

func TestOpenUntilFirstReset(t *testing.T) {
	f := New(Config{})
	if !f.MayContain("anything") {
		t.Fatal("MayContain before the first Reset = false, want true (open)")
	}
	f.Add("p1")
	if !f.MayContain("anything") {
		t.Fatal("MayContain after Add, before the first Reset = false, want true (open)")
	}
	f.Reset([]string{"p2"})
	for _, id := range []string{"p1", "p2"} {
		if !f.MayContain(id) {
			t.Errorf("MayContain(%q) after Reset = false, want true", id)
		}
	}
	if f.MayContain("anything") {
		t.Error(`MayContain("anything") after Reset = true, want false`)
	}
}

func TestNoFalseNegatives(t *testing.T) {
	all := ids("pool-", 100_000)
	f := New(Config{})
	f.Reset(all[:99_900])
	for _, id := range all[99_900:] {
		f.Add(id)
	}
	for _, id := range all {
		if !f.MayContain(id) {
			t.Fatalf("MayContain(%q) = false for a member", id)
		}
	}
}

// Adds past the capacity rebuild a larger filter that keeps every id.
func TestGrow(t *testing.T) {
	f := New(Config{MinCapacity: 100})
	base := ids("base-", 50)
	f.Reset(base)
	added := ids("added-", 5_000)
	for i, id := range added {
		f.Add(id)
		// Spot-check while growing: every id so far still passes.
		if i%500 == 0 {
			for _, id := range append(base, added[:i+1]...) {
				if !f.MayContain(id) {
					t.Fatalf("after %d Adds: MayContain(%q) = false", i+1, id)
				}
			}
		}
	}
	if f.capacity < len(base)+len(added) {
		t.Fatalf("capacity = %d, want ≥ %d", f.capacity, len(base)+len(added))
	}
	for _, id := range append(base, added...) {
		if !f.MayContain(id) {
			t.Fatalf("MayContain(%q) = false after growing", id)
		}
	}
}

// Reset keeps the ids Added since the previous Reset (a listing may have
// missed them) and drops them at the second Reset that does not list them.
func TestResetCarriesRecentAdds(t *testing.T) {
	f := New(Config{})
	f.Reset(nil)
	f.Add("new")
	f.Reset([]string{"old"})
	if !f.MayContain("new") {
		t.Fatal(`MayContain("new") after one Reset that missed it = false, want true`)
	}
	f.Reset([]string{"old"})
	if f.MayContain("new") {
		t.Fatal(`MayContain("new") after two Resets that missed it = true, want false`)
	}
	if !f.MayContain("old") {
		t.Fatal(`MayContain("old") = false`)
	}
}

// fpRate measures the false-positive rate of f over n random non-members.
func fpRate(f *Filter, n int) float64 {
	rng := rand.New(rand.NewPCG(1, 2))
	hits := 0
	for range n {
		if f.MayContain("bogus-" + strconv.FormatUint(rng.Uint64(), 36)) {
			hits++
		}
	}
	return float64(hits) / float64(n)
}

func TestFalsePositiveRate(t *testing.T) {
	const probes = 1_000_000
	members := ids("pool-", DefaultMinCapacity)
	f := New(Config{})
	f.Reset(members[:DefaultMinCapacity/2]) // sized for DefaultMinCapacity
	half := fpRate(f, probes)
	for _, id := range members[DefaultMinCapacity/2:] {
		f.Add(id) // up to capacity, not past it: no rebuild
	}
	if f.capacity != DefaultMinCapacity {
		t.Fatalf("capacity = %d, want %d", f.capacity, DefaultMinCapacity)
	}
	full := fpRate(f, probes)
	t.Logf("false positives over %d non-members: %.4f%% at half capacity, %.4f%% at capacity", probes, 100*half, 100*full)
	if full > FalsePositiveRate {
		t.Fatalf("false-positive rate at capacity = %.4f%%, want ≤ %.4f%%", 100*full, 100*FalsePositiveRate)
	}
}

func TestMayContainDoesNotAllocate(t *testing.T) {
	f := New(Config{})
	f.Reset(ids("pool-", 1000))
	long := "a-pool-id-of-sixty-four-bytes-which-is-the-longest-rain-allows!"
	for _, id := range []string{"pool-7", "unknown", long} {
		if n := testing.AllocsPerRun(100, func() { f.MayContain(id) }); n != 0 {
			t.Errorf("MayContain(%q) allocates %v times, want 0", id, n)
		}
	}
}

// Readers, adders and resetters at once, under -race. A base set in every
// Reset must always pass; an Added id must pass until two Resets have
// completed after it (one carries it, the next may drop it).
func TestConcurrent(t *testing.T) {
	f := New(Config{MinCapacity: 64}) // small, so Adds grow the filter
	base := ids("base-", 200)
	f.Reset(base)
	var (
		resets     atomic.Int64
		stop       atomic.Bool
		background sync.WaitGroup // the resetter and the reader, until stop
		adders     sync.WaitGroup
	)
	background.Go(func() {
		for !stop.Load() {
			f.Reset(base)
			resets.Add(1)
		}
	})
	background.Go(func() {
		for !stop.Load() {
			for _, b := range base {
				if !f.MayContain(b) {
					t.Errorf("MayContain(%q) = false for a member of every Reset", b)
					return
				}
			}
		}
	})
	for g := range 4 {
		adders.Go(func() {
			for i := range 2_000 {
				id := "added-" + strconv.Itoa(g) + "-" + strconv.Itoa(i)
				r0 := resets.Load()
				f.Add(id)
				if !f.MayContain(id) && resets.Load()-r0 < 2 {
					t.Errorf("MayContain(%q) = false right after Add, with < 2 Resets since", id)
					return
				}
			}
		})
	}
	adders.Wait()
	stop.Store(true)
	background.Wait()
	if resets.Load() < 2 {
		t.Errorf("only %d Resets interleaved with the Adds", resets.Load())
	}
}
