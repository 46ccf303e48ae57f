package settle

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"rain/internal/wait"
)

// ErrSerialConflict is returned by a Sink when a grant's serial was paid
// before for another pool, sub-pool, user or amount: serials are unique, so
// one of the two is wrong (a serial handed out twice, a shard that lost
// writes). It is an alarm, never a silent skip: the worker leaves the entry
// pending and counts it.
var ErrSerialConflict = errors.New("settle: serial already paid for another grant")

// Ledger is a Sink that appends one JSON line per grant to a file and fsyncs
// it before Deliver returns. It holds exactly one line per serial, across
// redeliveries and crashes: it reads the serials already in the file when it
// opens, and cuts off a torn last line a crash may have left (that grant is
// then delivered again and written whole). A serial already in the file
// with other contents is ErrSerialConflict.
//
// A ledger file dedupes only what it holds: two settle workers with two
// ledgers would each pay a grant one of them took over from the other.
// Run one worker per ledger file, or use a sink that dedupes across workers
// (the wallet webhook, keyed by serial).
type Ledger struct {
	mu   sync.Mutex      // guards f and seen
	f    *os.File        // opened for append
	seen map[int64]Grant // the grants in the file, by serial
}

// ledgerLine is one line of the ledger.
type ledgerLine struct {
	Grant
	SettledAt time.Time `json:"settled_at"`
}

// OpenLedger opens or creates the ledger at path.
func OpenLedger(path string) (*Ledger, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	l := &Ledger{f: f, seen: map[int64]Grant{}}
	if err := l.load(); err != nil {
		f.Close()
		return nil, err
	}
	return l, nil
}

// load reads the serials in the file and truncates a torn tail.
func (l *Ledger) load() error {
	grants, good, err := readLines(l.f)
	if err != nil {
		return err
	}
	l.seen = grants
	if err := l.f.Truncate(good); err != nil {
		return fmt.Errorf("ledger: truncate torn tail: %w", err)
	}
	if _, err := l.f.Seek(good, io.SeekStart); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	return nil
}

// ReadLedger reads the grants of the ledger at path by serial, ignoring a
// torn last line. A serial on two lines is an error: the ledger holds one
// line per serial.
func ReadLedger(path string) (map[int64]Grant, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	defer f.Close()
	grants, _, err := readLines(f)
	return grants, err
}

// readLines reads whole ledger lines from r and returns their grants by
// serial and the bytes they take; a tail without a newline is torn and not
// counted.
func readLines(r io.Reader) (map[int64]Grant, int64, error) {
	br := bufio.NewReader(r)
	grants := map[int64]Grant{}
	var good int64
	for {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return grants, good, nil
		}
		if err != nil {
			return nil, 0, fmt.Errorf("ledger: read: %w", err)
		}
		var ll ledgerLine
		if jerr := json.Unmarshal(line, &ll); jerr != nil || ll.Serial == 0 {
			return nil, 0, fmt.Errorf("ledger: line at byte %d is not a ledger line: %q", good, bytes.TrimSpace(line))
		}
		if _, dup := grants[ll.Serial]; dup {
			return nil, 0, fmt.Errorf("ledger: serial %d on two lines (the second at byte %d)", ll.Serial, good)
		}
		grants[ll.Serial] = ll.Grant
		good += int64(len(line))
	}
}

// Deliver appends the grants of gs whose serials the ledger lacks, all in
// one write and one fsync: a grant already there (or twice in gs) is a
// repeat, another grant under a serial there ErrSerialConflict.
func (l *Ledger) Deliver(_ context.Context, gs []Grant) []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	errs := make([]error, len(gs))
	var buf []byte
	var added []Grant
	now := time.Now().UTC()
	for i, g := range gs {
		if had, ok := l.seen[g.Serial]; ok {
			if !had.Same(g) {
				errs[i] = fmt.Errorf("%w: serial %d was paid for %s, now %s", ErrSerialConflict, g.Serial, had, g)
			}
			continue
		}
		b, err := json.Marshal(ledgerLine{Grant: g, SettledAt: now})
		if err != nil {
			errs[i] = err
			continue
		}
		buf = append(append(buf, b...), '\n')
		l.seen[g.Serial] = g // a second copy in gs is a repeat of this one
		added = append(added, g)
	}
	if len(added) == 0 {
		return errs
	}
	err := l.append(buf)
	if err == nil {
		return errs
	}
	for _, g := range added {
		delete(l.seen, g.Serial)
	}
	for i := range gs {
		if errs[i] == nil {
			errs[i] = err // delivered again later; what was written is read back at open
		}
	}
	return errs
}

