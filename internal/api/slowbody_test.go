package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"rain/internal/grab"
	"rain/internal/pool"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// slowBodies sends n requests that give the headers of a grab with
// Content-Length: 60 and hold the body back, each on a connection of its
// own, as a slow-body attack does. The connections close when the test
// ends.
func slowBodies(t *testing.T, addr string, n int) {
	t.Helper()
	conns := make([]net.Conn, n)
	var wg sync.WaitGroup
	var failed atomic.Int64
	const dialers = 8
	for d := range dialers {
		wg.Go(func() {
			for i := d; i < n; i += dialers {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					failed.Add(1)
					continue
				}
				conns[i] = c
				_, _ = io.WriteString(c, "POST /grab HTTP/1.1\r\nHost: rain\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n")
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	})
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of the slow-body connections could not be opened", n)
	}
}

// TestSlowBodiesTakeNoPlace: 2,000 connections send the headers of a grab
// and hold the body back while 50 users grab. The worker pool has ~1,056
// places at rest (32 workers and a queue of 1,024): a grab that took its
// place before its body came would leave none, and every real user would
// be shed 503. Every real user is granted, as without them, and the slow
// requests are all still waiting for their bodies (their connections all
// open), at the cost of their own connections.
func TestSlowBodiesTakeNoPlace(t *testing.T) {
	const slow, users = 2000, 50
	s := newStack(t, 2, redistest.Options{}, func(cfg *Config) {
		cfg.GrabBodyTimeout = time.Minute // the slow ones outlast the test
		cfg.MaxConns = 4 * slow           // the cap is not what this tests
	})
	s.preload(t, `{"pool_id":"p","total_cents":100000,"count":1000}`)
	slowBodies(t, s.api.Addr().String(), slow)
	waittest.Until(t, 30*time.Second, "every slow connection open", func() bool { open, _ := s.api.Connections(); return open >= slow })

	var wg sync.WaitGroup
	answers := make([]string, users)
	for u := range users {
		wg.Go(func() {
			body := fmt.Sprintf(`{"pool_id":"p","user_id":"real%d"}`, u)
			resp, err := s.client.Post(s.url+"/grab", "application/json", strings.NewReader(body))
			if err != nil {
				answers[u] = err.Error()
				return
			}
			defer resp.Body.Close()
			var m map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&m)
			answers[u] = fmt.Sprintf("%d %v", resp.StatusCode, m["status"])
		})
	}
	wg.Wait()
	for u, a := range answers {
		if a != "200 granted" {
			t.Errorf("real user %d among %d slow bodies: %s, want 200 granted as without them", u, slow, a)
		}
	}
	if open, _ := s.api.Connections(); open < slow {
		t.Errorf("%d connections open, want the %d slow ones still waiting for their bodies (none answered, none holding a place)", open, slow)
	}
	if st := s.scrape(t); st[`rain_grabs_total{status="overloaded"}`] != 0 {
		t.Errorf("%v grabs shed or refused 503 with slow bodies open, want none", st[`rain_grabs_total{status="overloaded"}`])
	}
	s.assertAudit(t, "p")
}

