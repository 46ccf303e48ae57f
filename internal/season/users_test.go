package season

// This file is the users: grabs over HTTP against the rain serve
// instances, retried as a client retries until it has an answer, and
// what every user was told.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// grant is what a user was told: granted (or already_granted) this amount
// under this serial.
type grant struct {
	Pool, User     string
	Serial, Amount int64
}

// users grabs for the test's users and keeps what each was told.
type users struct {
	client *http.Client
	serves []*proc
	next   atomic.Uint64 // round robin over serves

	mu       sync.Mutex       // guards the fields below
	told     map[string]grant // by pool + " " + user
	answers  map[string]int   // final answers by status
	lat      []time.Duration  // every answered request since the last cut
	problems []string         // answers that break a rule
}

func newUsers(serves []*proc) *users {
	return &users{client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		serves: serves, told: map[string]grant{}, answers: map[string]int{}}
}

// base is the URL of a serve instance that is up, round robin.
func (u *users) base() string {
	for range 2 * len(u.serves) {
		if a := u.serves[u.next.Add(1)%uint64(len(u.serves))].Addr(); a != "" {
			return "http://" + a
		}
	}
	return ""
}

// do sends one request to an instance that is up; code 0 when it got no
// answer (the instance died, or none is up).
func (u *users) do(ctx context.Context, method, path, token, body string) (int, []byte, time.Duration) {
	base := u.base()
	if base == "" {
		return 0, nil, 0
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader([]byte(body)))
	if err != nil {
		return 0, nil, 0
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	start := time.Now()
	resp, err := u.client.Do(req)
	if err != nil {
		return 0, nil, 0
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, 0
	}
	return resp.StatusCode, b, time.Since(start)
}

// grab grabs pool for user until it has a final answer (a 503, a reset, a
// dead instance: tried again, on the other instance too, as a client
// retries) and returns its status. A grant is recorded as told; a user
// told two different grants in one pool is a problem.
func (u *users) grab(ctx context.Context, pool, user string) string {
	body := fmt.Sprintf(`{"pool_id":%q,"user_id":%q}`, pool, user)
	for ctx.Err() == nil {
		code, b, took := u.do(ctx, "POST", "/grab", "", body)
		if code == 0 || code == http.StatusServiceUnavailable || code == http.StatusTooEarly || code == http.StatusTooManyRequests {
			if code != 0 {
				u.note(took)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		u.note(took)
		var a struct {
			Status string `json:"status"`
			Amount int64  `json:"amount_cents"`
			Serial int64  `json:"serial"`
		}
		if err := json.Unmarshal(b, &a); err != nil {
			u.problem("grab %s %s: %d %q", pool, user, code, b)
			return "error"
		}
		u.mu.Lock()
		u.answers[a.Status]++
		if a.Status == "granted" || a.Status == "already_granted" {
			g := grant{Pool: pool, User: user, Serial: a.Serial, Amount: a.Amount}
			key := pool + " " + user
			if had, ok := u.told[key]; ok && had != g {
				u.problems = append(u.problems, fmt.Sprintf("user %s of %s told %+v, then %+v", user, pool, had, g))
			}
			u.told[key] = g
		}
		u.mu.Unlock()
		switch a.Status {
		case "granted", "already_granted", "sold_out", "ended":
			return a.Status
		}
		u.problem("grab %s %s: %d %q", pool, user, code, b)
		return a.Status
	}
	return "cancelled"
}

// note keeps the time one request took.
func (u *users) note(d time.Duration) {
	u.mu.Lock()
	u.lat = append(u.lat, d)
	u.mu.Unlock()
}

func (u *users) problem(format string, a ...any) {
	u.mu.Lock()
	u.problems = append(u.problems, fmt.Sprintf(format, a...))
	u.mu.Unlock()
}

// cut returns the requests answered since the last cut and their p99.
func (u *users) cut() (n int, p99 time.Duration) {
	u.mu.Lock()
	lat := u.lat
	u.lat = nil
	u.mu.Unlock()
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	return len(lat), lat[(len(lat)*99)/100]
}

// granted is what the users of pool were told, by serial.
func (u *users) granted(pool string) map[int64]grant {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[int64]grant{}
	for _, g := range u.told {
		if pool == "" || g.Pool == pool {
			out[g.Serial] = g
		}
	}
	return out
}

// admin sends an operator request until an instance answers it (not 503,
// not a reset), and returns the answer.
func (u *users) admin(ctx context.Context, method, path, token, body string) (int, []byte) {
	for ctx.Err() == nil {
		code, b, _ := u.do(ctx, method, path, token, body)
		if code != 0 && code != http.StatusServiceUnavailable {
			return code, b
		}
		time.Sleep(200 * time.Millisecond)
	}
	return 0, nil
}
