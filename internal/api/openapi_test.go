package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"rain/docs"
	"rain/internal/auth"
	"rain/internal/limit"
	"rain/internal/pool"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// contract validates answers against docs/openapi.json and notes which
// documented (operation, status) pairs were seen.
type contract struct {
	t      *testing.T
	doc    *openapi3.T
	router routers.Router
	seen   map[string]bool // "operationId status"
}

func newContract(t *testing.T) *contract {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(docs.OpenAPI)
	if err != nil {
		t.Fatalf("docs/openapi.json: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("docs/openapi.json is OpenAPI %s, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("docs/openapi.json does not validate: %v", err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &contract{t: t, doc: doc, router: router, seen: map[string]bool{}}
}

// do sends the request to the stack and validates the answer against the
// document: a status it does not give, a header or a body it does not
// allow, fails the test.
func (c *contract) do(s *stack, method, path, token, body string, header ...string) int {
	c.t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := s.client.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	// The route is found on the document's own form of the URL.
	route, params, err := c.router.FindRoute(mustRequest(c.t, method, "http://rain"+path))
	if err != nil {
		c.t.Fatalf("%s %s: not in docs/openapi.json: %v", method, path, err)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Body:                   io.NopCloser(bytes.NewReader(b)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		c.t.Errorf("%s %s = %d %s: not as docs/openapi.json says: %v", method, path, resp.StatusCode, b, err)
	}
	c.seen[fmt.Sprintf("%s %d", route.Operation.OperationID, resp.StatusCode)] = true
	return resp.StatusCode
}

func mustRequest(t *testing.T, method, url string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// want checks that a call answered code.
func (c *contract) want(code int, got int, what string) {
	c.t.Helper()
	if got != code {
		c.t.Errorf("%s = %d, want %d", what, got, code)
	}
}

// TestOpenAPI: docs/openapi.json is a valid OpenAPI 3.1 document, rain
// serves it at GET /openapi.json, and the real server, driven through every
// status the document gives every endpoint, answers each as the document
// says (status, headers, body), so that the document and the server cannot
// drift apart: a status the server gives and the document does not, or
// the other way round, fails the test.
func TestOpenAPI(t *testing.T) {
	c := newContract(t)
	s := newStack(t, 1, redistest.Options{})
	served := c.do(s, "GET", "/openapi.json", "", "")
	c.want(200, served, "GET /openapi.json")

	for _, p := range []string{"/healthz", "/livez", "/readyz", "/readyz/instance", "/metrics"} {
		c.want(200, c.do(s, "GET", p, "", ""), "GET "+p)
	}
	operatorCalls(t, c, s)
	grabCalls(t, c, s)
	c.want(503, func() int { s.api.Drain(); return c.do(s, "GET", "/readyz", "", "") }(), "GET /readyz while draining")
	c.want(503, c.do(s, "GET", "/readyz/instance", "", ""), "GET /readyz/instance while draining")

	// A shard that does not answer: every operator call that needs it is 503.
	down := newStack(t, 1, redistest.Options{})
	down.preload(t, `{"pool_id":"p","total_cents":1000,"count":10}`)
	down.servers[0].Kill()
	for _, call := range [][3]string{
		{"POST", "/admin/pools", `{"pool_id":"q","total_cents":1000,"count":10}`}, {"GET", "/admin/pools", ""},
		{"GET", "/admin/pools/p", ""}, {"GET", "/admin/pools/p/audit", ""},
		{"POST", "/admin/pools/p/end", ""}, {"POST", "/admin/pools/p/close", ""},
		{"POST", "/admin/grants/confirm", `{"pool_id":"p","user_id":"u","serial":1}`},
	} {
		c.want(503, c.do(down, call[0], call[1], token, call[2]), call[0]+" "+call[1]+" with the shard down")
	}
	specialGrabs(t, c)
	throttledAdmin(t, c)

	var missing []string
	for path, item := range c.doc.Paths.Map() {
		for method, op := range item.Operations() {
			for code := range op.Responses.Map() {
				if !c.seen[op.OperationID+" "+code] {
					missing = append(missing, fmt.Sprintf("%s %s %s (%s)", method, path, code, op.OperationID))
				}
			}
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("documented but never answered by the server in this test (drive them, or take them out of the document):\n  %s",
			strings.Join(missing, "\n  "))
	}
}

// operatorCalls drives every operator endpoint through its statuses.
func operatorCalls(t *testing.T, c *contract, s *stack) {
	t.Helper()
	pre := func(body string) int { return c.do(s, "POST", "/admin/pools", token, body) }
	c.want(201, pre(`{"pool_id":"p","total_cents":1000,"count":10,"sub_pools":1}`), "preload")
	c.want(200, pre(`{"pool_id":"p","total_cents":1000,"count":10,"sub_pools":1}`), "preload again")
	c.want(409, pre(`{"pool_id":"p","total_cents":2000,"count":10}`), "preload another spec")
	c.want(400, pre(`{"pool_id":"p","total_cents":5,"count":10}`), "preload an impossible spec")
	c.want(200, c.do(s, "GET", "/admin/pools", token, ""), "list")
	for _, suffix := range []string{"", "/audit"} {
		c.want(200, c.do(s, "GET", "/admin/pools/p"+suffix, token, ""), "GET /admin/pools/p"+suffix)
		c.want(404, c.do(s, "GET", "/admin/pools/nope"+suffix, token, ""), "GET of no pool")
		c.want(400, c.do(s, "GET", "/admin/pools/a%20b"+suffix, token, ""), "GET of a bad id")
	}
	c.want(200, c.do(s, "GET", "/admin/stats", token, ""), "stats")
	c.want(400, c.do(s, "GET", "/admin/stats?since=yesterday", token, ""), "stats since a bad time")

	// A grant, confirmed; the confirm's refusals.
	var g struct {
		Serial int64 `json:"serial"`
	}
	r := s.grab(t, "p", "alice")
	b, _ := json.Marshal(r.Body)
	_ = json.Unmarshal(b, &g)
	confirm := func(body string) int { return c.do(s, "POST", "/admin/grants/confirm", token, body) }
	c.want(200, confirm(fmt.Sprintf(`{"pool_id":"p","user_id":"alice","serial":%d}`, g.Serial)), "confirm")
	c.want(409, confirm(fmt.Sprintf(`{"pool_id":"p","user_id":"alice","serial":%d}`, g.Serial+99)), "confirm another serial")
	c.want(404, confirm(`{"pool_id":"p","user_id":"nobody","serial":1}`), "confirm no grant")
	c.want(400, confirm(`{"pool_id":"p","user_id":"alice"}`), "confirm without a serial")

	// End and close: refusals, then a pool with nothing to settle closes.
	c.want(409, c.do(s, "POST", "/admin/pools/p/close", token, ""), "close an open pool")
	c.want(201, pre(`{"pool_id":"c","total_cents":100,"count":10}`), "preload c")
	c.want(200, c.do(s, "POST", "/admin/pools/c/end", token, ""), "end")
	c.want(200, c.do(s, "POST", "/admin/pools/c/close", token, ""), "close an ended pool with nothing held")
	c.want(200, c.do(s, "GET", "/admin/pools/c", token, ""), "status of a closed pool (its account)")
	c.want(200, c.do(s, "POST", "/admin/pools/c/end", token, ""), "end of a closed pool")
	for _, op := range []string{"end", "close"} {
		c.want(404, c.do(s, "POST", "/admin/pools/nope/"+op, token, ""), op+" of no pool")
		c.want(400, c.do(s, "POST", "/admin/pools/a%20b/"+op, token, ""), op+" of a bad id")
	}
	// A pool whose preload has not finished (its record says loading).
	c.want(201, pre(`{"pool_id":"ld","total_cents":100,"count":10}`), "preload ld")
	if err := s.shards.Client("s1").HSet(context.Background(), "rain:{ld}:pool", "state", "loading").Err(); err != nil {
		t.Fatal(err)
	}
	c.want(409, c.do(s, "POST", "/admin/pools/ld/end", token, ""), "end of a pool still loading")

	// Without the admin token, every operator endpoint is 401.
	for _, call := range [][3]string{
		{"POST", "/admin/pools", `{}`}, {"GET", "/admin/pools", ""}, {"GET", "/admin/pools/p", ""},
		{"GET", "/admin/pools/p/audit", ""}, {"POST", "/admin/pools/p/end", ""}, {"POST", "/admin/pools/p/close", ""},
		{"POST", "/admin/grants/confirm", `{}`}, {"GET", "/admin/stats", ""},
	} {
		c.want(401, c.do(s, call[0], call[1], "", call[2]), call[0]+" "+call[1]+" without the token")
	}
}

// grabCalls drives POST /grab through the statuses a plain stack answers.
func grabCalls(t *testing.T, c *contract, s *stack) {
	t.Helper()
	g := func(body string) int { return c.do(s, "POST", "/grab", "", body) }
	c.want(200, g(`{"pool_id":"p","user_id":"bob"}`), "grab")
	c.want(200, g(`{"pool_id":"p","user_id":"bob"}`), "grab again")
	c.want(400, g(`{"pool_id":"p","user_id":"bob","x":1}`), "grab with an unknown key")
	c.want(404, g(`{"pool_id":"nope","user_id":"bob"}`), "grab of no pool")
	c.want(201, c.do(s, "POST", "/admin/pools", token, `{"pool_id":"one","total_cents":100,"count":1}`), "preload one")
	g(`{"pool_id":"one","user_id":"first"}`)
	c.want(410, g(`{"pool_id":"one","user_id":"second"}`), "grab of a sold-out pool")
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	c.want(201, c.do(s, "POST", "/admin/pools", token, `{"pool_id":"later","total_cents":100,"count":1,"starts_at":"`+later+`"}`), "preload later")
	c.want(425, g(`{"pool_id":"later","user_id":"early"}`), "grab before the start")
	c.want(410, g(`{"pool_id":"c","user_id":"late"}`), "grab of a closed pool")
}

// specialGrabs drives the statuses of POST /grab that take a stack of
// their own: user auth (401), rate limits (429), a shed (503), a panic (503).
func specialGrabs(t *testing.T, c *contract) {
	t.Helper()
	users, err := auth.NewUsers(auth.UserConfig{Spec: "hs256:" + writeFile(t, "secret", []byte(strings.Repeat("k", 40)))})
	if err != nil {
		t.Fatal(err)
	}
	withAuth := newStack(t, 1, redistest.Options{}, func(cfg *Config) { cfg.Users = users })
	c.want(401, c.do(withAuth, "POST", "/grab", "", `{"pool_id":"p","user_id":"u"}`), "grab without a user token")

	limited := newStack(t, 1, redistest.Options{}, func(cfg *Config) {
		cfg.UserLimit = limit.New(limit.Config{Rate: 0.001, Burst: 1})
	})
	limited.preload(t, `{"pool_id":"p","total_cents":1000,"count":10}`)
	c.do(limited, "POST", "/grab", "", `{"pool_id":"p","user_id":"u"}`)
	c.want(429, c.do(limited, "POST", "/grab", "", `{"pool_id":"p","user_id":"u"}`), "grab over the user's rate")

	gt := gated{entered: make(chan struct{}, 1), release: make(chan struct{})}
	var workers *pool.Pool
	busy := newStack(t, 1, redistest.Options{}, func(cfg *Config) {
		var err error
		if workers, err = pool.New(pool.Config{Min: 1, Max: 1, Queue: -1}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { workers.Close(5 * time.Second) })
		gt.Grabber = cfg.Grabber
		cfg.Grabber, cfg.Runner = gt, workers
	})
	busy.preload(t, `{"pool_id":"p","total_cents":1000,"count":10}`)
	c.want(503, c.do(busy, "POST", "/grab", "", `{"pool_id":"p","user_id":"boom"}`), "grab that panics")
	waittest.Until(t, 5*time.Second, "the panicked grab's place given back", func() bool {
		inUse, _ := workers.Places()
		return inUse == 0
	})
	slow := make(chan response, 1)
	go func() { slow <- busy.grab(t, "p", "slow") }()
	<-gt.entered
	c.want(503, c.do(busy, "POST", "/grab", "", `{"pool_id":"p","user_id":"u"}`), "grab while the pool is full")
	close(gt.release)
	<-slow
}

// throttledAdmin drives every operator endpoint to its throttled 401: a
// client that sent too many wrong admin tokens is refused even with the
// right one.
func throttledAdmin(t *testing.T, c *contract) {
	t.Helper()
	s := newStack(t, 1, redistest.Options{})
	for range adminFailBurst {
		c.want(401, c.do(s, "GET", "/admin/pools", "wrong", ""), "GET /admin/pools with a wrong token")
	}
	for _, call := range [][3]string{
		{"POST", "/admin/pools", `{"pool_id":"q","total_cents":1000,"count":10}`}, {"GET", "/admin/pools", ""},
		{"GET", "/admin/pools/p", ""}, {"GET", "/admin/pools/p/audit", ""}, {"POST", "/admin/pools/p/end", ""},
		{"POST", "/admin/pools/p/close", ""}, {"POST", "/admin/grants/confirm", `{"pool_id":"p","user_id":"u","serial":1}`},
		{"GET", "/admin/stats", ""},
	} {
		c.want(401, c.do(s, call[0], call[1], token, call[2]), call[0]+" "+call[1]+" from a throttled client")
	}
	c.want(200, c.do(s, "GET", "/readyz", token, ""), "GET /readyz from a throttled client (the short answer)")
}
