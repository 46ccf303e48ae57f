package webhook

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"rain/internal/settle"
)

// scriptedWallet is a test wallet answering the deliveries with answers, in turn
// (the last again once they run out), and noting when each came.
type scriptedWallet struct {
	mu      sync.Mutex
	answers []func(http.ResponseWriter)
	at      []time.Time
}

func (wl *scriptedWallet) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	wl.mu.Lock()
	n := len(wl.at)
	wl.at = append(wl.at, time.Now())
	answer := wl.answers[min(n, len(wl.answers)-1)]
	wl.mu.Unlock()
	answer(w)
}

func (wl *scriptedWallet) times() []time.Time {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	return append([]time.Time(nil), wl.at...)
}

func busy(code int, after string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Retry-After", after)
		w.WriteHeader(code)
	}
}

func paid(w http.ResponseWriter) { w.WriteHeader(http.StatusOK) }

// TestWebhookHonoursRetryAfter: a wallet that answers 503 or 429 with
// Retry-After is tried again no sooner than it asked, however short the
// backoff; one that asks for longer than a delivery waits is left for the
// worker's next pass at once, after one try.
func TestWebhookHonoursRetryAfter(t *testing.T) {
	g := settle.Grant{Serial: 7, PoolID: "p", UserID: "u", AmountCents: 5}
	for _, code := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		wl := &scriptedWallet{answers: []func(http.ResponseWriter){busy(code, "1"), paid}}
		srv := httptest.NewServer(wl)
		err := deliverOne(context.Background(), &Wallet{URL: srv.URL, Backoff: time.Millisecond}, g)
		srv.Close()
		at := wl.times()
		if err != nil || len(at) != 2 {
			t.Fatalf("%d with Retry-After 1, then 200: Deliver = %v after %d tries, want paid on the second", code, err, len(at))
		}
		if gap := at[1].Sub(at[0]); gap < 900*time.Millisecond {
			t.Errorf("%d with Retry-After: 1 was tried again after %s, want a second", code, gap)
		}
	}
	wl := &scriptedWallet{answers: []func(http.ResponseWriter){busy(http.StatusServiceUnavailable, "3600"), paid}}
	srv := httptest.NewServer(wl)
	defer srv.Close()
	err := deliverOne(context.Background(), &Wallet{URL: srv.URL, Backoff: time.Millisecond}, g)
	if err == nil || !strings.Contains(err.Error(), "Retry-After") || len(wl.times()) != 1 {
		t.Fatalf("a wallet asking for an hour: Deliver = %v after %d tries; want an error naming Retry-After after one try", err, len(wl.times()))
	}
}

// TestWebhookBackoffIsCappedAndJittered: the waits between tries double
// from Backoff, stop growing at MaxBackoff, and are each drawn between
// half and all of their step.
func TestWebhookBackoffIsCappedAndJittered(t *testing.T) {
	for range 1000 {
		for _, d := range []time.Duration{time.Millisecond, 100 * time.Millisecond, 5 * time.Second} {
			if j := jitter(d); j < d/2 || j > d {
				t.Fatalf("jitter(%s) = %s, want within [%s, %s]", d, j, d/2, d)
			}
		}
	}
	fail := func(w http.ResponseWriter) { w.WriteHeader(http.StatusInternalServerError) }
	wl := &scriptedWallet{answers: []func(http.ResponseWriter){fail}}
	srv := httptest.NewServer(wl)
	defer srv.Close()
	w := &Wallet{URL: srv.URL, Tries: 6, Backoff: 20 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}
	if err := deliverOne(context.Background(), w, settle.Grant{Serial: 1, PoolID: "p", UserID: "u", AmountCents: 1}); err == nil {
		t.Fatal("Deliver to a wallet answering 500 succeeded")
	}
	at := wl.times()
	if len(at) != 6 {
		t.Fatalf("%d tries, want 6", len(at))
	}
	// Steps 20, 40, 40, 40, 40 ms: each wait at least half its step (the
	// upper bounds are the machine's to keep, not a test's).
	var total time.Duration
	for i, step := range []time.Duration{20, 40, 40, 40, 40} {
		gap := at[i+1].Sub(at[i])
		if gap < step*time.Millisecond/2 {
			t.Errorf("wait %d = %s, want at least %s", i+1, gap, step*time.Millisecond/2)
		}
		total += gap
	}
	t.Logf("waits: %s in all (uncapped, the last would have been 320 ms alone)", total)
}

// FuzzRetryAfter: any Retry-After a wallet sends parses to a wait that is
// not negative, or to none; never a panic.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"1", "0", "120", "-5", "Wed, 21 Oct 2015 07:28:00 GMT", "soon", "99999999999999999999", ""} {
		f.Add(s)
	}
	now := time.Unix(1_800_000_000, 0)
	f.Fuzz(func(t *testing.T, v string) {
		if d, ok := retryAfter(v, now); ok && d < 0 {
			t.Fatalf("retryAfter(%q) = %s, want no negative wait", v, d)
		}
	})
}

// TestRetryAfterForms: seconds and HTTP dates.
func TestRetryAfterForms(t *testing.T) {
	now := time.Date(2027, 2, 10, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"3", 3 * time.Second, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"-1", 0, false}, {"later", 0, false}, {"", 0, false},
	} {
		if d, ok := retryAfter(c.in, now); d != c.want || ok != c.ok {
			t.Errorf("retryAfter(%q) = %s, %v; want %s, %v", c.in, d, ok, c.want, c.ok)
		}
	}
}
