package settle

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// wallet is the wallet side of a signed webhook, written from the README's
// description alone: it recomputes HMAC-SHA256(secret, t + "." + body),
// compares in constant time, and refuses a t more than 5 minutes off.
type wallet struct {
	secret []byte
	mu     sync.Mutex
	paid   map[string]Grant
	bad    []string
}

func (wl *wallet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if reason := wl.verify(r.Header.Get("Rain-Signature"), body, time.Now()); reason != "" {
		wl.mu.Lock()
		wl.bad = append(wl.bad, reason)
		wl.mu.Unlock()
		http.Error(w, reason, http.StatusUnauthorized)
		return
	}
	var g Grant
	_ = json.Unmarshal(body, &g)
	wl.mu.Lock()
	wl.paid[r.Header.Get("Idempotency-Key")] = g
	wl.mu.Unlock()
}

func (wl *wallet) verify(header string, body []byte, now time.Time) string {
	var ts, sig string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sig == "" {
		return "no signature"
	}
	if d := now.Sub(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return "stale signature"
	}
	mac := hmac.New(sha256.New, wl.secret)
	mac.Write([]byte(ts + "." + string(body)))
	want := mac.Sum(nil)
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, want) {
		return "bad signature"
	}
	return ""
}

// TestWebhookSigned: deliveries carry Rain-Signature, which a wallet that
// knows the secret verifies by its own computation; one signed with another
// secret, an old one replayed, or a body changed in flight is refused.
func TestWebhookSigned(t *testing.T) {
	secret := []byte(strings.Repeat("k", 32))
	wl := &wallet{secret: secret, paid: map[string]Grant{}}
	srv := httptest.NewServer(wl)
	defer srv.Close()
	ctx := context.Background()
	g := Grant{Serial: 42, PoolID: "p", UserID: "u", AmountCents: 123}
	if err := deliverOne(ctx, &Webhook{URL: srv.URL, Secret: secret}, g); err != nil {
		t.Fatalf("signed delivery: %v (wallet said %v)", err, wl.bad)
	}
	if wl.paid["42"] != g {
		t.Fatalf("wallet paid %+v, want %+v", wl.paid["42"], g)
	}

	wrong := &Webhook{URL: srv.URL, Secret: []byte(strings.Repeat("x", 32)), Tries: 1}
	if err := deliverOne(ctx, wrong, Grant{Serial: 43, AmountCents: 1}); err == nil {
		t.Fatal("a delivery signed with another secret was accepted")
	}
	unsigned := &Webhook{URL: srv.URL, Tries: 1}
	if err := deliverOne(ctx, unsigned, Grant{Serial: 44, AmountCents: 1}); err == nil {
		t.Fatal("an unsigned delivery was accepted")
	}
	body, _ := json.Marshal(g)
	old := Sign(secret, time.Now().Add(-10*time.Minute), body)
	if reason := wl.verify(old, body, time.Now()); reason != "stale signature" {
		t.Fatalf("a 10-minute-old signature: %q, want stale", reason)
	}
	fresh := Sign(secret, time.Now(), body)
	if reason := wl.verify(fresh, []byte(strings.Replace(string(body), "123", "999", 1)), time.Now()); reason != "bad signature" {
		t.Fatalf("a changed body: %q, want bad signature", reason)
	}
	if len(wl.paid) != 1 {
		t.Fatalf("wallet paid %d deliveries, want only the signed one", len(wl.paid))
	}
}
