package limit

import (
	"runtime"
	"strconv"
	"testing"
	"time"
)

func TestBucket(t *testing.T) {
	l := New(Config{Rate: 10, Burst: 3})
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		if ok, _ := l.Allow("u", t0); !ok {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	ok, wait := l.Allow("u", t0)
	if ok || wait != 100*time.Millisecond {
		t.Fatalf("4th at once = %v, retry after %v; want refused, 100ms", ok, wait)
	}
	if ok, _ := l.Allow("other", t0); !ok {
		t.Fatal("another key was refused: buckets are per key")
	}
	if ok, _ := l.Allow("u", t0.Add(50*time.Millisecond)); ok {
		t.Fatal("allowed after half a token's time")
	}
	if ok, _ := l.Allow("u", t0.Add(100*time.Millisecond)); !ok {
		t.Fatal("refused after a token's time")
	}
	// Over a long run the rate holds: 10/s for 10 s plus the burst.
	allowed := 0
	for ms := 0; ms < 10_000; ms++ {
		if ok, _ := l.Allow("steady", t0.Add(time.Duration(ms)*time.Millisecond)); ok {
			allowed++
		}
	}
	if allowed < 100 || allowed > 103 {
		t.Fatalf("allowed %d in 10 s at 1000 tries/s, want 100 + the burst of 3", allowed)
	}
}

// TestBoundedMemory: a flood of a million distinct keys keeps at most
// MaxKeys of them, and the heap stays within a few MB of that, while a key
// that keeps asking stays limited.
func TestBoundedMemory(t *testing.T) {
	const maxKeys = 100_000
	l := New(Config{Rate: 1, Burst: 2, MaxKeys: maxKeys})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	t0 := time.Unix(1000, 0)
	refusedHot := 0
	for i := range 1_000_000 {
		now := t0.Add(time.Duration(i) * time.Microsecond) // 1M keys in 1 s
		l.Allow("bot-"+strconv.Itoa(i), now)
		if i%1000 == 0 {
			if ok, _ := l.Allow("hot", now); !ok {
				refusedHot++
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if n := l.Len(); n > maxKeys {
		t.Fatalf("%d keys held after 1M distinct, want at most %d", n, maxKeys)
	}
	grew := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("1M distinct keys: %d held, heap grew %.1f MB", l.Len(), float64(grew)/1e6)
	if grew > 32<<20 {
		t.Fatalf("heap grew %d MB for %d keys, want under 32 MB", grew>>20, maxKeys)
	}
	if refusedHot < 900 {
		t.Fatalf("the hot key was refused %d times of 1000 at 1000/s against 1/s, want nearly all", refusedHot)
	}
}

// TestPeek: Peek says what Allow would, and takes nothing: a key unseen
// has a full bucket; an empty bucket says how long until a token.
func TestPeek(t *testing.T) {
	l := New(Config{Rate: 10, Burst: 2})
	t0 := time.Unix(1000, 0)
	for range 5 {
		if ok, _ := l.Peek("u", t0); !ok {
			t.Fatal("Peek of a key unseen = false, want a full bucket")
		}
	}
	l.Allow("u", t0)
	l.Allow("u", t0)
	if ok, wait := l.Peek("u", t0); ok || wait != 100*time.Millisecond {
		t.Fatalf("Peek of an empty bucket = %v, %v; want false, 100ms", ok, wait)
	}
	if ok, _ := l.Peek("u", t0.Add(100*time.Millisecond)); !ok {
		t.Fatal("Peek after a token's time = false")
	}
	if ok, _ := l.Allow("u", t0.Add(100*time.Millisecond)); !ok {
		t.Fatal("Allow after Peek said yes = false: Peek took the token")
	}
}
