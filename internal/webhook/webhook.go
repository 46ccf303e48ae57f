// Package webhook is a settlement sink (settle.Sink) on a wallet's HTTP
// endpoint: each grant POSTed as JSON, signed (internal/signature),
// retried with backoff, and paid once by the wallet, which dedupes by the
// signed serial.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"rain/internal/settle"
	"rain/internal/signature"
	"rain/internal/wait"
)

// Wallet is a settle.Sink that POSTs each grant as JSON to a wallet URL: the
// wallet pays each serial once, across every settle worker, reading the
// serial from the signed body (signature.Verify is how; the Idempotency-Key
// header carries the same serial, unsigned, and a wallet must not pay on it
// alone), and compares a repeated serial's grant with the first: the same
// grant is answered 2xx again (already paid), another grant under the same
// serial 409 Conflict, which Deliver returns as settle.ErrSerialConflict
// without retrying. A redirect is not followed (it would carry the body, its
// signature and its key to wherever Location says): it is an answer that is
// not 2xx. Any other answer but 2xx is retried, Tries times in all, after a
// backoff that doubles from Backoff up to MaxBackoff, each wait drawn at
// random between half and all of it (so that workers retrying at once spread
// out); a 429 or 503 with Retry-After waits what the wallet asks instead, up
// to maxRetryAfter (asked for more, Deliver gives up on this grant for now).
// Then Deliver fails and the worker delivers the grant again later.
type Wallet struct {
	URL  string
	HTTP *http.Client // default: a client with a 10s timeout
	// Secret, when set, signs every delivery: the header
	// Rain-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">
	// (see signature.Sign). The wallet recomputes it and refuses a delivery whose
	// signature differs or whose t is too old (a replay).
	Secret []byte
	// Tries per Deliver (default 5); Backoff before the first retry
	// (default 100ms), doubling up to MaxBackoff (default 5s).
	Tries      int
	Backoff    time.Duration
	MaxBackoff time.Duration
}

// maxRetryAfter is the longest Retry-After a delivery waits for; a wallet
// that asks for more is tried again on the worker's next pass.
const maxRetryAfter = 30 * time.Second

var defaultHTTP = &http.Client{Timeout: 10 * time.Second}

// noRedirects is the webhook client's CheckRedirect: the redirect is the
// answer.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// webhookParallel is how many deliveries of a batch are in flight at once.
const webhookParallel = 8

// Deliver posts every grant of gs, webhookParallel at once, each until the
// wallet answers 2xx or its tries run out.
func (w *Wallet) Deliver(ctx context.Context, gs []settle.Grant) []error {
	errs := make([]error, len(gs))
	sem := make(chan struct{}, webhookParallel)
	var wg sync.WaitGroup
	for i, g := range gs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = w.deliver(ctx, g)
		})
	}
	wg.Wait()
	return errs
}

// deliver posts g until the wallet answers 2xx or the tries run out.
func (w *Wallet) deliver(ctx context.Context, g settle.Grant) error {
	client, tries, backoff, most := w.HTTP, w.Tries, w.Backoff, w.MaxBackoff
	if client == nil {
		client = defaultHTTP
	}
	c := *client // the caller's client, with redirects refused
	c.CheckRedirect = noRedirects
	client = &c
	if tries <= 0 {
		tries = 5
	}
	if backoff <= 0 {
		backoff = 100 * time.Millisecond
	}
	if most <= 0 {
		most = 5 * time.Second
	}
	body, err := json.Marshal(g)
	if err != nil {
		return err
	}
	var last error
	for try := range tries {
		if try > 0 {
			d := jitter(backoff)
			var busy *walletBusy
			if errors.As(last, &busy) {
				if busy.after > maxRetryAfter {
					return fmt.Errorf("webhook: %w (longer than %s: tried again later)", last, maxRetryAfter)
				}
				d = busy.after
			}
			_ = wait.For(ctx, d)
			backoff = min(2*backoff, most)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		last = w.post(ctx, client, body, g.Serial)
		if last == nil || errors.Is(last, settle.ErrSerialConflict) {
			return last
		}
	}
	return fmt.Errorf("webhook: %d tries: %w", tries, last)
}

// jitter is a wait drawn at random between half of d and d.
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// walletBusy is a 429 or 503 answer that says when to come back.
type walletBusy struct {
	status string
	after  time.Duration
}

func (e *walletBusy) Error() string {
	return fmt.Sprintf("wallet answered %s, Retry-After %s", e.status, e.after)
}

// retryAfter parses a Retry-After header, in seconds or as an HTTP date,
// at now; ok is false when there is none or it does not parse.
func retryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
		return time.Duration(min(n, 1<<30)) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

func (w *Wallet) post(ctx context.Context, client *http.Client, body []byte, serial int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", strconv.FormatInt(serial, 10))
	if len(w.Secret) > 0 {
		req.Header.Set(signature.Header, signature.Sign(w.Secret, time.Now(), body))
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode == http.StatusConflict:
		return fmt.Errorf("%w: serial %d: wallet answered %s", settle.ErrSerialConflict, serial, resp.Status)
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return &walletBusy{status: resp.Status, after: d}
		}
		return fmt.Errorf("wallet answered %s", resp.Status)
	case resp.StatusCode/100 == 3:
		return fmt.Errorf("wallet answered %s: redirects are not followed (give the URL it redirects to)", resp.Status)
	case resp.StatusCode/100 != 2:
		return fmt.Errorf("wallet answered %s", resp.Status)
	}
	return nil
}
