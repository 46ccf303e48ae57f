package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"rain/internal/auth"
	"rain/internal/catalog"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/metrics"
	"rain/internal/pool"
	"rain/internal/reaper"
	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/wait/waittest"
)

// IgnoreCurrent: ants starts a default pool of its own at init.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreCurrent(), redistest.IgnoreProbe(),
		// fasthttp's clock of the Date header runs for the process; a
		// server's idle-worker sweeper ends within 10 s of its shutdown.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"))
}

const token = "test-token"

// stack is rain's HTTP API over real redis-server shards.
type stack struct {
	servers []*redistest.Server
	shards  *shard.Set
	svc     *grab.Service
	cat     *catalog.Catalog
	api     *Server
	url     string // the listener's, http://127.0.0.1:port
	client  *http.Client
}

// newStack starts n shards and the API on the worker pool; tweak, if not
// nil, may change the config first.
func newStack(t testing.TB, n int, opts redistest.Options, tweak ...func(*Config)) *stack {
	t.Helper()
	e := grabtest.Start(t, n, opts)
	servers, set, svc := e.Servers, e.Shards, e.Service
	workers, err := pool.New(pool.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { workers.Close(5 * time.Second) })
	reg := metrics.New(metrics.Build{Version: "test"})
	reg.Pool(workers.Stats)
	admins, err := auth.NewAdmins(token, "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Grabber: svc, Pools: e.Catalog, Admins: admins, Ready: svc.Ready, Runner: workers, Metrics: reg}
	for _, f := range tweak {
		f(&cfg)
	}
	a := New(cfg)
	url := serve(t, a)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	return &stack{servers: servers, shards: set, svc: svc, cat: e.Catalog, api: a, url: url, client: client}
}

// serve starts a's listener on a free port, as rain serve does, and shuts
// it down when the test ends; it returns the listener's URL.
func serve(t testing.TB, a *Server) string {
	t.Helper()
	if err := a.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- a.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := a.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "http://" + a.Addr().String()
}

// response is a decoded answer.
type response struct {
	Code       int
	RetryAfter string
	Body       map[string]any
}

func (s *stack) do(t testing.TB, method, path, auth, body string) response {
	t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, path, err)
		return response{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := response{Code: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
	if resp.Header.Get("Content-Type") == "application/json" {
		if err := json.Unmarshal(b, &r.Body); err != nil {
			t.Errorf("%s %s: body %q is not JSON: %v", method, path, b, err)
		}
	}
	return r
}

func (s *stack) grab(t testing.TB, pool, user string) response {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"pool_id": pool, "user_id": user})
	return s.do(t, "POST", "/grab", "", string(body))
}

func (s *stack) preload(t testing.TB, body string) response {
	t.Helper()
	r := s.do(t, "POST", "/admin/pools", token, body)
	if r.Code != http.StatusCreated {
		t.Fatalf("POST /admin/pools %s = %d %v, want 201", body, r.Code, r.Body)
	}
	return r
}

func (s *stack) assertAudit(t testing.TB, pool string) {
	t.Helper()
	r := s.do(t, "GET", "/admin/pools/"+pool+"/audit", token, "")
	if r.Code != 200 || r.Body["ok"] != true {
		t.Fatalf("audit of %s = %d %v, want 200 ok", pool, r.Code, r.Body)
	}
}

