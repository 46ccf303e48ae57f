package api

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"rain/internal/ledger"
	"rain/internal/redistest"
	"rain/internal/settle"
	"rain/internal/wait/waittest"
)

// settleInBackground runs a settlement worker on the stack's shards into a
// ledger file until the test ends.
func (s *stack) settleInBackground(t *testing.T) {
	t.Helper()
	l, err := ledger.Open(filepath.Join(t.TempDir(), "ledger.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	w := settle.New(s.shards, s.cat, l, settle.Config{Consumer: "test", Block: 50 * time.Millisecond,
		Refresh: 50 * time.Millisecond, RetryDelay: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		l.Close()
	})
}

// TestEndAndClose: the operator's end and close of a pool over HTTP. A
// close answers 409 with what keeps the pool open (its window, the grants
// held, the entries unsettled) and changes nothing; an end answers the
// status (idempotent) and grabs answer ended; once settled, the close
// answers the final account, and the pool's status, audit, end and close
// answer from it ever after, a grab ended, a preload of its id 409.
func TestEndAndClose(t *testing.T) {
	s := newStack(t, 2, redistest.Options{})
	s.preload(t, `{"pool_id":"eve","total_cents":10000,"count":100,"sub_pools":2}`)
	var granted int64
	for i := range 10 {
		r := s.grab(t, "eve", fmt.Sprintf("u%d", i))
		if r.Code != 200 || r.Body["status"] != "granted" {
			t.Fatalf("grab = %d %v", r.Code, r.Body)
		}
		granted += num(r.Body["amount_cents"])
	}
	closeIt := func() response { t.Helper(); return s.do(t, "POST", "/admin/pools/eve/close", token, "") }
	refused := func(want string) {
		t.Helper()
		if r := closeIt(); r.Code != 409 || !strings.Contains(fmt.Sprint(r.Body["error"]), want) {
			t.Fatalf("close = %d %v, want 409 naming %q", r.Code, r.Body, want)
		}
		if st := s.do(t, "GET", "/admin/pools/eve", token, ""); st.Body["state"] != "open" && st.Body["state"] != "ended" {
			t.Fatalf("status after a refused close = %v", st.Body)
		}
	}
	refused("window open")
	for range 2 {
		if r := s.do(t, "POST", "/admin/pools/eve/end", token, ""); r.Code != 200 || r.Body["state"] != "ended" {
			t.Fatalf("end = %d %v, want 200 ended", r.Code, r.Body)
		}
	}
	if r := s.grab(t, "eve", "late"); r.Code != 410 || r.Body["status"] != "ended" {
		t.Fatalf("grab after the end = %d %v, want 410 ended", r.Code, r.Body)
	}
	refused("grants held")
	s.settleInBackground(t)
	var account map[string]any
	waittest.Until(t, 20*time.Second, "the pool closes once settlement has confirmed and acknowledged every grant", func() bool {
		r := closeIt()
		account = r.Body
		return r.Code == 200
	})
	if account["state"] != "closed" || num(account["preloaded_count"]) != 100 || num(account["preloaded_cents"]) != 10000 ||
		num(account["confirmed_count"]) != 10 || num(account["confirmed_cents"]) != granted ||
		num(account["unclaimed_count"]) != 90 || num(account["unclaimed_cents"]) != 10000-granted {
		t.Fatalf("account %v; want 100 preloaded, 10 confirmed (%d cents), 90 unclaimed", account, granted)
	}
	if subs, _ := account["sub_pools"].([]any); len(subs) != 2 {
		t.Fatalf("account's sub-pools %v, want 2", account["sub_pools"])
	}
	for _, r := range []response{closeIt(), s.do(t, "GET", "/admin/pools/eve", token, ""), s.do(t, "POST", "/admin/pools/eve/end", token, "")} {
		if r.Code != 200 || !reflect.DeepEqual(r.Body, account) {
			t.Fatalf("after the close = %d %v; want 200 with the account %v", r.Code, r.Body, account)
		}
	}
	s.assertAudit(t, "eve")
	if r := s.grab(t, "eve", "u1"); r.Code != 410 || r.Body["status"] != "ended" {
		t.Fatalf("grab of a closed pool = %d %v, want 410 ended", r.Code, r.Body)
	}
	if r := s.do(t, "POST", "/admin/pools", token, `{"pool_id":"eve","total_cents":10000,"count":100,"sub_pools":2}`); r.Code != 409 {
		t.Fatalf("preload of a closed pool's id = %d %v, want 409", r.Code, r.Body)
	}
	list := s.do(t, "GET", "/admin/pools", token, "")
	if b, _ := json.Marshal(list.Body); !strings.Contains(string(b), `"eve"`) {
		t.Fatalf("/admin/pools = %s; want the closed pool listed", b)
	}
}

// TestEndAndCloseBadInput: an unknown pool is 404, a bad id 400, no token
// 401, for both.
func TestEndAndCloseBadInput(t *testing.T) {
	s := newStack(t, 1, redistest.Options{})
	for _, op := range []string{"end", "close"} {
		for _, c := range []struct {
			path, auth string
			code       int
		}{{"/admin/pools/nope/" + op, token, 404}, {"/admin/pools/a%20b/" + op, token, 400}, {"/admin/pools/nope/" + op, "", 401}} {
			if r := s.do(t, "POST", c.path, c.auth, ""); r.Code != c.code || r.Body["error"] == nil {
				t.Errorf("POST %s = %d %v, want %d with a reason", c.path, r.Code, r.Body, c.code)
			}
		}
	}
}
