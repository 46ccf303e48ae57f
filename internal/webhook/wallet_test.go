package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"rain/internal/settle"
	"rain/internal/signature"
)

// wallet is the reference wallet of a signed webhook, as docs/security.md
// tells a wallet to be: it verifies each delivery (signature.Verify: the signature
// over the raw body with its secrets, the time within 5 minutes, the
// Idempotency-Key equal to the signed serial), and pays each serial of the
// signed body once: the same grant again is answered 200 without paying,
// another grant under a paid serial 409.
type wallet struct {
	secrets [][]byte
	mu      sync.Mutex
	paid    map[int64]settle.Grant
	payouts int // times money moved
	bad     []string
	raw     []captured // every delivery as it came in
}

// captured is a delivery as the wire carried it.
type captured struct {
	header http.Header
	body   []byte
}

func newWallet(secrets ...[]byte) *wallet {
	return &wallet{secrets: secrets, paid: map[int64]settle.Grant{}}
}

func (wl *wallet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	wl.mu.Lock()
	defer wl.mu.Unlock()
	wl.raw = append(wl.raw, captured{r.Header.Clone(), body})
	g, err := signature.Verify(r.Header, body, time.Now(), 0, wl.secrets...)
	if err != nil {
		wl.bad = append(wl.bad, err.Error())
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if first, ok := wl.paid[g.Serial]; ok {
		if !first.Same(g) {
			http.Error(w, "serial paid for another grant", http.StatusConflict)
		}
		return // paid before: answered again, not paid again
	}
	wl.paid[g.Serial] = g
	wl.payouts++
}

// TestWebhookSigned: deliveries carry Rain-Signature, which the reference
// wallet verifies by its own computation; one signed with another secret,
// an unsigned one, an old one replayed, or a body changed in flight is
// refused.
func TestWebhookSigned(t *testing.T) {
	secret := []byte(strings.Repeat("k", 32))
	wl := newWallet(secret)
	srv := httptest.NewServer(wl)
	defer srv.Close()
	ctx := context.Background()
	g := settle.Grant{Serial: 42, PoolID: "p", UserID: "u", AmountCents: 123}
	if err := deliverOne(ctx, &Wallet{URL: srv.URL, Secret: secret}, g); err != nil {
		t.Fatalf("signed delivery: %v (wallet said %v)", err, wl.bad)
	}
	if wl.paid[42] != g {
		t.Fatalf("wallet paid %+v, want %+v", wl.paid[42], g)
	}

	wrong := &Wallet{URL: srv.URL, Secret: []byte(strings.Repeat("x", 32)), Tries: 1}
	if err := deliverOne(ctx, wrong, settle.Grant{Serial: 43, AmountCents: 1}); err == nil {
		t.Fatal("a delivery signed with another secret was accepted")
	}
	unsigned := &Wallet{URL: srv.URL, Tries: 1}
	if err := deliverOne(ctx, unsigned, settle.Grant{Serial: 44, AmountCents: 1}); err == nil {
		t.Fatal("an unsigned delivery was accepted")
	}
	body, _ := json.Marshal(g)
	at := func(sig string) http.Header {
		return http.Header{signature.Header: {sig}, "Idempotency-Key": {"42"}}
	}
	old := signature.Sign(secret, time.Now().Add(-10*time.Minute), body)
	if _, err := signature.Verify(at(old), body, time.Now(), 0, secret); !errors.Is(err, signature.ErrStale) {
		t.Fatalf("a 10-minute-old signature: %v, want signature.ErrStale", err)
	}
	fresh := signature.Sign(secret, time.Now(), body)
	if _, err := signature.Verify(at(fresh), []byte(strings.Replace(string(body), "123", "999", 1)), time.Now(), 0, secret); !errors.Is(err, signature.ErrForged) {
		t.Fatalf("a changed body: %v, want signature.ErrForged", err)
	}
	// During a rotation the wallet holds both secrets: either verifies.
	if got, err := signature.Verify(at(fresh), body, time.Now(), 0, []byte(strings.Repeat("n", 32)), secret); err != nil || got != g {
		t.Fatalf("verified with the old secret of two = %+v, %v", got, err)
	}
	if len(wl.paid) != 1 {
		t.Fatalf("wallet paid %d deliveries, want only the signed one", len(wl.paid))
	}
}

// TestReplayWithNewKeysPaysOnce: a delivery captured on the wire and sent
// again with new Idempotency-Keys (the key is not signed) is paid once:
// the wallet pays on the signed serial, and refuses a key that is not it.
// A wallet that paid on the key paid such a delivery once per key.
func TestReplayWithNewKeysPaysOnce(t *testing.T) {
	secret := []byte(strings.Repeat("k", 32))
	wl := newWallet(secret)
	srv := httptest.NewServer(wl)
	defer srv.Close()
	g := settle.Grant{Serial: 7, PoolID: "p", UserID: "u", AmountCents: 500}
	if err := deliverOne(context.Background(), &Wallet{URL: srv.URL, Secret: secret}, g); err != nil {
		t.Fatal(err)
	}
	wl.mu.Lock()
	capturedOne := wl.raw[0]
	wl.mu.Unlock()
	replay := func(key string) int {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL, bytes.NewReader(capturedOne.body))
		req.Header = capturedOne.header.Clone()
		if key == "" {
			req.Header.Del("Idempotency-Key")
		} else {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, key := range []string{"7-again", "8", "9"} {
		if code := replay(key); code != http.StatusUnauthorized {
			t.Errorf("the delivery replayed with Idempotency-Key %q = %d, want 401 (not the signed serial)", key, code)
		}
	}
	for _, key := range []string{"7", ""} {
		if code := replay(key); code != http.StatusOK {
			t.Errorf("the delivery replayed with key %q = %d, want 200 (already paid)", key, code)
		}
	}
	wl.mu.Lock()
	defer wl.mu.Unlock()
	if wl.payouts != 1 || wl.paid[7] != g {
		t.Fatalf("wallet paid %d times (%v), want once: %+v", wl.payouts, wl.paid, g)
	}
}

// TestWebhookRefusesRedirects: a wallet URL that answers 307 or 308 with
// a Location elsewhere does not get the delivery sent on there (Go's
// client would resend the body, its signature and its key): Deliver fails,
// saying so, and the other server sees nothing.
func TestWebhookRefusesRedirects(t *testing.T) {
	var stolen atomic.Int64
	thief := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { stolen.Add(1) }))
	defer thief.Close()
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusFound} {
		redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, thief.URL+"/credit", code)
		}))
		w := &Wallet{URL: redirector.URL, Secret: []byte(strings.Repeat("k", 32)), Tries: 2, Backoff: time.Millisecond}
		err := deliverOne(context.Background(), w, settle.Grant{Serial: 1, PoolID: "p", UserID: "u", AmountCents: 5})
		redirector.Close()
		if err == nil || !strings.Contains(err.Error(), "redirects are not followed") {
			t.Errorf("a %d redirect: Deliver = %v, want an error saying redirects are not followed", code, err)
		}
	}
	if n := stolen.Load(); n != 0 {
		t.Fatalf("the redirect's target got %d deliveries, want none", n)
	}
}