// append writes buf and fsyncs it; a write that fails midway is cut off
// (the file ends on a whole line again). l.mu is held.
func (l *Ledger) append(buf []byte) error {
	end, err := l.f.Seek(0, io.SeekCurrent)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if _, err := l.f.Write(buf); err != nil {
		_ = l.f.Truncate(end)
		_, _ = l.f.Seek(end, io.SeekStart)
		return fmt.Errorf("ledger: write: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("ledger: fsync: %w", err)
	}
	return nil
}

// Close closes the file.
func (l *Ledger) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}

// Webhook is a Sink that POSTs each grant as JSON to a wallet URL, with the
// serial in an Idempotency-Key header: the wallet dedupes by serial, across
// every settle worker, and must compare the body of a repeated key with the
// first: the same grant is answered 2xx again (already paid), another grant
// under the same serial 409 Conflict, which Deliver returns as
// ErrSerialConflict without retrying. Any other answer but 2xx is retried,
// Tries times in all, after a backoff that doubles from Backoff up to
// MaxBackoff, each wait drawn at random between half and all of it (so
// that workers retrying at once spread out); a 429 or 503 with Retry-After
// waits what the wallet asks instead, up to maxRetryAfter (asked for more,
// Deliver gives up on this grant for now). Then Deliver fails and the
// worker delivers the grant again later.
type Webhook struct {
	URL    string
	Client *http.Client // default: a client with a 10s timeout
	// Secret, when set, signs every delivery: the header
	// Rain-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">
	// (see Sign). The wallet recomputes it and refuses a delivery whose
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

var defaultWebhookClient = &http.Client{Timeout: 10 * time.Second}

// webhookParallel is how many deliveries of a batch are in flight at once.
const webhookParallel = 8

// Deliver posts every grant of gs, webhookParallel at once, each until the
// wallet answers 2xx or its tries run out.
func (w *Webhook) Deliver(ctx context.Context, gs []Grant) []error {
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
func (w *Webhook) deliver(ctx context.Context, g Grant) error {
	client, tries, backoff, most := w.Client, w.Tries, w.Backoff, w.MaxBackoff
	if client == nil {
		client = defaultWebhookClient
	}
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
		if last == nil || errors.Is(last, ErrSerialConflict) {
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

func (w *Webhook) post(ctx context.Context, client *http.Client, body []byte, serial int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", strconv.FormatInt(serial, 10))
	if len(w.Secret) > 0 {
		req.Header.Set(SignatureHeader, Sign(w.Secret, time.Now(), body))
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode == http.StatusConflict:
		return fmt.Errorf("%w: serial %d: wallet answered %s", ErrSerialConflict, serial, resp.Status)
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return &walletBusy{status: resp.Status, after: d}
		}
		return fmt.Errorf("wallet answered %s", resp.Status)
	case resp.StatusCode/100 != 2:
		return fmt.Errorf("wallet answered %s", resp.Status)
	}
	return nil
}

// SignatureHeader carries a webhook delivery's signature.
const SignatureHeader = "Rain-Signature"

// Sign is the Rain-Signature value of body sent at now:
// "t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>". Each try is
// signed afresh, so its t is the time it was sent.
func Sign(secret []byte, now time.Time, body []byte) string {
	t := strconv.FormatInt(now.Unix(), 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(t))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "t=" + t + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}
