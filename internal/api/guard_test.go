package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"rain/internal/redistest"
)

// adminFrom calls GET /admin/pools with token as the client at address ip
// (behind the trusted proxy header), and returns the status and the
// Retry-After.
func (s *stack) adminFrom(t *testing.T, ip, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", s.url+"/admin/pools", nil)
	req.Header.Set("X-Forwarded-For", ip)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// TestAdminFailuresThrottled: a client that sends 300 wrong admin tokens
// gets 401 for the first ten, then 401 with Retry-After (API.md: without a
// valid token, 401), without its token being looked at: the right token
// from it is refused the same way while it is throttled. Another client is not held up, and
// rain_admin_auth_failures_total counts both kinds of refusal.
func TestAdminFailuresThrottled(t *testing.T) {
	s := newStack(t, 1, redistest.Options{}, func(cfg *Config) { cfg.ClientIPHeader = "X-Forwarded-For" })
	const attacker, operator = "203.0.113.9", "198.51.100.4"
	codes := map[string]int{} // by code and whether Retry-After came
	for i := range 300 {
		code, retry := s.adminFrom(t, attacker, "wrong-"+strconv.Itoa(i))
		codes[fmt.Sprintf("%d retry=%t", code, retry != "")]++
	}
	if codes["401 retry=false"] != adminFailBurst || codes["401 retry=true"] != 300-adminFailBurst {
		t.Fatalf("300 wrong tokens from one client: %v, want %d × 401, then 401 with Retry-After", codes, adminFailBurst)
	}
	if code, retry := s.adminFrom(t, attacker, token); code != 401 || retry == "" {
		t.Fatalf("the right token from the throttled client = %d, Retry-After %q; want 401 with Retry-After (not looked at)", code, retry)
	}
	if code, _ := s.adminFrom(t, operator, token); code != 200 {
		t.Fatalf("the right token from another client = %d, want 200", code)
	}
	m := s.scrape(t)
	if m[`rain_admin_auth_failures_total{reason="wrong_token"}`] != adminFailBurst || m[`rain_admin_auth_failures_total{reason="throttled"}`] != 300-adminFailBurst+1 {
		t.Fatalf("rain_admin_auth_failures_total: wrong_token %v, throttled %v; want %d and %d", m[`rain_admin_auth_failures_total{reason="wrong_token"}`],
			m[`rain_admin_auth_failures_total{reason="throttled"}`], adminFailBurst, 300-adminFailBurst+1)
	}
}

// TestReadyzDetailsForAdmins: /readyz says ready or not to anyone (load
// balancers' probes), but each shard's state and error, which name
// internal addresses, and the instance's warnings only to a holder of an
// admin token. A wrong token gets the short answer and counts as a failed
// admin login.
func TestReadyzDetailsForAdmins(t *testing.T) {
	s := newStack(t, 1, redistest.Options{}, func(cfg *Config) { cfg.Warnings = []string{"user auth is off"} })
	get := func(token string) (int, map[string]any) {
		t.Helper()
		r := s.do(t, "GET", "/readyz", token, "")
		return r.Code, r.Body
	}
	for _, tok := range []string{"", "wrong"} {
		code, body := get(tok)
		if code != 200 || len(body) != 1 || body["ready"] != true {
			t.Fatalf("/readyz with token %q = %d %v, want 200 {\"ready\":true} alone", tok, code, body)
		}
	}
	code, body := get(token)
	shards, _ := body["shards"].([]any)
	warnings, _ := json.Marshal(body["warnings"])
	if code != 200 || len(shards) != 1 || string(warnings) != `["user auth is off"]` {
		t.Fatalf("/readyz with the admin token = %d %v, want the shards and the warnings", code, body)
	}
	s.servers[0].Kill()
	code, body = get("")
	if code != 503 || len(body) != 1 || body["ready"] != false {
		t.Fatalf("/readyz, shard down, no token = %d %v, want 503 {\"ready\":false} alone", code, body)
	}
	code, body = get(token)
	if b, _ := json.Marshal(body); code != 503 || !strings.Contains(string(b), s.servers[0].Addr) {
		t.Fatalf("/readyz, shard down, admin token = %d %s, want 503 naming the shard's error", code, b)
	}
	if m := s.scrape(t); m[`rain_admin_auth_failures_total{reason="wrong_token"}`] != 1 {
		t.Fatalf("rain_admin_auth_failures_total{reason=wrong_token} = %v, want 1 (the wrong token on /readyz)", m[`rain_admin_auth_failures_total{reason="wrong_token"}`])
	}
}

// TestAdminApart: with AdminOff the clients' handler answers 404 for
// every operator path (the dashboard's files too); Admin serves them, and
// nothing else.
func TestAdminApart(t *testing.T) {
	s := newStack(t, 1, redistest.Options{}, func(cfg *Config) { cfg.AdminOff = true })
	admin := httptest.NewServer(s.api.Admin())
	t.Cleanup(admin.Close)
	call := func(base, method, path, tok, body string) int {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil && resp.StatusCode != 200 {
			t.Fatalf("%s %s: a %d that is not JSON", method, path, resp.StatusCode)
		}
		return resp.StatusCode
	}
	preload := `{"pool_id":"p","total_cents":1000,"count":10}`
	for _, c := range []struct {
		base, method, path, body string
		want                     int
	}{
		{s.url, "POST", "/admin/pools", preload, 404},
		{s.url, "GET", "/admin/", "", 404},
		{s.url, "GET", "/admin", "", 404},
		{s.url, "GET", "/%61dmin/pools", "", 404},
		{s.url, "GET", "/", "", 404},
		{admin.URL, "GET", "/", "", 200}, // the redirect to /admin/, followed
		{admin.URL, "POST", "/admin/pools", preload, 201},
		{admin.URL, "GET", "/admin/pools/p", "", 200},
		{admin.URL, "POST", "/grab", `{"pool_id":"p","user_id":"u"}`, 404},
		{admin.URL, "GET", "/metrics", "", 404},
		{s.url, "POST", "/grab", `{"pool_id":"p","user_id":"u"}`, 200},
		{s.url, "GET", "/readyz", "", 200},
	} {
		if got := call(c.base, c.method, c.path, token, c.body); got != c.want {
			where := "the clients' listener"
			if c.base == admin.URL {
				where = "the admin listener"
			}
			t.Errorf("%s %s on %s = %d, want %d", c.method, c.path, where, got, c.want)
		}
	}
}

// TestReadyzInstanceOutlivesABadShard: with one shard down, GET /readyz
// is 503 (API.md: every shard must answer), which every instance sees
// alike; GET /readyz/instance, what a load balancer that takes instances
// out on a 503 is pointed at, stays 200: one bad shard does not take the
// fleet out of service.
func TestReadyzInstanceOutlivesABadShard(t *testing.T) {
	s := newStack(t, 2, redistest.Options{})
	status := func(path string) int {
		t.Helper()
		resp, err := http.Get(s.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if a, b := status("/readyz"), status("/readyz/instance"); a != 200 || b != 200 {
		t.Fatalf("with every shard up: /readyz %d, /readyz/instance %d; want 200 and 200", a, b)
	}
	s.servers[1].Kill()
	if a, b := status("/readyz"), status("/readyz/instance"); a != 503 || b != 200 {
		t.Fatalf("with a shard down: /readyz %d, /readyz/instance %d; want 503 and 200", a, b)
	}
}