func num(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

// TestConcurrentGrabs: 2,000 packets, 5,000 users each grabbing twice at once.
func TestConcurrentGrabs(t *testing.T) {
	for _, subPools := range []int{1, 3} {
		t.Run(fmt.Sprintf("sub_pools=%d", subPools), func(t *testing.T) {
			const packets, users, total = 2000, 5000, 1_000_000
			s := newStack(t, 3, redistest.Options{})
			pool := fmt.Sprintf("rain%d", subPools)
			s.preload(t, fmt.Sprintf(`{"pool_id":%q,"total_cents":%d,"count":%d,"sub_pools":%d}`, pool, total, packets, subPools))

			answers := make([][2]response, users)
			var wg sync.WaitGroup
			sem := make(chan struct{}, 64)
			for u := range users {
				for k := range 2 {
					wg.Go(func() {
						sem <- struct{}{}
						defer func() { <-sem }()
						// A client retries 503: with sub-pools, a user's second
						// request answers "retry" while the first takes stock
						// from a sibling.
						for try := 0; ; try++ {
							a := s.grab(t, pool, fmt.Sprintf("user%d", u))
							if a.Code != 503 || try == 100 {
								answers[u][k] = a
								break
							}
							time.Sleep(5 * time.Millisecond)
						}
					})
				}
			}
			wg.Wait()

			counts := map[string]int{}
			serials := map[int64]string{}
			var cents int64
			for u, pair := range answers {
				var grants []response
				for _, a := range pair {
					st, _ := a.Body["status"].(string)
					counts[st]++
					switch st {
					case "granted":
						if a.Code != 200 {
							t.Fatalf("granted with HTTP %d", a.Code)
						}
						grants = append(grants, a)
						cents += num(a.Body["amount_cents"])
						serial := num(a.Body["serial"])
						if other, dup := serials[serial]; dup {
							t.Fatalf("serial %d granted to user%d and %s", serial, u, other)
						}
						serials[serial] = fmt.Sprintf("user%d", u)
					case "already_granted":
						grants = append(grants, a)
					case "sold_out":
						if a.Code != 410 {
							t.Fatalf("sold_out with HTTP %d", a.Code)
						}
					default:
						t.Fatalf("user%d got %d %v", u, a.Code, a.Body)
					}
				}
				if len(grants) == 2 {
					if grants[0].Body["status"] == grants[1].Body["status"] {
						t.Fatalf("user%d: two answers %v and %v, want one granted and one already_granted", u, grants[0].Body, grants[1].Body)
					}
					for _, f := range []string{"amount_cents", "serial", "expires_at"} {
						if grants[0].Body[f] != grants[1].Body[f] {
							t.Fatalf("user%d: repeat differs in %s: %v vs %v", u, f, grants[0].Body, grants[1].Body)
						}
					}
				} else if len(grants) == 1 {
					t.Fatalf("user%d: one grant and one sold_out: %v / %v", u, pair[0].Body, pair[1].Body)
				}
			}
			if counts["granted"] != packets || counts["already_granted"] != packets || counts["sold_out"] != 2*(users-packets) {
				t.Fatalf("answers %v, want %d granted, %d already_granted, %d sold_out", counts, packets, packets, 2*(users-packets))
			}
			if cents != total {
				t.Fatalf("granted cents = %d, want the pool's %d", cents, total)
			}
			s.assertAudit(t, pool)
			st := s.do(t, "GET", "/admin/pools/"+pool, token, "")
			if num(st.Body["remaining_count"]) != 0 || num(st.Body["held_count"]) != packets || num(st.Body["held_cents"]) != total {
				t.Fatalf("status = %v, want 0 remaining, %d held, %d cents held", st.Body, packets, total)
			}
			got := s.scrape(t)
			for status, n := range counts {
				if key := `rain_grabs_total{status="` + status + `"}`; got[key] != float64(n) {
					t.Fatalf("metric %s = %v, want %d", key, got[key], n)
				}
			}
		})
	}
}

func TestEveryStatus(t *testing.T) {
	s := newStack(t, 2, redistest.Options{})
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	ended := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	s.preload(t, `{"pool_id":"one","total_cents":100,"count":1}`)
	s.preload(t, `{"pool_id":"more","total_cents":1000,"count":10}`)
	s.preload(t, fmt.Sprintf(`{"pool_id":"later","total_cents":100,"count":1,"starts_at":%q}`, later))
	s.preload(t, fmt.Sprintf(`{"pool_id":"over","total_cents":100,"count":1,"starts_at":%q,"ends_at":%q}`, past, ended))

	check := func(name string, r response, code int, status string) {
		t.Helper()
		if r.Code != code || r.Body["status"] != status {
			t.Fatalf("%s: %d %v, want %d %s", name, r.Code, r.Body, code, status)
		}
	}
	r := s.grab(t, "one", "a")
	check("first grab", r, 200, "granted")
	if r.Body["pool_id"] != "one" || r.Body["user_id"] != "a" || num(r.Body["amount_cents"]) != 100 || num(r.Body["serial"]) <= 0 {
		t.Fatalf("granted body %v, want pool_id, user_id, amount_cents 100, a serial", r.Body)
	}
	if _, err := time.Parse(time.RFC3339, r.Body["expires_at"].(string)); err != nil {
		t.Fatalf("expires_at %v is not RFC 3339: %v", r.Body["expires_at"], err)
	}
	check("repeat", s.grab(t, "one", "a"), 200, "already_granted")
	check("sold out", s.grab(t, "one", "b"), 410, "sold_out")
	check("unknown pool", s.grab(t, "nope", "a"), 404, "not_found")
	r = s.grab(t, "later", "a")
	check("before start", r, 425, "not_started")
	if r.RetryAfter == "" || r.RetryAfter == "0" {
		t.Fatalf("not_started Retry-After = %q, want seconds until the start", r.RetryAfter)
	}
	check("after end", s.grab(t, "over", "a"), 410, "ended")
	if r := s.grab(t, "one", "b"); r.Body["amount_cents"] != nil || r.Body["serial"] != nil || r.Body["expires_at"] != nil {
		t.Fatalf("sold_out body %v carries grant fields", r.Body)
	}

	// Shards down: overloaded, with Retry-After, nothing granted. (The
	// sold-out pool "one" is answered locally; "more" needs its shard.)
	for _, srv := range s.servers {
		srv.Kill()
	}
	r = s.grab(t, "more", "c")
	check("shards down", r, 503, "overloaded")
	if r.RetryAfter == "" {
		t.Fatal("overloaded without Retry-After")
	}
	// The error says why, and whether anything may have been granted
	// (which of the two depends on the step that met the dead shard).
	if e, _ := r.Body["error"].(string); e != rsUnavailable.text() && e != rsUnknown.text() {
		t.Fatalf("overloaded with the shards down says %q, want %q or %q", e, rsUnavailable.text(), rsUnknown.text())
	}
	if r := s.do(t, "GET", "/readyz", "", ""); r.Code != 503 {
		t.Fatalf("/readyz with shards down = %d, want 503", r.Code)
	}
	if r := s.do(t, "GET", "/healthz", "", ""); r.Code != 200 {
		t.Fatalf("/healthz = %d, want 200 while the process runs", r.Code)
	}
}

func TestBadInput(t *testing.T) {
	s := newStack(t, 1, redistest.Options{})
	s.preload(t, `{"pool_id":"p","total_cents":1000,"count":10}`)
	keysBefore := s.keys(t)

	for _, tc := range []struct{ name, body string }{
		{"empty", ``},
		{"not json", `hello`},
		{"truncated", `{"pool_id":"p","user_id":"u"`},
		{"array", `[{"pool_id":"p","user_id":"u"}]`},
		{"null", `null`},
		{"unknown field", `{"pool_id":"p","user_id":"u","amount":5}`},
		{"two objects", `{"pool_id":"p","user_id":"u"}{"pool_id":"p","user_id":"v"}`},
		{"trailing garbage", `{"pool_id":"p","user_id":"u"} x`},
		{"missing user", `{"pool_id":"p"}`},
		{"missing pool", `{"user_id":"u"}`},
		{"number id", `{"pool_id":"p","user_id":5}`},
		{"empty user", `{"pool_id":"p","user_id":""}`},
		{"space in id", `{"pool_id":"p","user_id":"a b"}`},
		{"brace in pool", `{"pool_id":"p}","user_id":"u"}`},
		{"unicode id", `{"pool_id":"p","user_id":"ü"}`},
		{"65-char id", fmt.Sprintf(`{"pool_id":"p","user_id":%q}`, strings.Repeat("u", 65))},
		{"5 KiB body", fmt.Sprintf(`{"pool_id":"p","user_id":"u","pad":%q}`, strings.Repeat("x", 5<<10))},
		{"5 KiB of spaces", `{"pool_id":"p","user_id":"u"}` + strings.Repeat(" ", 5<<10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := s.do(t, "POST", "/grab", "", tc.body)
			if r.Code != 400 || r.Body["status"] != "invalid" || r.Body["error"] == "" || r.Body["error"] == nil {
				t.Fatalf("POST /grab %.60q = %d %v, want 400 invalid with an error", tc.body, r.Code, r.Body)
			}
		})
	}
	if got := s.scrape(t)[`rain_grabs_total{status="invalid"}`]; got != 18 {
		t.Fatalf("invalid counter = %v, want 18", got)
	}

	// Operator endpoints without the right token: 401, nothing done.
	for _, auth := range []string{"", "wrong", token + "x"} {
		for _, req := range [][2]string{
			{"POST", "/admin/pools"}, {"GET", "/admin/pools/p"}, {"GET", "/admin/pools/p/audit"},
		} {
			r := s.do(t, req[0], req[1], auth, `{"pool_id":"q","total_cents":100,"count":1}`)
			if r.Code != 401 {
				t.Fatalf("%s %s with token %q = %d, want 401", req[0], req[1], auth, r.Code)
			}
		}
	}
	// Bad operator input: 400 with a reason; same id other spec: 409; same spec: 200.
	for _, body := range []string{
		`{"pool_id":"q","total_cents":5,"count":10}`,
		`{"pool_id":"q","total_cents":100,"count":0}`,
		`{"pool_id":"q q","total_cents":100,"count":1}`,
		`{"pool_id":"q","total_cents":100,"count":1,"bogus":1}`,
		`{"pool_id":"q","total_cents":"100","count":1}`,
		`{"pool_id":"q","total_cents":100,"count":1,"starts_at":"tomorrow"}`,
		`{"pool_id":"q","total_cents":100,"count":10,"max_cents":5}`,
	} {
		r := s.do(t, "POST", "/admin/pools", token, body)
		if r.Code != 400 || r.Body["error"] == nil {
			t.Fatalf("POST /admin/pools %s = %d %v, want 400 with an error", body, r.Code, r.Body)
		}
	}
	if got := s.keys(t); got != keysBefore {
		t.Fatalf("keys after bad input = %d, want %d: nothing written", got, keysBefore)
	}
	if r := s.do(t, "POST", "/admin/pools", token, `{"pool_id":"p","total_cents":1000,"count":11}`); r.Code != 409 {
		t.Fatalf("preload of p with another spec = %d %v, want 409", r.Code, r.Body)
	}
	if r := s.do(t, "POST", "/admin/pools", token, `{"pool_id":"p","total_cents":1000,"count":10}`); r.Code != 200 || num(r.Body["count"]) != 10 {
		t.Fatalf("preload of p again = %d %v, want 200 with its status", r.Code, r.Body)
	}
	if r := s.do(t, "GET", "/admin/pools/none", token, ""); r.Code != 404 {
		t.Fatalf("GET /admin/pools/none = %d, want 404", r.Code)
	}
	if r := s.do(t, "GET", "/admin/pools/b%20d", token, ""); r.Code != 400 {
		t.Fatalf("GET /admin/pools/b%%20d = %d, want 400", r.Code)
	}
	if r := s.do(t, "GET", "/grab", "", ""); r.Code != 405 {
		t.Fatalf("GET /grab = %d, want 405", r.Code)
	}
	st := s.do(t, "GET", "/admin/pools/p", token, "")
	if num(st.Body["remaining_count"]) != 10 || num(st.Body["held_count"]) != 0 {
		t.Fatalf("status after bad input = %v, want the pool untouched", st.Body)
	}
}

// keys counts keys on every shard but the serial counter.
func (s *stack) keys(t testing.TB) int {
	t.Helper()
	n := 0
	for _, name := range s.shards.Names() {
		keys, err := s.shards.Client(name).Keys(context.Background(), "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if k != "rain:serial" {
				n++
			}
		}
	}
	return n
}

