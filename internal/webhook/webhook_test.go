package webhook

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"rain/internal/settle"
)

// deliverOne delivers one grant to w.
func deliverOne(ctx context.Context, w *Wallet, g settle.Grant) error {
	return w.Deliver(ctx, []settle.Grant{g})[0]
}

// TestWebhookConflictIsNotRetried: a wallet that saw the serial with
// another grant answers 409; Deliver returns settle.ErrSerialConflict at once.
func TestWebhookConflictIsNotRetried(t *testing.T) {
	var mu sync.Mutex
	tries := 0
	wallet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		tries++
		mu.Unlock()
		http.Error(w, "key reused", http.StatusConflict)
	}))
	defer wallet.Close()
	err := deliverOne(context.Background(), &Wallet{URL: wallet.URL, Backoff: time.Millisecond}, settle.Grant{Serial: 1, PoolID: "p", UserID: "u", AmountCents: 5})
	if !errors.Is(err, settle.ErrSerialConflict) {
		t.Fatalf("Deliver to a wallet answering 409 = %v, want settle.ErrSerialConflict", err)
	}
	if tries != 1 {
		t.Fatalf("%d tries, want 1: a conflict is not retried", tries)
	}
}