// TestGrabBodyDeadline: a body that does not arrive within the body
// timeout is answered 400 invalid, saying so, and its connection closed;
// one that arrives in pieces within it is granted; and once a body is in,
// its deadline is lifted: a grab that takes longer than the body timeout
// to run is answered (not taken for a client gone), and the connection
// then serves another request after idling longer than it.
func TestGrabBodyDeadline(t *testing.T) {
	// The pieces of a body come timeout/10 apart: a busy machine's late
	// sleeps stay far within the deadline.
	const timeout = time.Second
	g := heldGrab{entered: make(chan struct{}, 1), release: make(chan struct{})}
	s := newStack(t, 1, redistest.Options{}, func(cfg *Config) {
		cfg.GrabBodyTimeout = timeout
		g.Grabber = cfg.Grabber
		cfg.Grabber = g
		workers, err := pool.New(pool.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { workers.Close(5 * time.Second) })
		cfg.Runner = workers
	})
	s.preload(t, `{"pool_id":"p","total_cents":1000,"count":10}`)
	addr := s.api.Addr().String()
	send := func(c net.Conn, parts ...string) {
		t.Helper()
		for i, p := range parts {
			if i > 0 {
				time.Sleep(timeout / 10)
			}
			if _, err := io.WriteString(c, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	head := func(body string) string {
		return fmt.Sprintf("POST /grab HTTP/1.1\r\nHost: rain\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	}
	read := func(br *bufio.Reader) (int, map[string]any) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}

	// Half a body, then nothing.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"pool_id":"p","user_id":"held"}`
	start := time.Now()
	send(c, head(body)+body[:10])
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	code, m := read(br)
	took := time.Since(start)
	if code != 400 || m["status"] != "invalid" || !strings.Contains(fmt.Sprint(m["error"]), "did not arrive within") {
		t.Fatalf("a body held back = %d %v, want 400 invalid saying it did not arrive in time", code, m)
	}
	if took < timeout {
		t.Fatalf("a body held back was refused after %v, before its deadline %v", took, timeout)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the refusal the connection reads %v, want it closed (EOF)", err)
	}

	// A body in three pieces, each within the deadline, on a connection
	// kept alive; the grab itself runs longer than the body timeout.
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetReadDeadline(time.Now().Add(20 * time.Second))
	br2 := bufio.NewReader(c2)
	body = `{"pool_id":"p","user_id":"slow"}`
	send(c2, head(body)+body[:8], body[8:20], body[20:])
	<-g.entered
	time.Sleep(3 * timeout) // the grab outlasts the body's deadline
	close(g.release)
	if code, m := read(br2); code != 200 || m["status"] != "granted" {
		t.Fatalf("a grab that ran longer than the body timeout = %d %v, want 200 granted", code, m)
	}
	time.Sleep(2 * timeout) // idle on the kept-alive connection
	body = `{"pool_id":"p","user_id":"again"}`
	send(c2, head(body)+body)
	if code, m := read(br2); code != 200 || m["status"] != "granted" {
		t.Fatalf("the next grab on the kept-alive connection = %d %v, want 200 granted", code, m)
	}
}

// heldGrab holds the grab of user "slow" until release, then runs it as
// the grab service does: not at all for a client that has gone (its
// context done).
type heldGrab struct {
	Grabber
	entered, release chan struct{}
}

func (g heldGrab) Grab(ctx context.Context, pool, user string) (grab.Result, error) {
	if user == "slow" {
		g.entered <- struct{}{}
		<-g.release
		if err := ctx.Err(); err != nil {
			return grab.Result{}, err
		}
	}
	return g.Grabber.Grab(ctx, pool, user)
}

// TestGrabNeedsJSON: POST /grab takes an application/json body only. A
// hostile web page can make its visitors' browsers POST a text/plain or
// form body anywhere without asking (a "simple" request), but not an
// application/json one: that takes a CORS preflight rain never answers.
// Anything else is refused 400 before the body is read, and grants
// nothing.
func TestGrabNeedsJSON(t *testing.T) {
	s := newStack(t, 1, redistest.Options{})
	s.preload(t, `{"pool_id":"p","total_cents":1000,"count":10}`)
	body := `{"pool_id":"p","user_id":"victim"}`
	for _, c := range []struct {
		contentType string
		code        int
	}{
		{"text/plain", 400}, {"text/plain;charset=UTF-8", 400}, {"application/x-www-form-urlencoded", 400},
		{"multipart/form-data; boundary=x", 400}, {"", 400}, {"application/json-patch+json", 400}, {"json", 400},
		{"application/json", 200}, {"application/json; charset=utf-8", 200}, {"Application/JSON", 200},
		{"application/j\u017fon", 400}, {"application/json ", 200}, {"APPLICATION/JSON", 200},
	} {
		req, _ := http.NewRequest("POST", s.url+"/grab", strings.NewReader(body))
		if c.contentType != "" {
			req.Header.Set("Content-Type", c.contentType)
		}
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Fatalf("Content-Type %q = %d %v, want %d", c.contentType, resp.StatusCode, m, c.code)
		}
		if c.code == 400 && (m["status"] != "invalid" || !strings.Contains(fmt.Sprint(m["error"]), "application/json")) {
			t.Fatalf("Content-Type %q = %v, want invalid saying the body must be application/json", c.contentType, m)
		}
	}
	st := s.do(t, "GET", "/admin/pools/p", token, "")
	if num(st.Body["held_count"]) != 1 {
		t.Fatalf("held %v after the refusals and one JSON grab, want 1", st.Body["held_count"])
	}
}