func TestMetricsFormat(t *testing.T) {
	s := newStack(t, 1, redistest.Options{})
	s.grab(t, "nope", "u")
	got := s.scrape(t)
	for key, want := range map[string]float64{
		`rain_grabs_total{status="not_found"}`:                 1,
		`rain_grabs_total{status="granted"}`:                   0,
		`rain_grab_overloaded_total{reason="shed"}`:            0,
		`rain_grab_overloaded_total{reason="outcome_unknown"}`: 0,
		`rain_grab_duration_seconds_count{status="not_found"}`: 1,
		"rain_pool_capacity":                                   32,
		"rain_pool_shed_total":                                 0,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("/metrics %s = %v (present %v), want %v", key, v, ok, want)
		}
	}
}

// scrape reads GET /metrics with the Prometheus text parser: every sample
// by name{label="value",...} (labels sorted by name).
func (s *stack) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	r, err := s.client.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse as Prometheus text: %v", err)
	}
	out := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			key := name
			if len(m.GetLabel()) > 0 {
				var parts []string
				for _, l := range m.GetLabel() {
					parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				key += "{" + strings.Join(parts, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetUntyped() != nil:
				out[key] = m.GetUntyped().GetValue()
			case m.GetHistogram() != nil:
				out[strings.Replace(key, name, name+"_count", 1)] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// gated wraps the real service: a grab by user "slow" waits for release, one
// by "boom" panics; every other grab goes through.
type gated struct {
	Grabber
	entered chan struct{}
	release chan struct{}
}

func (g gated) Grab(ctx context.Context, pool, user string) (grab.Result, error) {
	switch user {
	case "slow":
		g.entered <- struct{}{}
		<-g.release
	case "boom":
		panic("boom")
	}
	return g.Grabber.Grab(ctx, pool, user)
}

func TestPoolShedsAndRecovers(t *testing.T) {
	g := gated{entered: make(chan struct{}, 1), release: make(chan struct{})}
	var workers *pool.Pool
	s := newStack(t, 1, redistest.Options{}, func(c *Config) {
		var err error
		// One worker, no queue: a second grab while the first runs is shed.
		workers, err = pool.New(pool.Config{Min: 1, Max: 1, Queue: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { workers.Close(5 * time.Second) })
		g.Grabber = c.Grabber
		c.Grabber, c.Runner = g, workers
	})
	s.preload(t, `{"pool_id":"p","total_cents":1000,"count":10}`)

	slow := make(chan response, 1)
	go func() { slow <- s.grab(t, "p", "slow") }()
	<-g.entered
	r := s.grab(t, "p", "u1")
	if r.Code != 503 || r.Body["status"] != "overloaded" || r.RetryAfter == "" {
		t.Fatalf("grab while the pool is full = %d %v (Retry-After %q), want 503 overloaded with Retry-After", r.Code, r.Body, r.RetryAfter)
	}
	if e, _ := r.Body["error"].(string); !strings.Contains(e, "nothing was granted") {
		t.Fatalf("shed grab says %q, want that nothing was granted", e)
	}
	// The body is read before admission (a body held back must hold no
	// place): while the pool is full a malformed body is still answered
	// 400 for what it is.
	if r := s.do(t, "POST", "/grab", "", `{"pool_id":`); r.Code != 400 || r.Body["status"] != "invalid" {
		t.Fatalf("malformed grab while the pool is full = %d %v, want 400 invalid (read before admission)", r.Code, r.Body)
	}
	close(g.release)
	if r := <-slow; r.Code != 200 {
		t.Fatalf("the slow grab = %d %v, want 200", r.Code, r.Body)
	}
	st := s.do(t, "GET", "/admin/pools/p", token, "")
	if num(st.Body["held_count"]) != 1 {
		t.Fatalf("held after one grant and one shed = %v, want 1: the shed grab granted nothing", st.Body)
	}
	// The slow grab's answer is written before its place is given back:
	// wait for the place, or the next grab may be shed instead.
	waittest.Until(t, 5*time.Second, "the slow grab's place given back", func() bool {
		inUse, _ := workers.Places()
		return inUse == 0
	})
	if r := s.grab(t, "p", "boom"); r.Code != 503 || r.Body["status"] != "overloaded" || r.Body["user_id"] != "boom" {
		t.Fatalf("grab that panics = %d %v, want 503 overloaded (never 500), its ids", r.Code, r.Body)
	}
	waittest.Until(t, 5*time.Second, "the panicked grab's place given back", func() bool {
		inUse, _ := workers.Places()
		return inUse == 0
	})
	if r := s.grab(t, "p", "u1"); r.Code != 200 || r.Body["status"] != "granted" {
		t.Fatalf("grab after a shed and a panic = %d %v, want 200 granted (the pool keeps serving)", r.Code, r.Body)
	}
	if got := workers.Stats(); got.Shed != 1 || got.Panics != 1 {
		t.Fatalf("pool stats %+v, want 1 shed (the grab; the malformed one was refused before admission), 1 panic", got)
	}
}

func TestConfirm(t *testing.T) {
	s := newStack(t, 2, redistest.Options{})
	s.preload(t, `{"pool_id":"c","total_cents":1000,"count":10,"hold_seconds":1}`)
	a := s.grab(t, "c", "alice")
	b := s.grab(t, "c", "bob")
	confirm := func(pool, user string, serial any) response {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"pool_id": pool, "user_id": user, "serial": serial})
		return s.do(t, "POST", "/admin/grants/confirm", token, string(body))
	}
	if r := confirm("c", "alice", a.Body["serial"]); r.Code != 200 || r.Body["status"] != "confirmed" {
		t.Fatalf("confirm = %d %v, want 200 confirmed", r.Code, r.Body)
	}
	if r := confirm("c", "alice", a.Body["serial"]); r.Code != 200 || r.Body["status"] != "confirmed" {
		t.Fatalf("confirm again = %d %v, want 200 confirmed (idempotent)", r.Code, r.Body)
	}
	if r := confirm("c", "bob", num(b.Body["serial"])+1000); r.Code != 409 {
		t.Fatalf("confirm with a wrong serial = %d %v, want 409", r.Code, r.Body)
	}
	if r := confirm("c", "carol", 5); r.Code != 404 {
		t.Fatalf("confirm of no grant = %d %v, want 404", r.Code, r.Body)
	}
	if r := confirm("nope", "alice", 5); r.Code != 404 {
		t.Fatalf("confirm in an unknown pool = %d %v, want 404", r.Code, r.Body)
	}
	for _, body := range []string{`{"pool_id":"c","user_id":"alice"}`, `{"pool_id":"c","user_id":"a b","serial":1}`,
		`{"pool_id":"c","user_id":"alice","serial":"1"}`, `{"pool_id":"c","user_id":"alice","serial":1,"x":1}`} {
		if r := s.do(t, "POST", "/admin/grants/confirm", token, body); r.Code != 400 {
			t.Fatalf("confirm %s = %d, want 400", body, r.Code)
		}
	}
	if r := s.do(t, "POST", "/admin/grants/confirm", "", `{"pool_id":"c","user_id":"bob","serial":1}`); r.Code != 401 {
		t.Fatalf("confirm without token = %d, want 401", r.Code)
	}
	// Past its deadline and released, bob's grant can no longer be confirmed.
	reap := reaper.New(s.shards, s.cat, nil, reaper.Config{})
	waittest.Until(t, 5*time.Second, "bob's grant released at its deadline", func() bool {
		sw, err := reap.Sweep(context.Background())
		return err == nil && sw.Released == 1
	})
	if r := confirm("c", "bob", b.Body["serial"]); r.Code != 409 {
		t.Fatalf("confirm of a released grant = %d %v, want 409", r.Code, r.Body)
	}
	if r := s.grab(t, "c", "bob"); r.Code != 200 || r.Body["status"] != "granted" {
		t.Fatalf("bob grabs again after the release = %d %v, want a new grant", r.Code, r.Body)
	}
	st := s.do(t, "GET", "/admin/pools/c", token, "")
	if num(st.Body["confirmed_count"]) != 1 || num(st.Body["released_count"]) != 1 || num(st.Body["held_count"]) != 1 {
		t.Fatalf("status = %v, want 1 confirmed, 1 released, 1 held", st.Body)
	}
	s.assertAudit(t, "c")
}

// TestDashboardColoursEveryStatus: the dashboard's grabs/s chart has a
// colour of its own for every status a grab can be answered with.
func TestDashboardColoursEveryStatus(t *testing.T) {
	js, err := os.ReadFile("../dash/static/app.js")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?s)const COLORS = \{(.*?)\};`).FindSubmatch(js)
	if block == nil {
		t.Fatal("app.js has no COLORS table")
	}
	for _, name := range names(nStatus) {
		if !regexp.MustCompile(`\b` + name + `:\s*"#[0-9a-f]{3,6}"`).Match(block[1]) {
			t.Errorf("the dashboard has no colour for status %q", name)
		}
	}
}
